#!/usr/bin/env bash
# Build the local test images that molecule and the lab use.
#
# No container registry is reachable from the machines this project is tested on, so every image
# is built here from Debian's archive: debootstrap a minbase rootfs, import it into podman, then
# add systemd, python3 and sudo so that systemd boots as PID 1 and Ansible can manage it.
#
#   molecule/images/build.sh                 # all images (bookworm, trixie)
#   molecule/images/build.sh trixie          # one image
#   FORCE=1 molecule/images/build.sh         # rebuild even if present
#
# Idempotent: an image that exists is skipped. Images: localhost/gpu-node-<suite>:latest.
# The apt lists are kept: roles use apt's cache_valid_time, which trusts their age.
set -euo pipefail

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# shellcheck source=molecule/images/mounts.sh
source "$(dirname "$0")/mounts.sh"
WORK=${IMAGES_WORKDIR:-$(cd "$(dirname "$0")" && pwd)/rootfs}
suites=("$@")
# One build at a time (bin/test's two lanes may both ask): the second waits, then finds the images there.
mkdir -p "$WORK"
exec 9>"$WORK/.build.lock"
flock 9
[ ${#suites[@]} -gt 0 ] || suites=(bookworm trixie)

for suite in "${suites[@]}"; do
  case "$suite" in bookworm|trixie) ;; *) echo "build.sh: unknown suite '$suite' (bookworm|trixie)" >&2; exit 2;; esac
  image="localhost/gpu-node-${suite}:latest"
  if [ -z "${FORCE:-}" ] && podman image exists "$image"; then
    echo "build.sh: $image exists, skipping"
    continue
  fi
  base="localhost/gpu-node-${suite}-base:latest"
  if [ -n "${FORCE:-}" ] || ! podman image exists "$base"; then
    dir="$WORK/$suite"
    # never read or delete across a mount point: a rootfs left with proc mounted holds the host's /proc
    release_mounts "$dir"
    rm -rf --one-file-system "$dir"; mkdir -p "$dir"
    echo "build.sh: debootstrap $suite into $dir"
    debootstrap --variant=minbase "$suite" "$dir" "$MIRROR" >"$WORK/$suite.log" 2>&1 \
      || { release_mounts "$dir" || true
           echo "build.sh: debootstrap $suite failed, see $WORK/$suite.log" >&2; tail -20 "$WORK/$suite.log" >&2; exit 1; }
    release_mounts "$dir"
    tar -C "$dir" --one-file-system -c . | podman import - "$base" >/dev/null
    rm -rf --one-file-system "$dir"
  fi
  ctx=$(mktemp -d)
  cat >"$ctx/Containerfile" <<CF
FROM $base
ENV DEBIAN_FRONTEND=noninteractive container=podman
RUN printf 'deb $MIRROR $suite main contrib non-free\n' >/etc/apt/sources.list \\
 && apt-get update \\
 && apt-get install -y --no-install-recommends systemd systemd-sysv dbus python3 python3-apt sudo \\
      ca-certificates iproute2 procps kmod \\
 && apt-get clean \\
 && systemctl mask systemd-logind.service getty.target console-getty.service systemd-udevd.service \\
      systemd-networkd-wait-online.service sys-kernel-config.mount \\
 && systemctl set-default multi-user.target
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
CF
  echo "build.sh: building $image"
  podman build --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
    -t "$image" "$ctx" >"$WORK/$suite-build.log" 2>&1 \
    || { echo "build.sh: podman build $suite failed, see $WORK/$suite-build.log" >&2; tail -20 "$WORK/$suite-build.log" >&2; exit 1; }
  rm -rf "$ctx"
  echo "build.sh: $image ready"
done
