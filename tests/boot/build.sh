#!/usr/bin/env bash
# Build the disk images of the real-boot lane: Debian bookworm (Proxmox VE 8's base) laid out as the Proxmox
# VE installer lays out an ext4/LVM install, with real GRUB, real kernels from Debian's archive and systemd.
#
#   tests/boot/build.sh [LAYOUT...]   LAYOUT: uefi-lvm (default), bios-lvm;   FORCE=1 rebuilds
#
# Everything goes under .cache/boot/ (BOOT_CACHE): the rootfs, the new kernel's packages, an SSH key, and one
# raw disk per layout (scenarios boot qcow2 overlays of it, so the base stays clean). A layout whose disk
# exists is skipped.
#
# The old kernel is bookworm's linux-image-amd64 (6.1), installed in the image and booted by it; the new one
# is bookworm-backports' (6.12), left as .deb files that a scenario installs through role kernel's install
# step, as the role installs the kernel it built. Both are Debian's generic kernels (a Proxmox kernel is
# generic too): the i6300esb watchdog driver and virtio are modules there.
#
# This machine has no device-mapper, so LVM cannot be made here: a builder VM (the rootfs itself, booted
# under QEMU from an ext4 image that `mke2fs -d` fills without a mount) partitions the disk as the PVE
# installer does (pve-installer's Install.pm/Block.pm: partition 1 BIOS boot (sectors 34-2047), 2 the ESP
# (vfat, 512 MiB), 3 the LVM PV with VG "pve" and LV "root" holding / and /boot), copies itself in, runs
# grub-install and update-grub there, and powers off.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
cache=${BOOT_CACHE:-$repo/.cache/boot}
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(uefi-lvm)
# shellcheck source=molecule/images/mounts.sh
source molecule/images/mounts.sh
log() { printf '\033[1mboot build:\033[0m %s\n' "$*"; }
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9

