"""ZFS hosts: the new kernel gets OpenZFS of the host's own release before any reboot, or no reboot at all.

The stand-ins (tests/doubles/fake-boot/zfs-standins.yml, zfs-standin-source.yml) model the real tools:
`zfs version` reports the host's OpenZFS (2.2.7-pve2), a signed stand-in release tarball zfs-2.2.7.tar.gz
is served from file:///srv/openzfs, its configure/make write module/zfs.ko whose .modinfo the REAL kmod
modinfo and depmod read. /var/lib/fake-boot/zfs-case says which case a host models:
  built:    the role must verify and build 2.2.7 for the new kernel, install it for that kernel only,
            run depmod and update-initramfs for it, and pass the gate before the reboot; the new kernel
            panics (attempt 0), then boots (attempt 1): the second attempt builds and installs nothing;
  refused:  the new kernel already carries zfs 2.3.1-1 and kernel_zfs=check: refused, naming both versions.
"""

import pytest

NEW = "6.12.0-untested"
HOST_VERSION = "2.2.7-pve2"
KBUILD = f"/lib/modules/{NEW}/build"
CACHE = f"/var/cache/gpu-node/kernel/zfs/modules/2.2.7-{NEW}"
SRC = "/srv/openzfs/zfs-2.2.7.tar.gz"


@pytest.fixture(scope="module")
def case(host):
    f = host.file("/var/lib/fake-boot/zfs-case")
    if not f.exists:
        pytest.skip("not a ZFS host")
    return f.content_string.strip()


@pytest.fixture(scope="module")
def calls(host):
    return host.file("/var/lib/fake-boot/calls.log").content_string.splitlines()


@pytest.fixture(scope="module")
def results(host):
    # One file per attempt to boot the new kernel (converge.yml, tasks/attempt.yml).
    files = [host.file(f"/root/kernel-boot-result-{n}.txt") for n in range(3)]
    return [f.content_string.strip() for f in files if f.exists]


def real_modinfo(host, *args):
    # The real kmod modinfo (the stand-in in /usr/local/sbin answers only for the old kernel).
    return host.run("/usr/sbin/modinfo " + " ".join(args))


def test_built_module_of_the_hosts_release_is_resolved_for_the_new_kernel(host, case):
    if case != "built":
        pytest.skip(case)
    version = real_modinfo(host, "-k", NEW, "-F", "version", "zfs")
    assert version.rc == 0, version.stderr
    # The upstream tarball's module is Version-Release of its META: 2.2.7-1, the host's upstream release.
    assert version.stdout.strip() == "2.2.7-1"
    assert version.stdout.strip().split("-")[0] == HOST_VERSION.split("-")[0]
    path = real_modinfo(host, "-k", NEW, "-n", "zfs")
    assert path.stdout.strip() == f"/lib/modules/{NEW}/updates/zfs/zfs.ko"
    assert real_modinfo(host, "-k", NEW, "-F", "vermagic", "zfs").stdout.startswith(NEW + " ")
    assert host.file(f"/lib/modules/{NEW}/updates/zfs/spl.ko").exists


def test_only_the_new_kernel_got_modules(host, case):
    if case != "built":
        pytest.skip(case)
    found = host.run("find /lib/modules -path '*/updates/zfs/*.ko' | sort").stdout.split()
    assert found == [f"/lib/modules/{NEW}/updates/zfs/spl.ko", f"/lib/modules/{NEW}/updates/zfs/zfs.ko"]


def test_depmod_and_initramfs_ran_before_the_gate_and_the_reboot(host, case, calls):
    if case != "built":
        pytest.skip(case)
    assert "updates/zfs/zfs.ko:" in host.file(f"/lib/modules/{NEW}/modules.dep").content_string
    initramfs = f"update-initramfs -u -k {NEW}"
    gate = f"modinfo -k {NEW} -F version zfs"
    configure = [c for c in calls if c.startswith("configure ")]
    # Built once, for the new kernel's headers; the second attempt found the cache and installed nothing.
    assert configure == [f"configure --with-config=kernel --with-linux={KBUILD} --with-linux-obj={KBUILD}"], (
        calls
    )
    assert calls.count(initramfs) == 1, calls
    assert calls.count(gate) == 2, calls  # once per attempt
    assert calls.index(configure[0]) < calls.index(initramfs) < calls.index(gate)
    booted = [i for i, c in enumerate(calls) if c.startswith(f"reboot -> {NEW}")]
    assert len(booted) == 2 and booted[0] > calls.index(gate), calls
    # The initramfs of the new kernel holds the module (the stand-in hook lists what it copied in).
    initrd = host.file(f"/boot/initrd.img-{NEW}").content_string
    assert f"/lib/modules/{NEW}/updates/zfs/zfs.ko 2.2.7-1" in initrd


def test_build_is_cached_per_release_and_kernel_and_logged(host, case):
    if case != "built":
        pytest.skip(case)
    assert host.file(f"{CACHE}/modules/zfs.ko").exists
    log = host.file(f"{CACHE}/build.log").content_string
    assert f"checking kernel source version... {NEW}" in log
    assert "built: spl.ko zfs.ko" in log
    assert not host.file(f"{CACHE}/work").exists, "the unpacked tree is removed after a build"


def test_reinstalling_the_cached_modules_changes_nothing(host, case, calls):
    if case != "built":
        pytest.skip(case)
    again = host.run(f"/var/cache/gpu-node/kernel/zfs/zfs-install.sh {CACHE}/modules {NEW}")
    assert again.rc == 0, again.stderr
    assert again.stdout.strip() == "unchanged"
    after = host.file("/var/lib/fake-boot/calls.log").content_string.splitlines()
    assert after[len(calls) :] == [], "a second install ran depmod/update-initramfs again"


def test_a_tarball_that_fails_its_signature_is_refused(host, case):
    """gpgv against the keyring the role installed: the served tarball verifies, a changed byte does not."""
    if case != "built":
        pytest.skip(case)
    keyring = "/var/cache/gpu-node/kernel/zfs/openzfs-signers.gpg"
    good = host.run(
        f"gpgv --keyring {keyring} /srv/openzfs/zfs-2.2.7.tar.gz.asc /srv/openzfs/zfs-2.2.7.tar.gz"
    )
    assert good.rc == 0, good.stderr
    bad = host.run(
        f"cp {SRC} /tmp/tampered.tar.gz && printf x >>/tmp/tampered.tar.gz && "
        f"gpgv --keyring {keyring} {SRC}.asc /tmp/tampered.tar.gz"
    )
    assert bad.rc != 0 and "BAD signature" in bad.stderr


def test_each_attempt_got_past_the_gate(case, results):
    if case != "built":
        pytest.skip(case)
    assert len(results) == 2, results
    assert "did not come up" in results[0] and "refusing" not in results[0], results
    assert results[1] == "OK", results


def test_mismatch_is_refused_naming_both_versions(host, case, results, calls):
    if case != "refused":
        pytest.skip(case)
    msg = results[0]
    assert f"refusing to reboot {host.backend.get_hostname()} into {NEW}" in msg, msg
    assert f"on OpenZFS {HOST_VERSION}" in msg and "reports OpenZFS 2.3.1-1" in msg, msg
    assert "upstream 2.3.1 != the host's 2.2.7" in msg, msg
    # Refused before any change: nothing built or installed, no initramfs, no reboot into the new kernel.
    assert not host.file(f"/lib/modules/{NEW}/updates").exists
    assert not [c for c in calls if c.startswith(("update-initramfs", f"reboot -> {NEW}"))], calls
