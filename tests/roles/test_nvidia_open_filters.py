"""nvidia_open's filter that reduces a failed module build log to its first compiler error.

The logs below are shaped like the real failure measured on trixie (nvidia-open-kernel-source
550.163.01 against 6.12.117+deb13 headers): conftest chatter, CC lines, the compiler diagnostic
with its context lines, then make's recursive "Error" trail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "roles/nvidia_open/filter_plugins/build_log.py"
spec = importlib.util.spec_from_file_location("nvidia_open_build_log", PLUGIN)
build_log = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_log)
first_error = build_log.nvidia_open_first_error

HDRS = "/usr/src/linux-headers-6.12.117+deb13-common"
WORK = "/var/cache/gpu-node/nvidia-open/build/0f3c/modules/nvidia-open-kernel"
REAL_FAILURE = f"""=== unpack
=== make modules (CC=x86_64-linux-gnu-gcc-14)
make[1]: Entering directory '/usr/src/linux-headers-6.12.117+deb13-amd64'
 CONFTEST: INIT_WORK
 CONFTEST: pci_resize_resource_has_exclude_bars
  CC [M]  {WORK}/nvidia/nv-dmabuf.o
  CC [M]  {WORK}/nvidia/nv-pci.o
{WORK}/nvidia/nv-pci.c: In function 'nv_resize_pcie_bars':
{WORK}/nvidia/nv-pci.c:237:9: error: too few arguments to function 'pci_resize_resource'
  237 |     r = pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size);
      |         ^~~~~~~~~~~~~~~~~~~
In file included from {WORK}/common/inc/nv-linux.h:74:
/usr/src/linux-headers-6.12.117+deb13-common/include/linux/pci.h:1436:19: note: declared here
{WORK}/nvidia/nv-vm.c:12:1: error: second error that must not be reported
make[4]: *** [{HDRS}/scripts/Makefile.build:229: {WORK}/nvidia/nv-pci.o] Error 1
make[1]: *** [Makefile:224: __sub-make] Error 2
make: *** [Makefile:89: modules] Error 2
"""


def test_reports_the_first_compiler_error_with_a_source_relative_path():
    expected = "nvidia/nv-pci.c:237:9: error: too few arguments to function 'pci_resize_resource'"
    assert first_error(REAL_FAILURE) == expected


def test_fatal_error_counts_as_a_compiler_error():
    log = f"  CC [M]  x.o\n{WORK}/nvidia/os-interface.c:3:10: fatal error: linux/foo.h: No such file\n"
    assert first_error(log) == "nvidia/os-interface.c:3:10: error: linux/foo.h: No such file"


def test_github_layout_paths_are_shortened_after_kernel_open():
    log = "/tmp/b/open-gpu-kernel-modules-595.71.05/kernel-open/nvidia/nv.c:10:2: error: implicit decl\n"
    assert first_error(log) == "nvidia/nv.c:10:2: error: implicit decl"


def test_modpost_error_when_there_is_no_compiler_error():
    log = 'MODPOST Module.symvers\nERROR: modpost: "foo" [nvidia.ko] undefined!\nmake[2]: *** [x] Error 1\n'
    assert first_error(log) == 'ERROR: modpost: "foo" [nvidia.ko] undefined!'


def test_make_error_is_the_last_resort():
    log = "make: *** No rule to make target 'modules'.  Stop.\n"
    assert first_error(log) == "make: *** No rule to make target 'modules'.  Stop."


@pytest.mark.parametrize(
    ("log", "expected"), [("", "the build log is empty"), ("a\nlast words\n\n", "last words")]
)
def test_no_error_line_falls_back_to_the_tail(log, expected):
    assert first_error(log) == expected


def test_warnings_are_not_errors():
    log = f"{WORK}/nvidia/nv.c:5:1: warning: unused variable 'x'\nmake: *** [Makefile:89: modules] Error 2\n"
    assert first_error(log) == "make: *** [Makefile:89: modules] Error 2"


def test_registered_under_the_role_prefixed_name():
    assert build_log.FilterModule().filters() == {"nvidia_open_first_error": first_error}
