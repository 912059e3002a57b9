"""Role model on localhost, run by the real ansible-playbook, fetching with the real huggingface_hub from
the Hub double (tests/doubles/hf_hub.py, reached through HF_ENDPOINT): first fetch at a pinned commit, a
second run that changes nothing and downloads nothing, a revision the repository lacks (refused, the good
copy kept), a damaged shard fetched again, and an hf:// source without a revision refused before any
connection. The fetch runs as another user (runuser) and chowns the directory: root only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pve_run import run_role

ROOT = Path(__file__).resolve().parents[2]
DOUBLE = ROOT / "tests/doubles/hf_hub.py"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the fetch runs as another user (runuser, chown): root only"
)
pytest.importorskip("huggingface_hub")
SYSTEM_PYTHON = "/usr/bin/python3"
SITE = sysconfig.get_paths()["purelib"]
_SAME_MINOR = (
    Path(SYSTEM_PYTHON).exists()
    and subprocess.run(
        [SYSTEM_PYTHON, "-c", f"import sys; sys.exit(sys.version_info[:2] != {tuple(sys.version_info[:2])})"]
    ).returncode
    == 0
)
pytestmark = [
    pytestmark,
    pytest.mark.skipif(
        not _SAME_MINOR,
        reason=f"{SYSTEM_PYTHON} is not Python {sys.version_info.major}.{sys.version_info.minor}",
    ),
]


def _tiny_model(d: Path) -> None:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 8}))
    shards = {
        "model-00001-of-00002.safetensors": os.urandom(4096),
        "model-00002-of-00002.safetensors": os.urandom(2048),
    }
    for name, data in shards.items():
        (d / name).write_bytes(data)
    index = {
        "metadata": {"total_size": 6144},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    (d / "tokenizer").mkdir()
    (d / "tokenizer" / "tokenizer.json").write_text("{}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("hub")
    _tiny_model(tmp / "src")
    sha = subprocess.run(
        [
            sys.executable,
            str(DOUBLE),
            "publish",
            "--root",
            str(tmp / "store"),
            "--repo",
            "org/tiny",
            str(tmp / "src"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    port_file = tmp / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(DOUBLE),
            "--root",
            str(tmp / "store"),
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield {"url": f"http://127.0.0.1:{int(port_file.read_text())}", "sha": sha, "src": str(tmp / "src")}
    proc.terminate()
    proc.wait(timeout=10)


def _downloads(url: str) -> int:
    with urllib.request.urlopen(url + "/_double/stats", timeout=5) as r:
        stats = json.loads(r.read())
    return sum(stats["downloads"].values())


def _vars(tmp: Path, hub: dict[str, str], **over: object) -> dict[str, object]:
    return {
        "model_source": "hf://org/tiny",
        "model_revision": hub["sha"],
        "model_dir": str(tmp / "models" / "tiny"),
        "model_owner": "daemon",  # a system user with a group of its name, as role sglang's and trainer_run's
        "model_python": SYSTEM_PYTHON,
        "model_libexec": str(tmp / "libexec"),
        "model_label": "test model",
        # huggingface_hub from this venv, for a Python the fetching user may run (the venv's own interpreter
        # may live in root's home): the same minor version, so its compiled dependencies load.
        "model_fetch_env": {"HF_ENDPOINT": hub["url"], "HF_HOME": str(tmp / "hf_home"), "PYTHONPATH": SITE},
        **over,
    }


@pytest.fixture()
def work() -> Iterator[Path]:
    """A directory the fetching user can reach (pytest's own tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="model-role-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_fetch_at_a_commit_then_nothing_then_a_damaged_shard(work: Path, hub: dict[str, str]) -> None:
    tmp_path = work
    (tmp_path / "models").mkdir()
    (tmp_path / "hf_home").mkdir()
    shutil.chown(tmp_path / "hf_home", "daemon")
    dest = tmp_path / "models" / "tiny"

    first = run_role(tmp_path / "run1", _vars(tmp_path, hub), role="model")
    assert first.rc == 0, first.output[-3000:]
    assert "Fetch the model from hf://org/tiny@" + hub["sha"] in first.changed_tasks
    src = Path(hub["src"])
    for f in ("config.json", "model-00001-of-00002.safetensors", "tokenizer/tokenizer.json"):
        assert (dest / f).read_bytes() == (src / f).read_bytes(), f
    manifest = json.loads((dest / ".model.json").read_text())
    assert manifest["source"] == f"hf://org/tiny@{hub['sha']}"
    assert (dest / "config.json").stat().st_uid == (dest.stat().st_uid) != 0, "fetched as model_owner"

    before = _downloads(hub["url"])
    second = run_role(tmp_path / "run2", _vars(tmp_path, hub), role="model")
    assert second.rc == 0 and second.changed == 0, (second.changed_tasks, second.output[-2000:])
    assert _downloads(hub["url"]) == before, "a copy that verifies is not fetched again"

    wrong = run_role(tmp_path / "run3", _vars(tmp_path, hub, model_revision="0" * 40), role="model")
    assert wrong.rc != 0
    assert "org/tiny on " + hub["url"] + " has no revision '" + "0" * 40 + "'" in wrong.output, wrong.output[
        -3000:
    ]
    assert "test model: fetching hf://org/tiny@" + "0" * 40 in wrong.output
    assert json.loads((dest / ".model.json").read_text()) == manifest, (
        "a refused revision leaves the good copy"
    )

    shard = dest / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    third = run_role(tmp_path / "run4", _vars(tmp_path, hub), role="model")
    assert third.rc == 0, third.output[-3000:]
    assert "Fetch the model from hf://org/tiny@" + hub["sha"] in third.changed_tasks
    assert shard.read_bytes() == (src / shard.name).read_bytes()


def test_an_hf_source_without_a_commit_is_refused_before_any_change(
    tmp_path: Path, hub: dict[str, str]
) -> None:
    res = run_role(tmp_path / "run", _vars(tmp_path, hub, model_revision="main"), role="model")
    assert res.rc != 0
    assert (
        "model_source=hf://org/tiny needs its revision as the 40-hex commit sha to fetch (got main)"
        in res.output
    )
    assert not (tmp_path / "models").exists() and not (tmp_path / "libexec").exists()


def test_a_link_the_owner_plants_does_not_give_its_target_away(work: Path, hub: dict[str, str]) -> None:
    """The model's owner deletes the manifest (so verify fails and root chowns the directory before the
    fetch) and plants a link to a root-only file: root changes the link, never the file it points to."""
    tmp_path = work
    (tmp_path / "models").mkdir()
    (tmp_path / "hf_home").mkdir()
    shutil.chown(tmp_path / "hf_home", "daemon")
    dest = tmp_path / "models" / "tiny"
    assert run_role(tmp_path / "run1", _vars(tmp_path, hub), role="model").rc == 0
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    (dest / ".model.json").unlink()
    (dest / "planted").symlink_to(secret)
    again = run_role(tmp_path / "run2", _vars(tmp_path, hub), role="model")
    assert again.rc == 0, again.output[-3000:]
    st = secret.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600), "root followed the owner's link"
    assert (dest / "planted").lstat().st_uid == dest.stat().st_uid != 0  # the link itself is the owner's


