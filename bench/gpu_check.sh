#!/usr/bin/env bash
# One call on a CUDA machine (written for an NVIDIA H200) checks the kernels and the
# GPU runtime and collects the figures issue 13 asks for, in under 8 minutes:
#
#   1. pip install --no-deps --no-build-isolation -e .   (torch, JAX with its CUDA
#      plugin and transformers come with the machine's image)
#   2. tests/kernels/test_native_gpu.py                   (every kernel fwd+bwd, bf16/f32)
#   3. bench/kernels.py --quick --device cuda             (kernels vs torch, peak memory,
#                                                          the Llama training step)
#   4. tpu-pipeline train --recipe digits_cnn --device cuda
#   5. tpu-pipeline train --recipe arith_lm --device cuda --kernels pallas, 30 steps and a
#      200-problem held-out eval (the run path with the Llama kernels, not its accuracy)
#
#   bash bench/gpu_check.sh            # results in ./gpu-check/
#   OUT=/some/dir bash bench/gpu_check.sh
#
# Every step runs under its own time limit and the script goes on after a failure;
# summary.txt lists each step's exit code and seconds. Exit code: 0 when all passed.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/log.txt"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.txt"
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$SUMMARY"
    [ "$rc" -eq 0 ] || FAILED=1
}

{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    "$PY" -c "import torch, jax; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('jax', jax.__version__, jax.devices())" 2>&1
} | tee "$OUT/environment.txt"

# Limits add up to 480 s; the steps are expected to take well under them.
step install 40 "$PY" -m pip install -q --no-deps --no-build-isolation -e .
step gpu_tests 150 "$PY" -m pytest -q -rA -p no:cacheprovider tests/kernels/test_native_gpu.py \
    --junitxml="$OUT/gpu_tests.xml"
step bench_kernels 200 "$PY" bench/kernels.py --quick --device cuda --out "$OUT/kernels.json"
step train_digits_cnn 45 "$PY" -m tpu_pipeline train --recipe digits_cnn --device cuda --out "$OUT/runs/digits_cnn"
step train_arith_lm_pallas 45 "$PY" -m tpu_pipeline train --recipe arith_lm --device cuda --kernels pallas \
    --steps 30 --set arith.n_heldout=200 --set arith.pass_k=0 --out "$OUT/runs/arith_lm"

cat "$SUMMARY"
exit "$FAILED"
