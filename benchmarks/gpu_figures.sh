#!/usr/bin/env bash
# Every GPU figure of docs/PERFORMANCE.md in one call (a lent GPU; about 9 minutes on an H100):
#   1. tests/test_cuda.py: every Triton kernel ("auto" and "triton" on CUDA) against the eager loops;
#   2. training and generation throughput, PANM / backbone, with "auto";
#   3. the training step captured: every model, backbone and PANM alike, under torch.compile, as CUDA graphs
#      (the `cudagraphs` backend) and with Inductor (`reduce-overhead`);
#   4. CUDA kernels per training step and per cached generation step, with their device time, with "auto";
#   5. the length curve (L = T from 1x to 8x) with "auto";
#   6. the same with "triton" (throughput, kernels), kernels at L = T = 192, and "eager" last.
# Usage: bash benchmarks/gpu_figures.sh [OUTPUT_DIR]   (default docs/results/gpu). Each part is bounded by
# `timeout` and skipped once BUDGET seconds (default 540) have passed, so a slow part leaves the others' JSON;
# the later parts (6) repeat figures the page already has and are the first the budget drops. Every part's whole
# output goes to $LOG (default $TMPDIR/gpu_figures.log): Dynamo's and CUDA graphs' warnings, tracebacks.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-docs/results/gpu}
mkdir -p "$DIR"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-540}
START=$SECONDS
LOG=${LOG:-${TMPDIR:-/tmp}/gpu_figures.log}  # every part's whole output (the lines shown are filtered)
: > "$LOG"
part() {  # part SECONDS COMMAND...: run COMMAND under `timeout`, unless the budget is spent
  local left=$((BUDGET - (SECONDS - START)))
  if ((left < 20)); then echo "skipped (budget spent): ${*:2}"; return; fi
  echo "== ${*:2}" >> "$LOG"
  timeout $(($1 < left ? $1 : left)) "${@:2}" 2>&1 | tee -a "$LOG"
}
{ nvidia-smi -L; $PY -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)"; } \
  | tee "$DIR/device.txt"
part 150 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -n 1 | tee -a "$DIR/device.txt"
throughput() {  # throughput KERNEL
  part 120 $PY benchmarks/overhead.py --device cuda --sections train,generate --cases lstm,seq2seq,qa \
    --repeats 20 --recurrence-kernel $1 --output "$DIR/overhead_cuda_$1.json" 2>&1 | grep -E "train|generate"
}
captured() {  # captured MODE SECONDS VARIANTS
  part $2 $PY benchmarks/overhead.py --device cuda --sections train --cases seq2seq,lstm --variants $3 \
    --repeats 20 --compile $1 --output "$DIR/compiled_cuda_$1.json" 2>&1 | grep -E "^train"
}
kernels() {  # kernels KERNEL CASES NAME [LENGTH]
  part 50 $PY benchmarks/overhead.py --device cuda --sections kernels --cases $2 --recurrence-kernel $1 \
    ${4:+--length $4} --output "$DIR/kernels_cuda_$3.json" 2>&1 | grep -E "kernels|Error"
}
throughput auto
captured cudagraphs 110 panm,panm-stack,panm-replace,panm-example,panm-one
captured reduce-overhead 180 panm-replace,panm-example  # Inductor: 25-40 s of compiling per model on an H100
kernels auto lstm auto_lstm
kernels auto seq2seq auto_seq2seq_L24 24
part 90 $PY benchmarks/overhead.py --device cuda --sections scaling --repeats 10 \
  --output "$DIR/scaling_cuda_auto.json" 2>&1 | grep scaling
throughput triton
kernels triton lstm,seq2seq triton
kernels auto seq2seq auto_seq2seq_L192 192  # where the length curve falls: which kernels take the time
kernels eager lstm,seq2seq eager  # the step-by-step reference, last: the budget may skip it
echo "whole output: $LOG"
