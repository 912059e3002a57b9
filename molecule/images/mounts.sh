# shellcheck shell=bash
# release_mounts DIR: unmount everything mounted at or under DIR, deepest first (lazily when busy), and
# fail naming what stays mounted. debootstrap can exit 0 and leave proc (or sys, dev/pts) mounted in
# the rootfs it built; a later `tar -C DIR -c .` or `rm -rf DIR` would then walk the host's /proc.
release_mounts() {
  local dir mnt left
  dir=$(realpath -m "$1")
  # /proc/self/mountinfo field 5 is the mount point (octal escapes for spaces; none under our rootfs)
  while read -r mnt; do
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  done < <(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
  left=$(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo)
  if [ -n "$left" ]; then
    echo "build.sh: still mounted under $dir (unmount it by hand, then rerun): $left" >&2
    return 1
  fi
}
