#!/bin/sh
# Runs inside the builder VM (tests/boot/build.sh): lay out /dev/vda as the Proxmox VE installer lays out an
# ext4/LVM install, copy this system into it, install GRUB, power off. The layout comes from the kernel
# command line (gpu_node_layout=uefi-lvm|bios-lvm).
#   pve-installer Install.pm/Block.pm: partition 1 "BIOS boot" (sectors 34-2047, EF02), partition 2 the ESP
#   (vfat, 512 MiB, EF00), partition 3 the LVM PV (8E00) with VG "pve" and LV "root" (/ with /boot in it).
#   The ESP is formatted on every install but put in fstab only for UEFI installs that are not ZFS/btrfs
#   (Install.pm: "only mount /boot/efi if really required"); on BIOS, GRUB goes to the disk's MBR gap.
set -eux
# LVM makes its device nodes itself: the builder boots to a target of its own, where lvcreate would otherwise
# wait for udev's confirmation of the new device-mapper device for ever.
export DM_DISABLE_UDEV=1
layout=$(sed -n 's/.*gpu_node_layout=\([a-z-]*\).*/\1/p' /proc/cmdline)
disk=/dev/vda
sgdisk -Z "$disk" >/dev/null 2>&1 || true
sgdisk -a1 -n1:34:2047 -t1:EF02 -n2:2048:+512M -t2:EF00 -n3:0:0 -t3:8E00 "$disk"
partprobe "$disk"; udevadm settle
mkfs.vfat -F 32 "${disk}2"
pvcreate -ff -y "${disk}3"
vgcreate pve "${disk}3"
lvcreate -y -L 4G -n root pve
mkfs.ext4 -q /dev/pve/root
mount /dev/pve/root /mnt
cp -ax /. /mnt/
rm -f /mnt/etc/systemd/system/gpu-node-vm-build.* /mnt/usr/local/sbin/gpu-node-vm-build
mkdir -p /mnt/boot/efi
esp_uuid=$(blkid -s UUID -o value "${disk}2")
echo "/dev/pve/root / ext4 errors=remount-ro 0 1" >/mnt/etc/fstab
if [ "$layout" = uefi-lvm ]; then
  echo "UUID=$esp_uuid /boot/efi vfat defaults 0 1" >>/mnt/etc/fstab
  mount "${disk}2" /mnt/boot/efi
fi
for d in dev proc sys run; do mount --bind /$d /mnt/$d; done
if [ "$layout" = uefi-lvm ]; then
  mount -t efivarfs efivarfs /mnt/sys/firmware/efi/efivars 2>/dev/null || true
  # The firmware boots the removable path (no boot entries in a fresh OVMF varstore) and "proxmox".
  chroot /mnt grub-install --target=x86_64-efi --efi-directory=/boot/efi --bootloader-id=proxmox --no-nvram
  chroot /mnt grub-install --target=x86_64-efi --efi-directory=/boot/efi --removable --no-nvram
else
  chroot /mnt grub-install --target=i386-pc "$disk"
fi
# The initramfs made in the chroot has lvm2's hook (unconditional: lvm, dm_mod): its local-top script
# activates the root VG named by root=/dev/mapper/pve-root, which update-grub writes.
chroot /mnt update-grub
sync
umount -R /mnt
vgchange -an pve
sync
echo "gpu-node-vm-build: done ($layout)" >/dev/console
systemctl poweroff --force --force
