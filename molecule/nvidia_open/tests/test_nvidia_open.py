"""The nvidia_open role's real build, checked inside the converged trixie container.

The modules were compiled for real from Debian's nvidia-open-kernel-source (550.x) against Debian's
real linux-headers-*-amd64, with our pci_resize_resource patch. They cannot be LOADED here: a
container shares the host's kernel (a different release) and may not insert modules, so nothing
below checks a loaded driver; the runtime agreement checks are the role's `verify` entry point.
"""
import json

import pytest

VERSION = "550.163.01"
MODULES = ["nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm"]


@pytest.fixture(scope="module")
def fact(host):
    f = host.file("/etc/ansible/facts.d/nvidia_open.fact")
    assert f.exists, "nvidia_open wrote no nvidia_open.fact"
    return json.loads(f.content_string)


@pytest.fixture(scope="module")
def release(host, fact):
    rel = fact["kernel"]
    assert host.file(f"/usr/src/linux-headers-{rel}").is_directory, f"{rel}: no such Debian headers"
    return rel


@pytest.mark.parametrize("module", MODULES)
def test_module_built_for_the_target_kernel(host, release, module):
    path = f"/lib/modules/{release}/updates/nvidia-open/{module}.ko"
    assert host.file(path).is_file, f"{path} missing"
    vermagic = host.check_output(f"modinfo -F vermagic {path}")
    assert vermagic.split()[0] == release, f"{module}.ko vermagic {vermagic!r} is not for {release}"
    assert "mod_unload" in vermagic.split()
    assert host.check_output(f"modinfo -F version {path}") == VERSION


@pytest.mark.parametrize("module", MODULES)
def test_depmod_resolves_the_installed_module(host, release, module):
    # modinfo -k REL NAME goes through modules.dep of REL: depmod ran after the install.
    path = host.check_output(f"modinfo -k {release} -F filename {module}")
    assert path == f"/lib/modules/{release}/updates/nvidia-open/{module}.ko"


def test_patch_was_applied_to_the_built_source(host, fact):
    work = f"/var/cache/gpu-node/nvidia-open/build/{fact['build_key']}"
    src = host.file(f"{work}/modules/nvidia-open-kernel/nvidia/nv-pci.c").content_string
    assert "pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size, 0);" in src
    assert host.file(f"{work}/.built").exists


def test_fact_records_driver_and_kernel(fact, release):
    assert fact["version"] == VERSION
    assert fact["modules"] == MODULES
    assert fact["kernel"] == release


def test_nouveau_is_blacklisted(host):
    conf = host.file("/etc/modprobe.d/nvidia-open-blacklist-nouveau.conf")
    assert "blacklist nouveau" in conf.content_string.splitlines()
    assert "options nouveau modeset=0" in conf.content_string


def test_initramfs_of_the_target_kernel_was_updated_after_the_blacklist(host, release):
    initrd = host.file(f"/boot/initrd.img-{release}")
    conf = host.file("/etc/modprobe.d/nvidia-open-blacklist-nouveau.conf")
    assert initrd.exists
    assert initrd.mtime >= conf.mtime, "initramfs is older than the nouveau blacklist"


def test_modules_load_at_boot(host):
    lines = host.file("/etc/modules-load.d/nvidia-open.conf").content_string.splitlines()
    assert "nvidia" in lines and "nvidia-uvm" in lines


@pytest.mark.parametrize("unit", ["nvidia-dev-nodes.service", "nvidia-persistenced.service"])
def test_boot_units_enabled(host, unit):
    assert host.service(unit).is_enabled, f"{unit} is not enabled"


def test_dev_node_script_creates_every_node(host):
    script = host.file("/usr/local/sbin/nvidia-dev-nodes").content_string
    assert "/proc/driver/nvidia/gpus" in script
    for flag in ('nvidia-modprobe -c="$i"', "nvidia-modprobe -u -c=0", "nvidia-modprobe -m"):
        assert flag in script


def test_failed_build_names_the_pair_and_the_first_compiler_error(host, release):
    msg = host.file("/root/nvidia-open-failure.txt").content_string
    assert "UNEXPECTED" not in msg
    assert "0.0.1-broken" in msg and release in msg, msg
    assert "nvidia/nv-pci.c:7:12: error: too few arguments to function 'pci_resize_resource'" in msg, msg
    assert "full log: /var/cache/gpu-node/nvidia-open/build-" in msg


def test_dev_nodes_unit_runs_before_pve_guests(host):
    # CT 200 with onboot=1 is started by pve-guests.service: the nodes must exist before it.
    unit = host.file("/etc/systemd/system/nvidia-dev-nodes.service").content_string.splitlines()
    before = next(line for line in unit if line.startswith("Before=")).split("=", 1)[1].split()
    assert "pve-guests.service" in before, before
    assert host.file("/etc/systemd/system/pve-guests.service.wants/nvidia-dev-nodes.service").exists