def test_the_token_reaches_no_command_line_and_no_verbose_output(work: Path, hub: dict[str, str]) -> None:
    """The fetch gets its secret on standard input: `ps` during the run and ansible-playbook -vvv (which
    prints every remote command line, and a task's `environment:` is part of it) never show the token, and
    an hf:// fetch is not given the S3 keys at all."""
    import threading

    tmp_path = work
    (tmp_path / "models").mkdir()
    (tmp_path / "hf_home").mkdir()
    shutil.chown(tmp_path / "hf_home", "daemon")
    secrets = {"model_hf_token": "hf_tokenSEEN7f3a", "model_s3_access_key_id": "AKIAKEYSEEN7f3a",
               "model_s3_secret_access_key": "s3secretSEEN7f3a"}
    varfile = tmp_path / "vars.json"
    varfile.write_text(json.dumps({"ansible_python_interpreter": sys.executable, **_vars(tmp_path, hub),
                                   **secrets}))
    play = tmp_path / "play.yml"
    play.write_text("- name: Fetch\n  hosts: localhost\n  gather_facts: false\n  roles: [model]\n")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="false")
    seen: list[str] = []
    done = threading.Event()

    def watch_ps() -> None:
        while not done.is_set():
            out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            seen.extend(line for line in out.splitlines() if "SEEN7f3a" in line)
            time.sleep(0.05)

    t = threading.Thread(target=watch_ps)
    t.start()
    try:
        playbook = str(Path(sys.executable).with_name("ansible-playbook"))
        r = subprocess.run([playbook, "-vvv", "-i", "localhost,", "-c", "local", str(play),
                            "-e", f"@{varfile}"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    finally:
        done.set()
        t.join()
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "Fetch the model from hf://org/tiny@" in r.stdout
    assert (tmp_path / "models" / "tiny" / ".model.json").is_file()
    assert "SEEN7f3a" not in r.stdout + r.stderr
    assert seen == [], "a secret was on a command line during the run"
