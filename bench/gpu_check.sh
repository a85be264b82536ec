#!/usr/bin/env bash
# One call on a CUDA machine (written for the project's lent NVIDIA H200: Python 3.12, torch 2.11
# +cu130, JAX 0.11.2 with its CUDA plugin) checks the Pallas kernels and the GPU paths, in under
# 8 minutes, and prints one table. NOT YET RUN: no GPU was lent when it was written (2026-12-02).
#
#   1. wheels from .whl/ when carried (verl, reasoning-gym, ...: see bench/rl_gpu_check.sh for the
#      download command; add reasoning-gym==0.1.19 and its pure-Python dependencies to that list)
#   2. pip install --no-deps --no-build-isolation -e .      (torch, JAX, transformers from the image)
#   3. correctness: tests/kernels/test_native_gpu.py        (every kernel fwd+bwd, f32 and bf16,
#      against the float64 torch reference; GQA, odd lengths, decode, H=8192/V=256k)
#   4. speed: bench/kernels.py --quick --device cuda        (each kernel and a Llama training step
#      against torch: the ratios of docs/BENCHMARKS.md)
#   5. train: tpu-pipeline train --recipe arith_lm --device cuda --kernels pallas, 30 steps
#   6. rl: tpu-pipeline rl --recipe grpo_gsm8k --device cuda --kernels pallas, 2 steps on a tiny
#      chat policy (tests/rl/chat_models.py) with a test reward
#
#   OUT=/some/dir bash bench/gpu_check.sh            # results in $OUT (default ./gpu-check/)
#
# Each step runs under its own time limit (they add up to 470 s) and the script goes on after a
# failure. Exit code: 0 when every step passed; 1 when any failed (a kernel off the torch reference
# fails step 3). The table at the end lists each step and the speed ratios torch/pallas.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
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
    tail -n 25 "$OUT/$name.txt"
    echo "$name $rc $((SECONDS - t0))" >> "$SUMMARY"
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
    "$PY" -c "import torch, jax; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('jax', jax.__version__, jax.devices())" 2>&1
} | tee "$OUT/environment.txt"

GSM_SMALL=(--set data.heldout_n=8 --set data.max_prompt_length=1024 --set data.max_response_length=16
           --set trainer.prompts_per_step=4 --set rollout.n=4 --set trainer.eval_k=2 --set trainer.eval_every=0
           --set trainer.save_every=0 --set trainer.micro_batch_size=8 --set optim.lr=1e-3
           --set optim.warmup_steps=1)

step install 40 "$PY" -m pip install -q --no-deps --no-build-isolation -e .
step kernels_vs_torch 150 "$PY" -m pytest -q -rA -p no:cacheprovider tests/kernels/test_native_gpu.py \
    --junitxml="$OUT/kernels_vs_torch.xml"
step kernel_speed 180 "$PY" bench/kernels.py --quick --device cuda --out "$OUT/kernels.json"
step train_pallas 45 "$PY" -m tpu_pipeline train --recipe arith_lm --device cuda --kernels pallas \
    --steps 30 --set arith.n_heldout=200 --set arith.pass_k=0 --out "$OUT/runs/arith_lm"
step rl_pallas 55 env PYTHONPATH="$PWD/tests/rl${PYTHONPATH:+:$PYTHONPATH}" sh -c \
    "$PY -c \"from pathlib import Path; from chat_models import save_chat_policy; save_chat_policy(Path('$OUT/chat_policy'))\" \
     && $PY -m tpu_pipeline rl --recipe grpo_gsm8k --device cuda --kernels pallas --steps 2 \
        --policy '$OUT/chat_policy' --reward rewards_for_tests:odd_char_sum --out '$OUT/runs/rl' ${GSM_SMALL[*]}"

# One table: every step, then the speed ratios (torch ms / pallas ms: above 1, the kernel is faster).
"$PY" - "$OUT" <<'EOF' | tee "$OUT/table.txt"
import json, pathlib, sys
import xml.etree.ElementTree as ET

out = pathlib.Path(sys.argv[1])
print(f"{'check':20s} {'result':28s} {'seconds':>7s}")
for line in (out / "summary.txt").read_text().split("\n"):
    if line.strip():
        name, rc, secs = line.split()
        detail = "pass" if rc == "0" else ("TIMEOUT" if rc in ("124", "137") else f"FAIL rc={rc}")
        if name == "kernels_vs_torch" and (out / "kernels_vs_torch.xml").exists():
            suite = next(ET.parse(out / "kernels_vs_torch.xml").getroot().iter("testsuite"))
            n, bad = int(suite.get("tests")), sum(int(suite.get(k)) for k in ("failures", "errors", "skipped"))
            detail += f" ({n - bad}/{n} tests passed)"
        print(f"{name:20s} {detail:28s} {secs:>7s}")
k = out / "kernels.json"
if k.exists():
    res = json.loads(k.read_text())
    print(f"\n{'torch/pallas on ' + res.get('device', '?'):34s} {'fwd':>8s} {'fwd+bwd':>8s}")
    for r in res.get("kernels", []):
        print(f"{r['kernel']:34s} {r['fwd']['speedup_vs_torch']:8.2f} {r['fwd+bwd']['speedup_vs_torch']:8.2f}")
    if "llama" in res:
        print(f"{'llama training step':34s} {'':8s} {res['llama']['speedup_vs_torch']:8.2f}")
EOF
exit "$FAILED"