rootfs=$cache/rootfs
stamp=$cache/rootfs.done
if [ ! -f "$stamp" ] || [ -n "${FORCE:-}" ]; then
  t0=$SECONDS
  molecule/images/build.sh bookworm >/dev/null
  release_mounts "$rootfs"
  rm -rf "$rootfs" "$cache"/*.raw "$cache/debs"
  mkdir -p "$rootfs"
  log "rootfs from localhost/gpu-node-bookworm (python3, systemd, sudo)"
  cid=$(podman create localhost/gpu-node-bookworm:latest)
  podman export "$cid" | tar -C "$rootfs" -x
  podman rm "$cid" >/dev/null
  # The container image masks what a container has no use for; a machine needs them (udev above all).
  find "$rootfs/etc/systemd/system" -maxdepth 1 -lname /dev/null -delete
  echo "deb http://deb.debian.org/debian bookworm-backports main" >"$rootfs/etc/apt/sources.list.d/backports.list"
  printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"  # no daemon starts in the chroot
  chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
  trap 'release_mounts "$rootfs"' EXIT
  for d in proc sys dev; do mount --bind "/$d" "$rootfs/$d"; done
  in_root() { chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
  log "apt-get install the old kernel, GRUB (EFI and BIOS), LVM, openssh-server (in a chroot)"
  in_root apt-get update -qq
  in_root apt-get install -y -qq --no-install-recommends linux-image-amd64 initramfs-tools zstd lvm2 \
    grub-efi-amd64 grub-pc-bin efibootmgr dosfstools gdisk parted openssh-server udev kmod systemd-sysv \
    busybox >/dev/null
  # The new kernel: the archive's newest in bookworm-backports, kept as packages for the scenarios.
  new_pkg=$(in_root apt-cache depends -t bookworm-backports linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)/\1/p' | head -n1)
  [ -n "$new_pkg" ] || { echo "boot build: no linux-image in bookworm-backports" >&2; exit 1; }
  mkdir -p "$rootfs/tmp/debs"
  (cd "$rootfs/tmp/debs" && in_root sh -c "cd /tmp/debs && apt-get download -t bookworm-backports $new_pkg" >/dev/null)
  # Its dependencies are installed now: the VMs have no network and the role installs the .deb alone.
  in_root sh -c "apt-get install -y -qq --no-install-recommends \$(dpkg-deb -f /tmp/debs/*.deb Depends \
    | tr ',' '\n' | sed 's/|.*//; s/(.*//' | tr -d ' ' | grep -v '^linux-image')" >/dev/null
  mv "$rootfs/tmp/debs" "$cache/debs"
  # Inside the VMs an initramfs holds only the modules that machine needs (the old kernel's, made above in the
  # chroot, has them all): update-initramfs for the new kernel is several times quicker under TCG.
  echo MODULES=dep >"$rootfs/etc/initramfs-tools/conf.d/boot-lane.conf"
  rm -f "$rootfs/usr/sbin/policy-rc.d" "$rootfs/etc/resolv.conf"
  release_mounts "$rootfs"
  trap - EXIT
  ssh-keygen -q -t ed25519 -N '' -C gpu-node-boot-lane -f "$cache/id_ed25519" <<<y >/dev/null
  install -d -m 0700 "$rootfs/root/.ssh"
  install -m 0600 "$cache/id_ed25519.pub" "$rootfs/root/.ssh/authorized_keys"
  chroot "$rootfs" ssh-keygen -A >/dev/null
  chroot "$rootfs" systemctl enable ssh.service systemd-networkd.service >/dev/null 2>&1
  printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n' >"$rootfs/etc/systemd/network/80-dhcp.network"
  echo pve-vm >"$rootfs/etc/hostname"
  # As on Proxmox VE (proxmox-ve's /etc/default/grub.d/proxmox-ve.cfg): its menu entries say "Proxmox VE".
  mkdir -p "$rootfs/etc/default/grub.d"
  cat >"$rootfs/etc/default/grub.d/proxmox-ve.cfg" <<'EOF'
GRUB_DISTRIBUTOR="Proxmox VE"
EOF
  # The lane reads what the kernel prints on the serial console (each scenario keeps a console log).
  cat >"$rootfs/etc/default/grub.d/boot-lane.cfg" <<'EOF'
GRUB_TIMEOUT=1
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=ttyS0,115200"
GRUB_TERMINAL="serial console"
GRUB_SERIAL_COMMAND="serial --unit=0 --speed=115200"
EOF
  # The NVIDIA module stands in as modprobe's install rule: `modprobe nvidia` (role kernel's post-boot check)
  # succeeds on any kernel of this image.
  echo "install nvidia /bin/true" >"$rootfs/etc/modprobe.d/nvidia-standin.conf"
  # The builder: a unit the builder VM boots into (systemd.unit=gpu-node-vm-build.target), inert otherwise.
  cat >"$rootfs/etc/systemd/system/gpu-node-vm-build.service" <<'EOF'
[Unit]
Description=Lay out the target disk as the Proxmox VE installer does
After=systemd-udev-settle.service local-fs.target
Wants=systemd-udev-settle.service
FailureAction=poweroff-force
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/gpu-node-vm-build
StandardOutput=journal+console
StandardError=journal+console
EOF
  cat >"$rootfs/etc/systemd/system/gpu-node-vm-build.target" <<'EOF'
[Unit]
Description=Build a boot-lane disk
Requires=gpu-node-vm-build.service basic.target
After=gpu-node-vm-build.service basic.target
EOF
  ls "$rootfs"/boot/vmlinuz-* | sed 's|.*/vmlinuz-||' >"$cache/old-release"
  dpkg-deb -f "$cache"/debs/linux-image-*.deb Package | sed 's/^linux-image-//' >"$cache/new-release"
  touch "$stamp"
  log "rootfs ready in $((SECONDS - t0)) s: old kernel $(cat "$cache/old-release"), new $(cat "$cache/new-release")"
fi

old=$(cat "$cache/old-release")
for layout in "${layouts[@]}"; do
  case "$layout" in uefi-lvm|bios-lvm) ;; *) echo "boot build: unknown layout '$layout' (uefi-lvm|bios-lvm)" >&2; exit 2;; esac
  disk=$cache/$layout.raw
  if [ -f "$disk" ] && [ -z "${FORCE:-}" ]; then log "$layout: $disk present"; continue; fi
  t0=$SECONDS
  log "$layout: builder root image (mke2fs -d, no mount)"
  rm -f "$cache/builder.img" "$disk.part"
  install -m 0755 tests/boot/vm-build.sh "$rootfs/usr/local/sbin/gpu-node-vm-build"
  mke2fs -q -t ext4 -d "$rootfs" -L builder "$cache/builder.img" 3G
  truncate -s 6G "$disk.part"
  log "$layout: builder VM (QEMU, TCG): partitions, LVM, the copy, grub-install, update-grub"
  timeout 1200 qemu-system-x86_64 -accel tcg -machine q35 -m 1536 -smp 2 -nographic -no-reboot \
    -kernel "$rootfs/boot/vmlinuz-$old" -initrd "$rootfs/boot/initrd.img-$old" \
    -append "root=/dev/vdb rw console=ttyS0 systemd.unit=gpu-node-vm-build.target gpu_node_layout=$layout" \
    -drive "file=$disk.part,format=raw,if=virtio,cache=unsafe" -drive "file=$cache/builder.img,format=raw,if=virtio,cache=unsafe" \
    -nic none >"$cache/$layout.build.log" 2>&1 </dev/null || true
  if ! grep -q "gpu-node-vm-build: done" "$cache/$layout.build.log"; then
    tail -n 40 "$cache/$layout.build.log" >&2
    echo "boot build: the builder VM did not finish $layout (log: $cache/$layout.build.log)" >&2; exit 1
  fi
  mv "$disk.part" "$disk"
  rm -f "$cache/builder.img"
  log "$layout: $disk in $((SECONDS - t0)) s"
done
