"""Role trainer_run: its endpoint filter, the controller-side wheel build, and train.yml's refusal of an
unknown run (a real ansible-playbook run: the refusal happens on the controller, before any connection,
so the example inventory's unreachable hosts are never contacted)."""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def flt() -> ModuleType:
    return _load(ROLE / "filter_plugins" / "trainer_run.py")


@pytest.fixture(scope="module")
def wheel_tool() -> ModuleType:
    return _load(ROLE / "files" / "trainer_wheel.py")


def _fact(endpoints: list[str], router: str = "") -> dict:
    """ansible_local.sglang as role sglang writes it (roles/sglang/tasks/units.yml)."""
    return {"ansible_local": {"sglang": {"endpoints": endpoints, "router": router, "model": "m"}}}


def test_endpoints_come_from_the_sglang_nodes_fact(flt: ModuleType) -> None:
    b1 = [f"http://10.0.1.20:{30000 + i}" for i in range(7)]
    hostvars = {
        "b200-1": {**_fact(b1, "http://10.0.1.20:8000"), "sglang_gpu_count": 99, "sglang_base_port": 1},
        "b200-2": _fact(["http://10.9.0.2:31000", "http://10.9.0.2:31001"], "http://10.9.0.2:8000"),
        "ct200": {},
    }
    # The inventory's sglang_* variables are not read: the fact is the one source.
    assert flt.sglang_endpoints(hostvars, ["b200-1", "b200-2"]) == [
        *b1,
        "http://10.9.0.2:31000",
        "http://10.9.0.2:31001",
    ]
    assert flt.sglang_endpoints(hostvars, ["b200-1", "b200-2"], True) == [
        "http://10.0.1.20:8000",
        "http://10.9.0.2:8000",
    ]


def test_the_ca_the_https_nodes_publish_is_the_one_the_run_trusts(flt: ModuleType) -> None:
    """Role sglang publishes the CA of its HTTPS endpoints with them (made by the role or given); the run gets
    each distinct CA once, and none for nodes that serve plain HTTP."""
    ca1 = "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----"
    ca2 = "-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----"

    def node(scheme: str, ca: str) -> dict:
        fact = _fact([f"{scheme}://10.0.1.20:30000"], f"{scheme}://10.0.1.20:8000")
        fact["ansible_local"]["sglang"]["ca_pem"] = ca + "\n"
        return fact

    hostvars = {"b1": node("https", ca1), "b2": node("https", ca1), "b3": node("https", ca2),
                "plain": node("http", ca2), "nofact": {}}
    assert flt.sglang_ca_pem(hostvars, ["b1", "b2", "b3"]) == ca1 + "\n" + ca2 + "\n"
    assert flt.sglang_ca_pem(hostvars, ["b1", "plain", "nofact"]) == ca1 + "\n"
    assert flt.sglang_ca_pem(hostvars, ["plain"]) == ""
    old = _fact(["https://10.0.1.20:30000"])  # a fact written before the role published its CA
    assert flt.sglang_ca_pem({"n": old}, ["n"]) == ""


def test_endpoints_refuse_a_node_without_the_fact_and_loopback(flt: ModuleType) -> None:
    with pytest.raises(
        flt.EndpointError, match=r"SGLang host n1 publishes no endpoints .*playbooks/sglang.yml"
    ):
        flt.sglang_endpoints({"n1": {"sglang_gpu_count": 2}}, ["n1"])
    for url in (
        "http://127.0.0.1:30000",
        "http://localhost:30000",
        "http://[::1]:30000",
        "http://127.0.1.1:1",
    ):
        with pytest.raises(flt.EndpointError, match=r"loopback endpoints .* cannot reach"):
            flt.sglang_endpoints({"n1": _fact(["http://10.0.0.5:30001", url])}, ["n1"])
    with pytest.raises(flt.EndpointError, match="runs no router"):
        flt.sglang_endpoints({"n1": _fact(["http://10.0.0.5:30001"])}, ["n1"], True)


def test_unit_paths_escape_specifiers_and_refuse_what_systemd_would_split(flt: ModuleType) -> None:
    assert flt.unit_path("/var/lib/trainer/configs/r.yml") == "/var/lib/trainer/configs/r.yml"
    assert flt.unit_path("/models/q%40") == "/models/q%%40"
    for bad in ("/models/a b", "/models/a\tb", '/m/"x"', "/m/'x'", "/m/a\\b", "/m/$HOME"):
        with pytest.raises(flt.UnitPathError, match="a systemd unit line cannot carry"):
            flt.unit_path(bad)


