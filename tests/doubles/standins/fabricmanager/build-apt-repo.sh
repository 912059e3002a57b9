#!/bin/sh
# Builds a STAND-IN of NVIDIA's CUDA apt repository for molecule sglang: a flat, local repository
# (deb [trusted=yes] file:DIR ./) with tiny packages under NVIDIA's names and version strings for driver
# DRIVER_VERSION (branch 580 and later: no branch suffix), made with dpkg-deb:
#   nvidia-fabricmanager  DRIVER_VERSION-1ubuntu1  stand-in start script, daemon and unit (this directory)
#   libnvidia-nscq        DRIVER_VERSION-1ubuntu1  an empty library package
#   nvlsm                 1.0-1                    the stand-in NVLSM daemon and /usr/share/nvidia/nvlsm/nvlsm.conf
# The -1ubuntu1 revision is the one NVIDIA's CUDA repository gives recent releases (nvidia-fabricmanager
# 595.58.03-1ubuntu1; 580.65.06-1 before), which is why NVIDIA's scripts pin NAME=${DRIVER_VERSION}*.
# infiniband-diags is not built here: it comes from the distribution, as on a real node.
#   build-apt-repo.sh SRCDIR OUTDIR DRIVER_VERSION
set -eu
src=$1 out=$2 version=$3
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

control() {  # control DIR NAME VERSION DESCRIPTION
    mkdir -p "$1/DEBIAN"
    cat > "$1/DEBIAN/control" <<CONTROL
Package: $2
Version: $3
Architecture: $arch
Maintainer: molecule stand-in <root@localhost>
Section: non-free/misc
Priority: optional
Description: STAND-IN $2 for molecule sglang ($4)
CONTROL
}

fm=$work/nvidia-fabricmanager
install -D -m 0755 "$src/nvidia-fabricmanager-start.sh" "$fm/usr/bin/nvidia-fabricmanager-start.sh"
install -D -m 0755 "$src/standin-daemon" "$fm/usr/bin/nv-fabricmanager"
install -D -m 0644 "$src/nvidia-fabricmanager.service" "$fm/lib/systemd/system/nvidia-fabricmanager.service"
mkdir -p "$fm/usr/share/nvidia/nvswitch"
printf 'LOG_LEVEL=4\nDAEMONIZE=1\nFABRIC_MODE=0\n' > "$fm/usr/share/nvidia/nvswitch/fabricmanager.cfg"
control "$fm" nvidia-fabricmanager "$version-1ubuntu1" "Fabric Manager start script, daemon and unit"

nscq=$work/libnvidia-nscq
mkdir -p "$nscq/usr/share/doc/libnvidia-nscq"
echo "stand-in: no library" > "$nscq/usr/share/doc/libnvidia-nscq/STAND-IN"
control "$nscq" libnvidia-nscq "$version-1ubuntu1" "NSCQ library, empty"

sm=$work/nvlsm
install -D -m 0755 "$src/standin-daemon" "$sm/opt/nvidia/nvlsm/sbin/nvlsm"
mkdir -p "$sm/usr/share/nvidia/nvlsm"
echo "# stand-in NVLSM configuration" > "$sm/usr/share/nvidia/nvlsm/nvlsm.conf"
control "$sm" nvlsm "1.0-1" "NVLink Subnet Manager daemon"

mkdir -p "$out"
rm -f "$out"/*.deb "$out/Packages" "$out/Release"
for pkg in "$fm" "$nscq" "$sm"; do
    dpkg-deb --root-owner-group -Zgzip --build "$pkg" "$out" >/dev/null
done
for deb in "$out"/*.deb; do
    dpkg-deb -f "$deb"
    echo "Filename: ./$(basename "$deb")"
    echo "Size: $(stat -c %s "$deb")"
    echo "SHA256: $(sha256sum "$deb" | cut -d' ' -f1)"
    echo
done > "$out/Packages"
{
    echo "Origin: cuda-standin"
    echo "Label: cuda-standin"
    echo "Date: $(date -Ru)"
    echo "SHA256:"
    echo " $(sha256sum "$out/Packages" | cut -d' ' -f1) $(stat -c %s "$out/Packages") Packages"
} > "$out/Release"
ls "$out"
