#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with a CUDA GPU and the `gpu` extra installed:
#   bench/gpu_check.sh OUT_DIR          # on the GPU (about 5 minutes on an H200)
#   bench/gpu_check.sh --cpu OUT_DIR    # the same scripts at tiny size on CPU (CI runs this: under 2 minutes)
# 1. pytest -m gpu tests/dflash/test_gpu.py: compiled flex vs SDPA, the fused loss (CE, KL, the target's
#    labels) under bf16 autocast vs full logits, FSDP2 bf16 mixed precision on a 1-rank group, the peak
#    table, one compilation per padded length. --cpu: GPU_CHECK_DEVICE=cpu (aot_eager flex, gloo, CPU bf16
#    autocast; the peak table is skipped). Results also in OUT_DIR/gpu_pytest.xml (JUnit).
# 2. bench/gpu_dflash.py: one rank of qwen36-27b-dflash under FSDP2 (seq 4096, 512 anchors, block 16):
#    first-step (compile) time, step time, tokens/s, MFU, peak reserved memory next to the plan's
#    prediction; two ranks too when two GPUs are visible. If the flex run fails, it is run again with
#    SDPA (--flex off) so the minutes on the GPU still give figures, and the script exits 1.
#    --cpu: --tiny on CPU (SDPA: the flex path is step 1's), one rank and two ranks, over gloo.
# Figures: OUT_DIR/gpu_dflash-*.json. Everything printed is also in OUT_DIR/gpu_check.log.
# PYTHON names the interpreter (default: python on PATH, the activated venv's).
set -uo pipefail
cpu=0
if [ "${1:-}" = "--cpu" ]; then
  cpu=1
  shift
fi
out=${1:?usage: bench/gpu_check.sh [--cpu] OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log="$out/gpu_check.log"
: >"$log"
rc=0
step() {
  echo "+ $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  local s=${PIPESTATUS[0]}
  [ "$s" -eq 0 ] || { echo "FAILED (exit $s): $*" | tee -a "$log"; rc=1; }
  return "$s"
}
pytest_gpu=("$py" -m pytest -v -ra --durations=0 -m gpu tests/dflash/test_gpu.py -p no:cacheprovider
  --junitxml="$out/gpu_pytest.xml")
if [ "$cpu" -eq 1 ]; then
  step "$py" -c 'import torch; print("torch", torch.__version__, "(CPU mode of the GPU checks)")'
  step env GPU_CHECK_DEVICE=cpu "${pytest_gpu[@]}"
  step "$py" bench/gpu_dflash.py --tiny --out "$out"
  step "$py" bench/gpu_dflash.py --tiny --ranks 2 --out "$out"
  exit $rc
fi
step nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
step "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
step env GPU_CHECK_DEVICE=cuda "${pytest_gpu[@]}"
step "$py" bench/gpu_dflash.py --out "$out" || step "$py" bench/gpu_dflash.py --flex off --out "$out"
gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())')
if [ "${gpus:-0}" -ge 2 ]; then
  step "$py" bench/gpu_dflash.py --ranks 2 --out "$out"
fi
exit $rc