def _project(root: Path) -> Path:
    (root / "trainer" / "sub").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "trainer"\nversion = "0.0.1"\n'
        '[tool.setuptools.packages.find]\ninclude = ["trainer*"]\n'
    )
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "sub" / "__init__.py").write_text("X = 1\n")
    return root


def test_digest_follows_the_sources_only(tmp_path: Path, wheel_tool: ModuleType) -> None:
    src = _project(tmp_path / "p")
    d0 = wheel_tool.digest(src)
    (src / "trainer" / "__pycache__").mkdir()
    (src / "trainer" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (src / "notes.txt").write_text("not packaged")
    assert wheel_tool.digest(src) == d0, "caches and unpackaged files must not change the digest"
    (src / "trainer" / "sub" / "__init__.py").write_text("X = 2\n")
    assert wheel_tool.digest(src) != d0
    with pytest.raises(SystemExit, match=r"pyproject\.toml not found"):
        wheel_tool.digest(tmp_path)


def test_build_wheel_of_this_repo_leaves_the_tree_clean(tmp_path: Path) -> None:
    before = {p.name for p in ROOT.iterdir()}
    r = subprocess.run(
        [sys.executable, str(ROLE / "files" / "trainer_wheel.py"), "build", str(ROOT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    wheel = Path(__import__("json").loads(r.stdout)["wheel"])
    assert wheel.name.startswith("trainer-") and wheel.suffix == ".whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "trainer/cli.py" in names and "trainer/config.py" in names
    assert not [n for n in names if n.startswith(("tests/", "roles/"))]
    assert {p.name for p in ROOT.iterdir()} - before == set(), "the build left files in the working tree"


def _playbook(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    return subprocess.run(
        [exe, "train.yml", "-i", "inventory/example", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_playbook_refuses_an_unknown_run_and_lists_the_runs(tmp_path: Path) -> None:
    for name in ("tiny", "qwen36-dflash"):
        (tmp_path / f"{name}.yml").write_text(f"name: {name}\ntarget: {{path: /m}}\n")
    (tmp_path / "README.md").write_text("not a run")
    r = _playbook("-e", "run=nope", "-e", f"trainer_run_runs_dir={tmp_path}")
    assert r.returncode != 0
    out = " ".join((r.stdout + r.stderr).split())
    assert f"run 'nope' does not exist: no nope.yml in {tmp_path}" in out, out[-2000:]
    assert "runs that exist: qwen36-dflash, tiny" in out
    assert "UNREACHABLE" not in out, "the refusal must come before any connection to the node"


def test_train_playbook_refuses_a_run_file_the_trainer_refuses(tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_text(
        "name: bad\nstages: [train]\ntarget: {path: /m}\ntrain: {lr: 1.0e-3, no_such_key: 1}\n"
    )
    r = _playbook("-e", "run=bad", "-e", f"trainer_run_runs_dir={tmp_path}")
    assert r.returncode != 0
    out = " ".join((r.stdout + r.stderr).split())
    assert "python -m trainer check refused" in out and "no_such_key" in out, out[-2000:]
    assert "UNREACHABLE" not in out, "the config check must come before any connection to the node"


def _local_run(tmp_path: Path, model_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """train.yml with the training node played by this machine, read-only: this machine has no systemd, so
    the play stops at the first node step after the check and the plan ("Read the state of the run's unit");
    the venv is missing too, in case it has."""
    src = (ROOT / "files" / "runs" / "qwen36-27b-dflash.yml").read_text()
    src = src.replace("path: /workspace/models/Qwen3.6-27B", f"path: {model_dir}")
    # a run is named after its file
    (tmp_path / "q.yml").write_text(src.replace("\nname: qwen36-27b-dflash\n", "\nname: q\n"))
    return _playbook(
        "-e",
        "run=q",
        "-e",
        f"trainer_run_runs_dir={tmp_path}",
        "-e",
        "ansible_connection=local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-e",
        "trainer_run_venv=/nonexistent/venv",
        "-e",
        "action=deploy",
        "-e",
        "trainer_run_model_source=",  # the test puts the model there itself
        "-e",
        "ansible_become=false",  # read-only steps on this machine, as whoever runs the test
        *args,
    )


def test_train_playbook_plans_with_the_nodes_config_and_refuses_what_cannot_fit(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "qwen36-27b" / "config.json", model / "config.json")
    # Target and drafter on one 48 GB card: refused with the numbers, before anything is copied.
    one_card = (
        '{"trainer_run_overrides": {"train": {"placement": {"nproc_per_node": 1, "target_gpus": [0],'
        ' "drafter_gpus": [0], "gpu_memory_gb": 48}}}}'
    )
    r = _local_run(tmp_path, model, "-e", one_card)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0
    assert "cannot fit on ct200" in out and "does not fit: GPU 0 needs" in out, out[-3000:]
    assert "Read the state of the run's unit" not in out
    # The run file as shipped fits: the plan is shown and the play goes on (to the missing venv).
    r = _local_run(tmp_path, model)
    out = " ".join((r.stdout + r.stderr).split())
    assert "GPU ranks target w" in out, out[-3000:]
    assert "TASK [trainer_run : Read the state of the run's unit]" in out


def test_train_playbook_says_the_plan_is_skipped_when_the_model_is_not_there(tmp_path: Path) -> None:
    r = _local_run(tmp_path, tmp_path / "not-downloaded")
    out = " ".join((r.stdout + r.stderr).split())
    assert "PLAN SKIPPED on ct200" in out and "not-downloaded/config.json cannot be read there" in out, out[
        -3000:
    ]
    assert "TASK [trainer_run : Read the state of the run's unit]" in out


def test_a_config_json_the_owner_links_to_a_root_file_is_not_read(tmp_path: Path) -> None:
    """The model directory is the run user's: a config.json that is a symbolic link (to a file only root may
    read), or one reached through a linked directory, is refused by the root-run read and never shown."""
    secret = tmp_path / "root-only"
    secret.write_text('{"model_type": "TOP-SECRET-VALUE"}\n')
    secret.chmod(0o600)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").symlink_to(secret)
    r = _local_run(tmp_path, model)
    out = " ".join((r.stdout + r.stderr).split())
    assert "TOP-SECRET-VALUE" not in out
    assert "PLAN SKIPPED on ct200" in out and "is reached through a symbolic link" in out, out[-3000:]
    linked = tmp_path / "linked-model"
    linked.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    fixture = ROOT / "tests" / "fixtures" / "qwen36-27b" / "config.json"
    shutil.copy(fixture, tmp_path / "elsewhere" / "config.json")
    r = _local_run(tmp_path, linked)
    out = " ".join((r.stdout + r.stderr).split())
    assert "PLAN SKIPPED on ct200" in out and "is reached through a symbolic link" in out, out[-3000:]


def test_watch_finds_the_ranks_under_torchrun_in_a_real_process_tree() -> None:
    """The ranks are torchrun's direct children (their own children, e.g. data loader workers, are not)."""
    watch = _load(ROLE / "files" / "trainer_run_watch.py")
    fake_torchrun = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen(['sh', '-c', 'sleep 30 & sleep 30']) for _ in range(2)]\n"
        "time.sleep(30)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", fake_torchrun, "-m", "torch.distributed.run"])
    try:
        deadline = time.monotonic() + 20
        found: tuple[str, list[int]] = ("", [])
        while time.monotonic() < deadline:
            found = watch.ranks_under(os.getpid(), watch.processes())
            if len(found[1]) == 2:
                break
            time.sleep(0.1)
        cmd, ranks = found
        assert "torch.distributed.run" in cmd and len(ranks) == 2, found
        procs = watch.processes()
        assert all(procs[r][0] == launcher.pid for r in ranks)
    finally:
        launcher.kill()
        launcher.wait()


# A field added to a run-config section, in the fixture only: a copy of trainer/ whose eval section has one
# more field. The role's render step must carry it to the node with no change under roles/.
_NEW_FIELD = '''

_EvalConfigBefore = EvalConfig


@dataclasses.dataclass(frozen=True, slots=True)
class EvalConfig(_EvalConfigBefore):  # type: ignore[no-redef]
    new_knob: int = 0  # added by tests/roles/test_trainer_run_role.py; roles/ never names it
'''

_RENDER = """
- name: Render run knob as role trainer_run does for the node (controller only, no node)
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Resolve the run with the trainer
      ansible.builtin.include_role:
        name: {role}
        tasks_from: resolve
        public: true  # the role's vars (the unit's paths) for the template below
    - name: Compose its overrides and check the run as the node gets it
      ansible.builtin.include_role:
        name: {role}
        tasks_from: overrides
        public: true
    - name: Render the run's drop-in
      ansible.builtin.template:
        src: {role}/templates/run.conf.j2
        dest: {out}/run.conf
        mode: "0644"
    - name: Write the overrides file the node gets
      ansible.builtin.copy:
        content: "{{{{ _trainer_run_overrides_text }}}}"
        dest: {out}/overrides.yml
        mode: "0644"
"""


def _render(tmp_path: Path, src: Path, out: Path, **more: object) -> subprocess.CompletedProcess[str]:
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    (runs / "knob.yml").write_text(
        "name: knob\nstages: [generate, eval]\n"
        "target: {path: /models/tiny, stage_to: /dev/shm/stage}\n"
        "generate: {prompts: p.jsonl}\n"
        "eval: {max_samples: 4, new_knob: 3}\n"
    )
    out.mkdir()
    play = tmp_path / "render.yml"
    play.write_text(_RENDER.format(role=ROLE, out=out))
    extra = {
        "trainer_run_name": "knob",
        "trainer_run_runs_dir": str(runs),
        "trainer_run_src_dir": str(src),
        "trainer_run_base_dir": "/var/lib/trainer",
        "trainer_run_endpoints": ["http://10.0.1.20:30000", "http://[fd00::1]:30001"],
        "trainer_run_overrides": {"eval": {"new_knob": 5}},
        "ansible_python_interpreter": sys.executable,
        **more,
    }
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    exe = shutil.which("ansible-playbook") or str(Path(sys.executable).with_name("ansible-playbook"))
    return subprocess.run(
        [exe, "-i", "localhost,", str(play), "-e", __import__("json").dumps(extra)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


def test_a_new_run_config_field_needs_no_change_under_roles(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "trainer", src / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    with (src / "trainer" / "eval" / "config.py").open("a") as f:
        f.write(_NEW_FIELD)

    r = _render(tmp_path, src, tmp_path / "out")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    overrides = yaml.safe_load((tmp_path / "out" / "overrides.yml").read_text())
    assert overrides == {
        "eval": {"new_knob": 5},
        "generate": {"endpoints": ["http://10.0.1.20:30000", "http://[fd00::1]:30001"]},
        "target": {"path": "/dev/shm/stage/knob/tiny", "stage_to": ""},
    }
    dropin = (tmp_path / "out" / "run.conf").read_text()
    assert "--set" not in dropin
    configs = "/var/lib/trainer/configs"
    assert f"-m trainer run {configs}/knob.yml --overrides {configs}/knob.overrides.yml" in dropin
    assert "ExecStartPre=/bin/cp -a -- /models/tiny /dev/shm/stage/knob/tiny" in dropin

    # What the node loads (run file + the overrides file, the same loader) has the new field's value.
    probe = (
        "import sys; from trainer.config import load_run_config;"
        "c = load_run_config(sys.argv[1], override_files=[sys.argv[2]]);"
        "print(c.eval.new_knob, c.eval.max_samples, c.target.path, len(c.generate.endpoints))"
    )
    run_file, overrides_file = tmp_path / "runs" / "knob.yml", tmp_path / "out" / "overrides.yml"
    r = subprocess.run(
        [sys.executable, "-c", probe, str(run_file), str(overrides_file)],
        cwd=src, capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["5", "4", "/dev/shm/stage/knob/tiny", "2"]


def test_the_render_step_asks_the_trainer_that_owns_the_fields(tmp_path: Path) -> None:
    """Control for the test above: the same fixture with this repo's trainer (no new field) is refused on
    the controller, naming the key, before anything is rendered."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "trainer").symlink_to(ROOT / "trainer")
    r = _render(tmp_path, src, tmp_path / "out")
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0
    assert "python -m trainer check refused" in out and "unknown key eval.new_knob" in out, out[-3000:]
    assert not (tmp_path / "out" / "run.conf").exists()


_STATUS_RUN = "name: st\nstages: [train]\nrun_dir: runs/{name}\ntarget: {path: /m}\n"


def _status_play(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess[str]:
    """train.yml -e action=status with this machine as the node: systemctl and journalctl are stand-ins on
    PATH (no systemd here), the node venv's python is this interpreter, the base dir is tmp_path/base, and
    the run's user is whoever runs the test. The status read runs through the real runuser as root; as
    another user (runuser is root's only) a stand-in that, like runuser, refuses a user without a passwd
    entry and otherwise runs the command."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    stands_in = {"systemctl": "ActiveState=active\nSubState=running", "journalctl": "a journal line"}
    for name, out in stands_in.items():
        (stubs / name).write_text(f"#!/bin/sh\nprintf '%s\\n' '{out}'\n")
        (stubs / name).chmod(0o755)
    user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() != 0:
        (stubs / "runuser").write_text(
            '#!/bin/sh\n[ "$1" = -u ] && [ "$3" = -- ] || exit 1\n'
            'getent passwd "$2" >/dev/null || { echo "runuser: user $2 does not exist or the user entry does '
            'not contain all the required fields" >&2; exit 1; }\nshift 3\nexec "$@"\n')
        (stubs / "runuser").chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True, exist_ok=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "python").chmod(0o755)
    (tmp_path / "runs").mkdir(exist_ok=True)
    (tmp_path / "runs" / "st.yml").write_text(_STATUS_RUN)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")
    return _playbook(
        "-e", "run=st", "-e", "action=status", "-e", f"trainer_run_runs_dir={tmp_path / 'runs'}",
        "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}",
        "-e", "ansible_become=false", "-e", f"trainer_run_venv={tmp_path / 'venv'}",
        "-e", f"trainer_run_base_dir={tmp_path / 'base'}", "-e", f"trainer_run_user={user}",
    )


def test_status_reports_the_run_from_its_files_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # never deployed: said plainly, not a failure
    r = _status_play(tmp_path, monkeypatch)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, out[-3000:]
    assert f"run st is not deployed on ct200 (no {tmp_path}/base/configs/st.yml)" in out
    # deployed as the role does (run file + overrides file), with steps logged under the relative run_dir
    configs = tmp_path / "base" / "configs"
    configs.mkdir(parents=True)
    (configs / "st.yml").write_text(_STATUS_RUN)
    (configs / "st.overrides.yml").write_text("{}\n")
    metrics = tmp_path / "base" / "runs" / "st" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    line = {"step": 1, "total_steps": 10, "loss": 2.0, "tau": 1.1, "samples": 4, "tokens": 512,
            "supervised_tokens": 128, "step_time_s": 2.0, "mfu": 0.05}
    metrics.write_text(__import__("json").dumps(line) + "\n")
    r = _status_play(tmp_path, monkeypatch)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, out[-3000:]
    assert "run st: in stage train" in out and "step 1/10 (10.0%)" in out
    assert "2.00 samples/s, 256 tokens/s (64 supervised tokens/s), 2.000 s/step, MFU 5.0%, ETA 18s" in out
    assert "ActiveState=active" in out and "a journal line" in out
    # a damaged metrics file: the play fails naming the file and the line
    metrics.write_text("{not json\n")
    r = _status_play(tmp_path, monkeypatch)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0
    assert "python -m trainer status failed (exit 2)" in out
    assert f"{metrics} line 1: not a JSON object" in out


def test_the_sglang_ca_reaches_the_run_as_generate_ca_file(tmp_path: Path) -> None:
    """With HTTPS endpoints and their CA set (trainer_run_sglang_ca_src), the run's overrides name the node's
    copy of it as generate.ca_file, which the node's loader takes."""
    src = tmp_path / "src"  # the run file of _render carries the field test above adds
    shutil.copytree(ROOT / "trainer", src / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    with (src / "trainer" / "eval" / "config.py").open("a") as f:
        f.write(_NEW_FIELD)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    r = _render(tmp_path, src, tmp_path / "out", trainer_run_sglang_ca_src=str(ca),
                trainer_run_endpoints=["https://10.0.1.20:30000"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    overrides = yaml.safe_load((tmp_path / "out" / "overrides.yml").read_text())
    assert overrides["generate"] == {"endpoints": ["https://10.0.1.20:30000"],
                                     "ca_file": "/etc/trainer-run/sglang-ca.pem"}
