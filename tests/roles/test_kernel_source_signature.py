"""The kernel role's signature check (roles/kernel/files/verify-kernel-signature.sh) and its keyring.

kernel.org publishes linux-X.tar.sign, a detached signature of the UNCOMPRESSED tar; the script
decompresses the .tar.xz into gpgv, which trusts only the keyring given. A throwaway key generated here
stands in for kernel.org's (its real tarballs cannot be downloaded here); the shipped keyring is
checked for the stable-release key's fingerprint.
"""

import lzma
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROLE_FILES = Path(__file__).resolve().parents[2] / "roles" / "kernel" / "files"
SCRIPT = ROLE_FILES / "verify-kernel-signature.sh"
GREG_KH = "647F28654894E3BD457199BE38DBBDC86092693E"

pytestmark = pytest.mark.skipif(
    not shutil.which("gpg") or not shutil.which("gpgv"), reason="needs gpg and gpgv"
)


def gpg(home, *args, **kw):
    return subprocess.run(["gpg", "--homedir", str(home), "--batch", "--quiet", *args], check=True, **kw)


def make_signer(tmp_path, name):
    home = tmp_path / f"gnupg-{name}"
    home.mkdir(mode=0o700)
    gpg(
        home,
        "--passphrase",
        "",
        "--quick-gen-key",
        f"{name} <{name}@example.org>",
        "ed25519",
        "sign",
        "never",
    )
    keyring = tmp_path / f"{name}.gpg"
    keyring.write_bytes(gpg(home, "--export", capture_output=True).stdout)
    return home, keyring


@pytest.fixture
def release(tmp_path):
    """A signed 'release': linux-9.9.tar.xz plus linux-9.9.tar.sign over the uncompressed tar."""
    home, keyring = make_signer(tmp_path, "release")
    tar = b"pretend this is linux-9.9.tar\n" * 100
    (tmp_path / "linux-9.9.tar").write_bytes(tar)
    gpg(
        home,
        "--detach-sign",
        "--armor",
        "-o",
        str(tmp_path / "linux-9.9.tar.sign"),
        str(tmp_path / "linux-9.9.tar"),
    )
    (tmp_path / "linux-9.9.tar.xz").write_bytes(lzma.compress(tar))
    return tmp_path, keyring


def verify(archive, sig, keyring):
    env = {**os.environ, "LC_ALL": "C"}
    return subprocess.run(
        [str(SCRIPT), str(archive), str(sig), str(keyring)], capture_output=True, text=True, env=env
    )


def test_good_signature_passes(release):
    d, keyring = release
    r = verify(d / "linux-9.9.tar.xz", d / "linux-9.9.tar.sign", keyring)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("good signature of linux-9.9.tar.xz by ")


def test_tampered_archive_fails_and_says_so(release):
    d, keyring = release
    (d / "linux-9.9.tar.xz").write_bytes(lzma.compress(b"a backdoored tree\n"))
    r = verify(d / "linux-9.9.tar.xz", d / "linux-9.9.tar.sign", keyring)
    assert r.returncode == 1
    assert "BAD signature" in r.stdout, r.stdout


def test_signature_by_a_key_outside_the_keyring_fails(release, tmp_path):
    d, _ = release
    _, other = make_signer(tmp_path, "stranger")
    r = verify(d / "linux-9.9.tar.xz", d / "linux-9.9.tar.sign", other)
    assert r.returncode == 1
    assert "does not verify" in r.stdout and "No public key" in r.stdout, r.stdout


def test_shipped_keyring_holds_the_stable_release_key(tmp_path):
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    out = subprocess.run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--with-colons",
            "--show-keys",
            str(ROLE_FILES / "kernel-org-signers.gpg"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    assert fprs[0] == GREG_KH, fprs
