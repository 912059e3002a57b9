"""TLS for the SGLang instances and the router (sglang_tls_*), through the real ansible-playbook.

The role's inputs, its TLS tasks (tasks/tls.yml), its endpoint discovery (tasks/gpus.yml, with the stand-in
nvidia-smi) and its unit templates run on this machine against a throw-away CA made here with
`cryptography`. The flags checked are the real tools' own: SGLang's --ssl-certfile/--ssl-keyfile/
--ssl-ca-certs (sglang/srt/server_args.py; serving_hook.py, handle_ssl_validation) and the router's
--tls-cert-path/--tls-key-path/--ca-cert-paths (sglang_router/router_args.py).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STANDINS = ROOT / "tests" / "doubles" / "standins"
NVIDIA_SMI = STANDINS / "nvidia-smi"

PLAY = """
- name: Check the TLS inputs, install the TLS files and render the SGLang units
  hosts: node
  gather_facts: true
  tasks:
    - name: Check the role's inputs and expose its variables
      ansible.builtin.include_role:
        name: sglang
        tasks_from: inputs
        public: true
    - name: Read the GPUs and set the endpoints
      ansible.builtin.include_role:
        name: sglang
        tasks_from: gpus
    - name: Install the TLS files
      ansible.builtin.include_role:
        name: sglang
        tasks_from: tls
    - name: Render the units
      ansible.builtin.template:
        src: "{{ item }}"
        dest: "{{ out }}/{{ item | basename | regex_replace('\\\\.j2$', '') }}"
        mode: "0644"
      loop:
        - %(root)s/roles/sglang/templates/sglang@.service.j2
        - %(root)s/roles/sglang/templates/sglang-router.service.j2
    - name: Write the published endpoints
      ansible.builtin.copy:
        dest: "{{ out }}/endpoints.json"
        content: "{{ _sglang_endpoints | to_json }}"
        mode: "0644"
"""

INVENTORY = """
all:
  children:
    sglang_nodes:
      hosts:
        node: {ansible_connection: local, ansible_python_interpreter: "%(python)s"}
"""

VAULT_PASSWORD = "test-vault-password"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(path: Path, cn: str = "test CA") -> tuple[Path, object, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, cert, key


def make_server(directory: Path, ca: tuple[Path, object, ec.EllipticCurvePrivateKey], names: list[str],
                expired: bool = False) -> tuple[Path, Path]:
    """A server certificate for `names` (IP or DNS subjectAltName entries) signed by `ca`: (cert, key)."""
    _, ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    now = datetime.datetime.now(datetime.UTC)
    end = now - datetime.timedelta(hours=1) if expired else now + datetime.timedelta(days=2)
    cert = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def _run(tmp_path: Path, *extra: str, check_mode: bool = False) -> subprocess.CompletedProcess[str]:
    (tmp_path / "play.yml").write_text(PLAY % {"root": ROOT})
    (tmp_path / "hosts.yml").write_text(INVENTORY % {"python": sys.executable})
    (tmp_path / "vault-pass").write_text(VAULT_PASSWORD + "\n")
    (tmp_path / "smi.json").write_text(json.dumps({"driver_version": "595.71.05", "name": "NVIDIA B200",
                                                   "gpus": 2, "nvswitch": False}))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               NVIDIA_SMI_STANDIN_CONFIG=str(tmp_path / "smi.json"))
    env["ANSIBLE_ROLES_PATH"] = str(ROOT / "roles")
    args = ["-e", f"out={out}", "-e", "sglang_api_key=k", "-e", f"sglang_config_dir={tmp_path / 'etc'}",
            "-e", "sglang_user=root", "-e", f"sglang_nvidia_smi={NVIDIA_SMI}",
            # No IP filter: the units would list this machine's addresses, which change between two runs while
            # podman starts and stops its bridges beside the tests (the filter: test_sglang_clients.py).
            "-e", '{"sglang_allowed_clients": ["any"]}',
            "--vault-password-file", str(tmp_path / "vault-pass"), *extra]
    if check_mode:
        args.append("--check")
    return subprocess.run(
        [_exe("ansible-playbook"), str(tmp_path / "play.yml"), "-i", str(tmp_path / "hosts.yml"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def _tls_vars(cert: Path, key: Path, ca: Path) -> list[str]:
    return ["-e", json.dumps({"sglang_tls_cert_src": str(cert), "sglang_tls_key_src": str(key),
                              "sglang_tls_ca_src": str(ca)})]


def _exec(unit: Path, key: str) -> str:
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith(key + "=")]
    return line


def _flat(r: subprocess.CompletedProcess[str]) -> str:
    return " ".join((r.stdout + r.stderr).split())


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    """CA + a certificate naming the inventory host `node` (the advertised address) and 127.0.0.1 (where the
    node reaches itself, the bind address being 0.0.0.0), with its key vault-encrypted as a user keeps it."""
    ca = make_ca(tmp_path / "pki" / "ca.crt")
    cert, key = make_server(tmp_path / "pki", ca, ["node", "127.0.0.1"])
    plain_key = key.read_text()
    subprocess.run([_exe("ansible-vault"), "encrypt", "--vault-password-file", "/dev/stdin", str(key)],
                   input=VAULT_PASSWORD, text=True, check=True, capture_output=True)
    assert key.read_text().startswith("$ANSIBLE_VAULT;")
    return {"ca": ca[0], "cert": cert, "key": key, "plain_key": plain_key, "ca_obj": ca}


def test_plain_http_only_when_asked_and_no_tls_directory_left(tmp_path: Path) -> None:
    (tmp_path / "etc" / "tls").mkdir(parents=True)  # left from an earlier TLS deploy: removed
    (tmp_path / "etc" / "tls" / "server.key").write_text("old key")
    r = _run(tmp_path, "-e", "sglang_tls_generate=false")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = tmp_path / "out"
    for unit in ("sglang@.service", "sglang-router.service"):
        text = (out / unit).read_text()
        assert not re.search(r"ssl|tls|https|cafile|ca-cert", text), unit
    router = (out / "sglang-router.service").read_text()
    assert " --worker-urls http://127.0.0.1:30000 http://127.0.0.1:30001\n" in router
    assert json.loads((out / "endpoints.json").read_text()) == ["http://node:30000", "http://node:30001"]
    assert not (tmp_path / "etc" / "tls").exists()
    assert not (tmp_path / "pki").exists(), "a CA was made for plain HTTP"


def _handshake(cert: Path, key: Path, ca: Path, host: str) -> str:
    """Serve one TLS connection with cert/key on 127.0.0.1 and connect to it as a client that trusts only
    `ca` and expects `host` (Python's ssl module, as SGLang's probes and the generator verify); the
    client's view of the server certificate's subject."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(cert), str(key))
    client_ctx = ssl.create_default_context(cafile=str(ca))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        conn, _ = listener.accept()

        def serve() -> None:
            with contextlib.suppress(ssl.SSLError, OSError):  # a client that refuses the certificate
                server_ctx.wrap_socket(conn, server_side=True).close()

        t = threading.Thread(target=serve)
        t.start()
        try:
            with client_ctx.wrap_socket(client, server_hostname=host) as tls:
                return str(tls.getpeercert()["subject"])
        finally:
            t.join(10)


