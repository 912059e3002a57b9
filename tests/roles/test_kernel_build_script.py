"""The kernel role's build script (templates/build-kernel.sh.j2), run against a stand-in kernel tree.

A real `make bindeb-pkg` takes minutes and runs in the molecule `kernel` scenario. Here the script
runs against a tiny source tarball whose Makefile stands in for Kbuild's targets (tinyconfig,
olddefconfig, kernelrelease, bindeb-pkg) and a merge_config.sh that appends, so that the script's
own logic is checked fast: config lines that olddefconfig drops are refused by name, a failed build
reports its step and first error, and .debs are published only after success.
"""

from __future__ import annotations

import shlex
import subprocess
import tarfile
from pathlib import Path

import jinja2

TEMPLATE = Path(__file__).resolve().parents[2] / "roles/kernel/templates/build-kernel.sh.j2"

MAKEFILE = """\
tinyconfig:
\tprintf 'CONFIG_64BIT=y\\n# CONFIG_MODULES is not set\\n' > .config
olddefconfig:
\tsed -i '/^CONFIG_NEEDS_MISSING_DEP=/d' .config
kernelrelease:
\t@echo 6.12.99$(LOCALVERSION)
bindeb-pkg:
\t@test ! -e FAIL || { echo 'drivers/x.c:3:1: error: boom' >&2; echo 'make[1]: *** [x] Error 1' >&2; exit 2; }
\ttouch ../linux-image-6.12.99$(LOCALVERSION)_1_amd64.deb ../linux-headers-6.12.99$(LOCALVERSION)_1_amd64.deb
"""
MERGE = '#!/bin/sh\n# stand-in for merge_config.sh -m BASE FRAGMENT...: append, then olddefconfig drops\n' \
    'base=$2; shift 2; cat "$@" >> "$base"; sed -i "/^CONFIG_SYSTEM_TRUSTED_KEYS=/d" "$base"\n'


def make_tree(tmp: Path, fail: bool = False) -> Path:
    src = tmp / "linux-6.12.99"
    (src / "scripts/kconfig").mkdir(parents=True)
    (src / "Makefile").write_text(MAKEFILE)
    merge = src / "scripts/kconfig/merge_config.sh"
    merge.write_text(MERGE)
    merge.chmod(0o755)
    if fail:
        (src / "FAIL").write_text("")
    archive = tmp / "linux.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return archive


def run_script(
    tmp: Path, fragments: list[str], fail: bool = False
) -> tuple[subprocess.CompletedProcess, Path]:
    root = tmp / "root"
    root.mkdir(exist_ok=True)
    key = "abc-def"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = lambda s: shlex.quote(str(s))
    script = env.from_string(TEMPLATE.read_text()).render(
        ansible_managed="test",
        _kernel_key=key,
        _kernel_cache=f"{root}/debs/{key}",
        _kernel_archive=str(make_tree(tmp, fail)),
        kernel_build_root=str(root),
        kernel_base_config_target="tinyconfig",
        kernel_base_config="",
        kernel_localversion="-t",
        kernel_build_jobs=2,
        kernel_keep_build_tree=False,
    )
    (root / f"fragment-{key}.config").write_text("\n".join(fragments) + "\n")
    # Forced options that this base config does not have: merged, never required to survive.
    (root / f"forced-{key}.config").write_text('CONFIG_SYSTEM_TRUSTED_KEYS=""\n')
    path = root / "build.sh"
    path.write_text(script)
    path.chmod(0o755)
    return subprocess.run([str(path)], capture_output=True, text=True, timeout=60), root / "debs" / key


def test_success_publishes_debs_release_and_config(tmp_path):
    proc, cache = run_script(tmp_path, ["CONFIG_MODULES=y", "# CONFIG_DEBUG_INFO_BTF is not set"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "built 6.12.99-t"
    assert (cache / "release").read_text() == "6.12.99-t\n"
    assert sorted(p.name for p in cache.glob("*.deb")) == [
        "linux-headers-6.12.99-t_1_amd64.deb",
        "linux-image-6.12.99-t_1_amd64.deb",
    ]
    assert "CONFIG_MODULES=y" in (cache / "config").read_text().splitlines()
    assert not (tmp_path / "root/work/abc-def").exists(), "build tree kept"


def test_option_dropped_by_olddefconfig_is_refused_by_name(tmp_path):
    proc, cache = run_script(tmp_path, ["CONFIG_MODULES=y", "CONFIG_NEEDS_MISSING_DEP=y"])
    assert proc.returncode == 1
    assert "step 'check-config CONFIG_NEEDS_MISSING_DEP': kernel_config_fragments line" in proc.stdout
    assert not cache.exists(), "a refused config must not populate the cache"


def test_option_that_must_be_unset_but_is_set_is_refused(tmp_path):
    proc, _ = run_script(tmp_path, ["# CONFIG_64BIT is not set"])
    assert proc.returncode == 1
    assert "check-config CONFIG_64BIT': kernel_config_fragments wants CONFIG_64BIT unset" in proc.stdout


def test_failed_build_names_step_and_first_error_and_publishes_nothing(tmp_path):
    proc, cache = run_script(tmp_path, ["CONFIG_MODULES=y"], fail=True)
    assert proc.returncode == 1
    out = proc.stdout.strip()
    assert "failed in step 'bindeb-pkg'" in out
    assert "failed in step 'bindeb-pkg': drivers/x.c:3:1: error: boom;" in out
    assert out.endswith("build-abc-def.log")
    assert not cache.exists()


def test_stale_partial_output_is_discarded(tmp_path):
    stale = tmp_path / "root/debs/abc-def.tmp"
    stale.mkdir(parents=True)
    (stale / "junk.deb").write_text("")
    proc, cache = run_script(tmp_path, ["CONFIG_MODULES=y"])
    assert proc.returncode == 0, proc.stdout
    assert not (cache / "junk.deb").exists()
    assert not stale.exists()
