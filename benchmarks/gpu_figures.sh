#!/usr/bin/env bash
# Every GPU figure of docs/PERFORMANCE.md in one call (a lent GPU; about 5 minutes on an H200):
#   1. tests/test_cuda.py: the Triton Pointer-Unit kernel ("auto" on CUDA) against the eager loop;
#   2. training and generation throughput, PANM / backbone, with "auto" (Triton) and "eager";
#   3. the length curve (L = T from 1x to 8x) with "auto".
# Usage: bash benchmarks/gpu_figures.sh [OUTPUT_DIR]   (default docs/results/gpu); each part is bounded
# by `timeout`, so a slow part leaves the others' JSON.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-docs/results/gpu}
mkdir -p "$DIR"
PY=${PYTHON:-python3}
nvidia-smi -L | tee "$DIR/device.txt"
timeout 90 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -n 5 | tee "$DIR/test_cuda.txt"
for kernel in ${KERNELS:-auto eager}; do
  timeout 100 $PY benchmarks/overhead.py --device cuda --sections train,generate --cases lstm,seq2seq,qa \
    --repeats 20 --recurrence-kernel $kernel --output "$DIR/overhead_cuda_$kernel.json" 2>&1 | grep -E "train|generate"
done
timeout 90 $PY benchmarks/overhead.py --device cuda --sections scaling --repeats 10 \
  --output "$DIR/scaling_cuda_auto.json" 2>&1 | grep scaling