def _cert(path: Path) -> Any:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_on_by_default_with_a_ca_the_role_makes_and_keeps(tmp_path: Path) -> None:
    """No certificate given: the role makes a private CA on the controller (next to the inventory) and a
    certificate for the node that real TLS clients accept for every address they use; a second run and check
    mode change nothing; a certificate near its end, or one whose addresses changed, is made again under the
    same CA."""
    r = _run(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    pki, etc, out = tmp_path / "pki", tmp_path / "etc" / "tls", tmp_path / "out"
    assert pki.stat().st_mode & 0o777 == 0o700
    for private in ("ca.key", "node.key"):
        assert (pki / private).stat().st_mode & 0o777 == 0o600, private
    assert (pki / "ca.crt").read_bytes() == (etc / "ca.crt").read_bytes()
    assert (pki / "node.crt").read_bytes() == (etc / "server.crt").read_bytes()
    assert not (etc / "ca.key").exists(), "the CA's key left the controller"
    assert (etc / "server.key").stat().st_mode & 0o777 == 0o640
    assert json.loads((out / "endpoints.json").read_text()) == ["https://node:30000", "https://node:30001"]
    router = _exec(out / "sglang-router.service", "ExecStart")
    assert " --worker-urls https://127.0.0.1:30000 https://127.0.0.1:30001 " in router
    # what the clients check: the node's name and 127.0.0.1, signed by the CA; the CA signs leaves only
    for host in ("node", "127.0.0.1"):
        assert "node" in _handshake(etc / "server.crt", etc / "server.key", etc / "ca.crt", host)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(etc / "server.crt", etc / "server.key", etc / "ca.crt", "10.9.9.9")
    ca, leaf = _cert(pki / "ca.crt"), _cert(pki / "node.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert "CERTIFICATE" not in r.stdout + r.stderr and "PRIVATE KEY" not in r.stdout + r.stderr

    again = _run(tmp_path)
    changed = [t.split("]", 1)[0] for t in again.stdout.split("TASK [")[1:] if "\nchanged: " in t]
    assert again.returncode == 0 and re.search(r"changed=0 ", again.stdout), (changed, again.stdout[-2000:])
    check = _run(tmp_path, check_mode=True)
    assert check.returncode == 0 and re.search(r"changed=0 ", check.stdout), check.stdout[-2000:]
    assert (pki / "node.crt").read_bytes() == (etc / "server.crt").read_bytes() == leaf.public_bytes(
        serialization.Encoding.PEM)

    # fewer days left than sglang_tls_renew_days (here: more than its whole life): made again, same CA and key
    renewed = _run(tmp_path, "-e", "sglang_tls_renew_days=400")
    assert renewed.returncode == 0, renewed.stdout[-3000:]
    new = _cert(etc / "server.crt")
    assert new.serial_number != leaf.serial_number and new.public_key() == leaf.public_key()
    assert _cert(etc / "ca.crt") == ca
    # the addresses changed (the router bound to 10.9.9.9): a certificate that names it
    moved = _run(tmp_path, "-e", "sglang_router_host=10.9.9.9")
    assert moved.returncode == 0, moved.stdout[-3000:]
    assert "node" in _handshake(etc / "server.crt", etc / "server.key", etc / "ca.crt", "10.9.9.9")
    assert _cert(etc / "ca.crt") == ca


def test_tls_units_flags_https_urls_and_the_key_only_as_a_path(tmp_path: Path, pki: dict[str, Any]) -> None:
    r = _run(tmp_path, *_tls_vars(pki["cert"], pki["key"], pki["ca"]))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    etc, out = tmp_path / "etc" / "tls", tmp_path / "out"
    crt, key, ca = etc / "server.crt", etc / "server.key", etc / "ca.crt"

    server = _exec(out / "sglang@.service", "ExecStart")
    assert f" --ssl-certfile {crt} --ssl-keyfile {key} --ssl-ca-certs {ca}" in server
    probe = _exec(out / "sglang@.service", "ExecStartPost")
    assert probe.endswith(f" --cafile {ca}") and "sglang_wait_ready.py 127.0.0.1 ${SGLANG_PORT}" in probe

    router = _exec(out / "sglang-router.service", "ExecStart")
    assert " --worker-urls https://127.0.0.1:30000 https://127.0.0.1:30001 " in router
    assert f" --tls-cert-path {crt} --tls-key-path {key} --ca-cert-paths {ca}" in router
    assert "http://" not in router
    assert _exec(out / "sglang-router.service", "ExecStartPost").endswith(f"--timeout 300 --cafile {ca}")

    assert json.loads((out / "endpoints.json").read_text()) == ["https://node:30000", "https://node:30001"]

    # The key went through decrypted, private to root and the service group; the units name its path only,
    # each once, after the flag that takes it.
    secret = pki["plain_key"]
    assert key.read_text() == secret
    assert key.stat().st_mode & 0o777 == 0o640 and crt.stat().st_mode & 0o777 == 0o644
    body = [x for x in secret.splitlines() if x and not x.startswith("-----")]
    for unit, flag in (("sglang@.service", "--ssl-keyfile"), ("sglang-router.service", "--tls-key-path")):
        text = (out / unit).read_text()
        assert not any(b in text for b in body), unit
        assert [m.group(1) for m in re.finditer(r"(\S+) " + re.escape(str(key)), text)] == [flag], unit
        assert text.count("server.key") == 1, unit
    assert not any(b in r.stdout + r.stderr for b in body), "the key reached the play's output"

    # Idempotent: a second run changes nothing; check mode too.
    again = _run(tmp_path, *_tls_vars(pki["cert"], pki["key"], pki["ca"]))
    changed = [t.split("]", 1)[0] for t in again.stdout.split("TASK [")[1:] if "\nchanged: " in t]
    assert again.returncode == 0 and re.search(r"changed=0 ", again.stdout), (changed, again.stdout[-2000:])
    check = _run(tmp_path, *_tls_vars(pki["cert"], pki["key"], pki["ca"]), check_mode=True)
    assert check.returncode == 0 and re.search(r"changed=0 ", check.stdout), check.stdout[-2000:]


@pytest.mark.parametrize(("which", "message"), [
    ("key_empty", "sglang_tls_key_src is empty; sglang_tls_ca_src is empty;"),
    ("key_missing", "sglang_tls_key_src='/nonexistent/server.key' is not an absolute path to a file"),
    ("ca_relative", "sglang_tls_ca_src='pki/ca.crt' is not an absolute path to a file"),
])
def test_incomplete_tls_inputs_are_refused_naming_the_variable(tmp_path: Path, pki: dict[str, Any],
                                                              which: str, message: str) -> None:
    tls = {"sglang_tls_cert_src": str(pki["cert"]), "sglang_tls_key_src": str(pki["key"]),
           "sglang_tls_ca_src": str(pki["ca"])}
    if which == "key_empty":
        tls = {"sglang_tls_cert_src": str(pki["cert"])}
    elif which == "key_missing":
        tls["sglang_tls_key_src"] = "/nonexistent/server.key"
    else:
        tls["sglang_tls_ca_src"] = "pki/ca.crt"
    r = _run(tmp_path, "-e", json.dumps(tls))
    assert r.returncode != 0
    assert message in _flat(r), _flat(r)[-2000:]
    assert not (tmp_path / "etc").exists() and not (tmp_path / "out" / "sglang@.service").exists()


def test_a_certificate_clients_would_refuse_is_refused_first(tmp_path: Path, pki: dict[str, Any]) -> None:
    ca = pki["ca_obj"]
    other_ca = make_ca(tmp_path / "other" / "ca.crt", "another CA")
    cases = {
        "no-node": (make_server(tmp_path / "a", ca, ["127.0.0.1"])[0],
                    "sglang_tls_cert_src does not name node in its subjectAltName (it names 127.0.0.1)"),
        "other-ca": (make_server(tmp_path / "b", other_ca, ["node", "127.0.0.1"])[0],
                     "sglang_tls_cert_src (CN=node) is not signed by the CA in sglang_tls_ca_src "
                     "(CN=test CA)"),
        "expired": (make_server(tmp_path / "c", ca, ["node", "127.0.0.1"], expired=True)[0],
                    "a certificate in sglang_tls_cert_src (CN=node) expired on"),
    }
    for name, (cert, message) in cases.items():
        r = _run(tmp_path, *_tls_vars(cert, pki["key"], pki["ca"]))
        assert r.returncode != 0, name
        assert message in _flat(r), (name, _flat(r)[-2000:])
        assert "needed: node, 127.0.0.1" in _flat(r), name
        assert not (tmp_path / "etc").exists(), name
    # the router bound to a specific address: the certificate must name that one as well
    r = _run(tmp_path, *_tls_vars(pki["cert"], pki["key"], pki["ca"]), "-e", "sglang_router_host=10.9.9.9")
    assert r.returncode != 0 and "does not name 10.9.9.9" in _flat(r), _flat(r)[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, ca: Path | None) -> tuple[int, str]:
    """(status, body) of GET url, the server verified against ca; waits for the server to listen."""
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        except urllib.error.URLError as e:
            if not isinstance(e.reason, ConnectionRefusedError) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _post(url: str, ca: Path, body: dict[str, Any]) -> tuple[int, str]:
    """(status, body) of a JSON POST to url, the server verified against ca."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(ca))) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def test_router_standin_serves_https_and_verifies_workers_against_its_ca(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    ca = make_ca(tmp_path / "pki" / "ca.crt")
    other = make_ca(tmp_path / "other" / "ca.crt", "another CA")
    cert, key = make_server(tmp_path / "pki", ca, ["127.0.0.1"])
    worker = _free_port()
    double = ROOT / "tests" / "doubles" / "sglang_server.py"
    procs.append(subprocess.Popen([sys.executable, str(double), "--port", str(worker),
                                   "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]))
    assert _get(f"https://127.0.0.1:{worker}/health", ca[0])[0] == 200

    def router(trusted: Path) -> str:
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, str(STANDINS / "launch_router.py"),
                                       "--port", str(port), "--worker-urls", f"https://127.0.0.1:{worker}",
                                       "--tls-cert-path", str(cert), "--tls-key-path", str(key),
                                       "--ca-cert-paths", str(trusted)]))
        return f"127.0.0.1:{port}"

    good = router(ca[0])
    assert _get(f"https://{good}/health", ca[0])[0] == 200
    # HTTPS only: a plain request gets no HTTP answer
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{good}/health", timeout=10)
    # a worker whose certificate does not verify against --ca-cert-paths is unhealthy, never used: the
    # router is "alive" (/health 200, as the real one answers) but not ready, and its workers list says why
    bad = router(other[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, body = _get(f"https://{bad}/workers", ca[0])
        if status == 200 and json.loads(body)["workers"][0]["last_error"] != "not checked yet":
            break
        time.sleep(0.2)
    (listed,) = json.loads(body)["workers"]
    assert listed["url"] == f"https://127.0.0.1:{worker}" and listed["is_healthy"] is False
    assert "CERTIFICATE_VERIFY_FAILED" in listed["last_error"], listed
    assert _get(f"https://{bad}/health", ca[0]) == (200, "OK")
    status, body = _get(f"https://{bad}/readiness", ca[0])
    assert status == 503
    assert json.loads(body) == {"status": "not ready", "reason": "insufficient healthy workers"}
    status, body = _post(f"https://{bad}/v1/chat/completions", ca[0], {"messages": []})
    assert status == 503 and json.loads(body)["error"] == "no_available_workers"
    # the router's own certificate is verified by its clients too
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(f"https://{good}/health", other[0])

    r = subprocess.run([sys.executable, str(STANDINS / "launch_router.py"), "--worker-urls", "https://x:1",
                        "--tls-cert-path", str(cert)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--tls-cert-path and --tls-key-path go together" in r.stderr
