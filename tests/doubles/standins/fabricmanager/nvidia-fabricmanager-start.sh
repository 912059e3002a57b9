#!/bin/sh
# STAND-IN for /usr/bin/nvidia-fabricmanager-start.sh of package nvidia-fabricmanager (molecule sglang:
# no NVSwitch, no NVLink fabric here). Not NVIDIA's script.
#
# The interface is NVIDIA's, as its driver container starts Fabric Manager on an NVLink5 system such as
# HGX B200 (github.com/NVIDIA/gpu-driver-container, ubuntu24.04/nvidia-driver, _start_daemons) and as the
# package's nvidia-fabricmanager.service runs it:
#   nvidia-fabricmanager-start.sh --mode start --fm-config-file /usr/share/nvidia/nvswitch/fabricmanager.cfg \
#       --fm-pid-file /var/run/nvidia-fabricmanager/nv-fabricmanager.pid \
#       --nvlsm-config-file /usr/share/nvidia/nvlsm/nvlsm.conf --nvlsm-pid-file /var/run/nvidia-fabricmanager/nvlsm.pid
#   nvidia-fabricmanager-start.sh --mode stop --fm-pid-file ... --nvlsm-pid-file ...
# On NVLink5 systems the NVLink Subnet Manager (package nvlsm) is started here, by Fabric Manager's start
# script, with that config and pid file; there is no separate nvlsm service. The driver container stops
# the two daemons through the same pid files (SIGTERM).
#
# This stand-in always behaves as an NVLink5 system: it starts the stand-in NVLSM daemon, then the
# stand-in Fabric Manager daemon, each writing its pid file, and exits (the unit is Type=forking); the
# stand-in nvidia-smi reports fabric Completed/Success once both pid files name live processes. It refuses
# to start without ibstat (package infiniband-diags, which NVIDIA installs beside nvlsm: ubuntu24.04/install.sh,
# nvlink5_pkgs_install), without the nvlsm package, or without the ib_umad kernel module: NVLSM reaches the
# NVLink switches through ib_umad's /dev/infiniband/umad*, and NVIDIA's driver container waits for mlx5_core
# and ib_umad before it runs this script (ubuntu24.04/nvidia-driver, _ensure_nvlink5_prerequisites). A
# container cannot load kernel modules, so the stand-in reads /run/standin-sys/module/ib_umad, which the
# stand-in modprobe (standin-modprobe, this directory) makes in place of the kernel's /sys/module/ib_umad;
# the real /sys/module/ib_umad counts too (STANDIN_SYS_MODULE, for tests, names another directory).
set -eu

NVLSM=/opt/nvidia/nvlsm/sbin/nvlsm
FM=/usr/bin/nv-fabricmanager
mode="" fm_cfg="" fm_pid="" sm_cfg="" sm_pid=""
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) mode=$2; shift 2 ;;
        --fm-config-file) fm_cfg=$2; shift 2 ;;
        --fm-pid-file) fm_pid=$2; shift 2 ;;
        --nvlsm-config-file) sm_cfg=$2; shift 2 ;;
        --nvlsm-pid-file) sm_pid=$2; shift 2 ;;
        *) echo "nvidia-fabricmanager-start.sh (stand-in): unknown argument $1" >&2; exit 2 ;;
    esac
done

stop_pid_file() {
    [ -n "$1" ] && [ -s "$1" ] || return 0
    pid=$(cat "$1")
    kill -TERM "$pid" 2>/dev/null || true
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    rm -f "$1"
}

case "$mode" in
    start)
        [ -n "$fm_cfg" ] && [ -n "$fm_pid" ] && [ -n "$sm_cfg" ] && [ -n "$sm_pid" ] || {
            echo "nvidia-fabricmanager-start.sh (stand-in): --mode start needs --fm-config-file, --fm-pid-file," \
                "--nvlsm-config-file and --nvlsm-pid-file" >&2
            exit 2
        }
        echo "Detected NVL5+ system (stand-in)"
        [ -d /sys/module/ib_umad ] || [ -d "${STANDIN_SYS_MODULE:-/run/standin-sys/module}/ib_umad" ] || {
            echo "nvidia-fabricmanager-start.sh (stand-in): kernel module ib_umad is not loaded (NVLSM needs" \
                "/dev/infiniband/umad*): modprobe ib_umad" >&2
            exit 1
        }
        command -v ibstat >/dev/null 2>&1 || {
            echo "nvidia-fabricmanager-start.sh (stand-in): ibstat not found (install infiniband-diags)" >&2
            exit 1
        }
        [ -x "$NVLSM" ] || { echo "nvidia-fabricmanager-start.sh (stand-in): $NVLSM not found (install nvlsm)" >&2; exit 1; }
        [ -r "$sm_cfg" ] || { echo "nvidia-fabricmanager-start.sh (stand-in): $sm_cfg not found" >&2; exit 1; }
        "$NVLSM" --config "$sm_cfg" --pid-file "$sm_pid"
        "$FM" -c "$fm_cfg" --pid-file "$fm_pid"
        ;;
    stop)
        stop_pid_file "$fm_pid"
        stop_pid_file "$sm_pid"
        ;;
    *)
        echo "nvidia-fabricmanager-start.sh (stand-in): --mode start|stop" >&2
        exit 2
        ;;
esac
