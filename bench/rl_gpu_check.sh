#!/usr/bin/env bash
# One call on a CUDA machine (written for the project's NVIDIA H200 device machine)
# checks the rl engine on the GPU and measures issue 14's GRPO step time against TRL,
# in under 9 minutes. NOT YET RUN: no GPU was available when it was written.
#
#   1. wheels from .whl/ (prepared beforehand on a machine with PyPI, see below) into
#      /tmp/site; the image already has torch 2.11, transformers, peft, accelerate, JAX
#   2. pip install --no-deps -e .
#   3. tests/rl/test_engine_gpu.py     (grpo_gsm8k on CUDA: bf16, use_kernels, LoRA, sampling RNG)
#   4. bench/rl_gpu.py                 (0.5B Llama/Qwen-shaped policy, 64 prompts x 8 samples,
#                                       256 new tokens: ours, ours with --kernels torch, TRL GRPOTrainer)
#
# Wheels (Python 3.12 on the device machine; none of these is in its image). On a machine
# with PyPI, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 omegaconf==2.3.1 codetiming==1.4.0 \
#     orjson==3.13.0 dill==0.4.1 trl==1.16.0 datasets==5.2.0 multiprocess==0.70.19 importlib-metadata==10.2.0
#   python3 -m pip wheel --no-deps antlr4-python3-runtime==4.9.3 -w .whl   # an sdist only; pure Python
# (checked on 2026-11-30: all resolve, 4.1 MB in all.) ray (~70 MB) does not fit the
# 64 MiB transfer: bench/gpu_stubs/ray stands in for the names verl imports; the
# local engine never calls Ray.
#
# Device tool call (carry .whl), results in $OUT:
#   OUT=$OUT bash bench/rl_gpu_check.sh
#
# Every step runs under its own time limit and the script goes on after a failure;
# summary.txt lists each step's exit code and seconds. Exit code: 0 when all passed.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
SUMMARY="$OUT/rl_summary.txt"
: > "$SUMMARY"
FAILED=0

step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/rl_log.txt"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/rl_$name.txt" 2>&1
    local rc=$?
    tail -n 30 "$OUT/rl_$name.txt"
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$SUMMARY"
    [ "$rc" -eq 0 ] || FAILED=1
}

if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "import ray" 2>/dev/null || export PYTHONPATH="$PWD/bench/gpu_stubs${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 HF_HUB_OFFLINE=1

{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    "$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" 2>&1
    "$PY" -c "import verl, tensordict, trl; print('verl', verl.__version__, 'tensordict', tensordict.__version__, 'trl', trl.__version__)" 2>&1
} | tee "$OUT/rl_environment.txt"

step install 60 "$PY" -m pip install -q --no-deps --no-build-isolation -e .
step rl_gpu_tests 150 "$PY" -m pytest -q -rA -p no:cacheprovider tests/rl/test_engine_gpu.py \
    --junitxml="$OUT/rl_gpu_tests.xml"
step bench_rl_gpu 330 "$PY" bench/rl_gpu.py --steps 4 --sides ours,ours-torch,trl --json-out "$OUT/rl_gpu.json"

cat "$SUMMARY"
exit "$FAILED"
