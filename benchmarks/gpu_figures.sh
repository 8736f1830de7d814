#!/usr/bin/env bash
# Every GPU figure of docs/PERFORMANCE.md in one call (a lent GPU; about 9 minutes on an H100):
#   1. tests/test_cuda.py: every Triton kernel ("auto" and "triton" on CUDA) against the eager loops;
#   2. training and generation throughput, PANM / backbone, for each of KERNELS (default "auto triton");
#   3. CUDA kernels per training step and per cached generation step, with their device time: "auto" at the
#      cases' lengths and at L = T = 192, "triton", and "eager" last;
#   4. the length curve (L = T from 1x to 8x) with "auto".
# Usage: bash benchmarks/gpu_figures.sh [OUTPUT_DIR]   (default docs/results/gpu). Each part is bounded by
# `timeout` and skipped once BUDGET seconds (default 510) have passed, so a slow part leaves the others' JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-docs/results/gpu}
mkdir -p "$DIR"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-510}
START=$SECONDS
part() {  # part SECONDS COMMAND...: run COMMAND under `timeout`, unless the budget is spent
  local left=$((BUDGET - (SECONDS - START)))
  if ((left < 20)); then echo "skipped (budget spent): ${*:2}"; return; fi
  timeout $(($1 < left ? $1 : left)) "${@:2}"
}
{ nvidia-smi -L; $PY -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)"; } \
  | tee "$DIR/device.txt"
part 150 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -n 8 | tee "$DIR/test_cuda.txt"
for kernel in ${KERNELS:-auto triton}; do
  part 120 $PY benchmarks/overhead.py --device cuda --sections train,generate --cases lstm,seq2seq,qa \
    --repeats 20 --recurrence-kernel $kernel --output "$DIR/overhead_cuda_$kernel.json" 2>&1 | grep -E "train|generate"
done
kernels() {  # kernels KERNEL CASES NAME [LENGTH]
  part 50 $PY benchmarks/overhead.py --device cuda --sections kernels --cases $2 --recurrence-kernel $1 \
    ${4:+--length $4} --output "$DIR/kernels_cuda_$3.json" 2>&1 | grep -E "kernels|Error"
}
kernels auto lstm auto_lstm
kernels auto seq2seq auto_seq2seq_L24 24
kernels triton lstm,seq2seq triton
part 90 $PY benchmarks/overhead.py --device cuda --sections scaling --repeats 10 \
  --output "$DIR/scaling_cuda_auto.json" 2>&1 | grep scaling
kernels auto seq2seq auto_seq2seq_L192 192  # where the length curve falls: which kernels take the time
kernels eager lstm,seq2seq eager  # the step-by-step reference, last: the budget may skip it
