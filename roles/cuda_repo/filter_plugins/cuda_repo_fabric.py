"""Filters of role cuda_repo: the Fabric Manager packages NVIDIA publishes for a driver version.

Roles sglang (the B200 node) and nvidia_open (the Proxmox host) install them from NVIDIA's CUDA
repository, which this role adds. `'595.58.03' | cuda_repo_fabric_packages` returns the apt specs that
pin Fabric Manager and its NVSwitch configuration and query library (NSCQ) to the driver's exact version:

    ['nvidia-fabricmanager=595.58.03-*', 'libnvidia-nscq=595.58.03-*']

NVIDIA's rule, as its driver container installs them (github.com/NVIDIA/gpu-driver-container,
ubuntu24.04/precompiled/nvidia-driver: fabricmanager_install, nscq_install; the same rule in
ubuntu24.04/install.sh until that file stopped supporting branches before 580):

- from driver branch 580 on the packages are `nvidia-fabricmanager` and `libnvidia-nscq`;
- before 580 they carry the branch: `nvidia-fabricmanager-<branch>`, `libnvidia-nscq-<branch>`;
- each is installed at the driver's version (`apt-get install NAME=${DRIVER_VERSION}*`) and held
  (`apt-mark hold NAME`). The Debian revision after the version differs between releases in NVIDIA's
  CUDA repository (`580.65.06-1`, `595.58.03-1ubuntu1`), hence the wildcard; `-*` here matches that one
  upstream version with any revision, and no longer version that merely starts with it.

The branch is the driver version's first field (DRIVER_BRANCH in those scripts: 595 for 595.58.03).
"""

from __future__ import annotations

import re

try:  # Ansible shows an AnsibleFilterError's message as is; tests load this file without Ansible too
    from ansible.errors import AnsibleFilterError as _Base
except ImportError:  # pragma: no cover
    _Base = ValueError  # type: ignore[misc,assignment]

# The first branch whose packages carry no branch suffix.
UNSUFFIXED_FROM_BRANCH = 580
PACKAGES = ("nvidia-fabricmanager", "libnvidia-nscq")
_VERSION = re.compile(r"^(\d+)\.\d+(\.\d+)?$")


class DriverVersionError(_Base):  # type: ignore[misc,valid-type]
    """A driver version nvidia-smi would not report (e.g. two versions joined, or empty)."""


def driver_branch(version: str) -> int:
    """The driver branch of a version nvidia-smi reports (595 for 595.58.03)."""
    m = _VERSION.match(str(version).strip())
    if not m:
        raise DriverVersionError(
            f"cannot name the Fabric Manager packages for driver version {version!r}: expected one "
            "version as nvidia-smi reports it, e.g. 595.58.03"
        )
    return int(m.group(1))


def cuda_repo_fabric_package_names(version: str) -> list[str]:
    """NVIDIA's package names for the driver's branch (unpinned)."""
    branch = driver_branch(version)
    if branch >= UNSUFFIXED_FROM_BRANCH:
        return list(PACKAGES)
    return [f"{name}-{branch}" for name in PACKAGES]


def cuda_repo_fabric_packages(version: str) -> list[str]:
    """apt specs pinning the packages to the driver's exact version."""
    version = str(version).strip()
    return [f"{name}={version}-*" for name in cuda_repo_fabric_package_names(version)]


class FilterModule:
    def filters(self):
        return {
            "cuda_repo_fabric_packages": cuda_repo_fabric_packages,
            "cuda_repo_fabric_package_names": cuda_repo_fabric_package_names,
            "cuda_repo_driver_branch": driver_branch,
        }
