#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with a CUDA GPU and the `gpu` extra installed:
#   bench/gpu_check.sh OUT_DIR
# 1. pytest -m gpu: compiled flex vs SDPA, the fused loss under bf16, FSDP2 mixed precision, the peak table;
# 2. bench/gpu_dflash.py: one colocated rank of qwen36-27b-dflash (seq 4096, 512 anchors, block 16):
#    tokens/s, samples/s, peak memory, MFU, and plan's prediction (OUT_DIR/gpu_dflash.json).
# Everything it prints is also in OUT_DIR/gpu_check.log. About 5 minutes on an H200.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log="$out/gpu_check.log"
: >"$log"
rc=0
step() { "$@" 2>&1 | tee -a "$log"; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1; }
step nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
step python -m pytest -q -ra -m gpu tests/dflash/test_gpu.py -p no:cacheprovider
step python bench/gpu_dflash.py --out "$out"
exit $rc
