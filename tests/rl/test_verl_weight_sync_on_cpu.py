"""VeRL's weight sync into vLLM's CPU rollout, on every GEMM path vLLM's CPU backend takes
(tpu_pipeline.rl.verl_cpu_vllm): after each of several updates through VeRL's real weight
transfer, vLLM's log-probabilities equal the trainer's within float32 noise, the tied lm_head
included. Paths this CPU does not take natively are taken by forcing the capability checks
vLLM reads (verl_weight_sync_probe.py); zentorch itself is not installed here, its two ops
stand in as torch ops. Before the fix the AMX path raised IndexError in vLLM's
`dispatch_cpu_unquantized_gemm`, and vLLM's own layer-wise reload left a tied lm_head on
the first policy's kernel (log-probability gaps of 30+)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# path -> (extra environment, the kernel-preparing call each update must make, largest gap allowed)
PATHS = {
    "native": ({}, None, 1e-3),  # whatever this CPU takes (oneDNN unless zentorch is installed)
    "amx-float32": ({}, "onednn", 1e-3),  # AMX seen; float32 weights go to oneDNN, the conv branch reachable
    "amx-bf16": ({}, "sgl", 0.25),  # sgl-kernel packing; bf16 weights against a float32 trainer
    "onednn": ({}, "onednn", 1e-3),  # AVX-512 without AMX
    "avx2": ({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}, "onednn", 1e-3),
    "zentorch": ({}, "zentorch", 1e-3),
    "torch-linear": ({}, None, 1e-3),  # no oneDNN: torch's linear on the weight itself
}
UPDATES = 3


@pytest.fixture(scope="module")
def sync_policy(tmp_path_factory) -> Path:
    """A tied-embedding char Llama of ~1.3 MB of float32 weights: two of VeRL's 1 MB buckets."""
    import torch

    from tpu_pipeline.train.tasks import char_lm

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("sync_policy")
    model = char_lm.build_model(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                                num_key_value_heads=2)
    assert model.config.tie_word_embeddings
    model.save_pretrained(out)
    char_lm.build_tokenizer().save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
def test_every_update_reaches_every_layer_of_the_rollout(path, sync_policy, verl_python, private_tmp):
    from tpu_pipeline.rl.verl_cpu_platform import ENV

    extra, kernel, bound = PATHS[path]
    env = {**os.environ, **ENV, **extra}  # TMPDIR private (vLLM's file store), inductor's cache shared
    p = subprocess.run([verl_python, str(HERE / "verl_weight_sync_probe.py"), path, str(sync_policy), str(UPDATES)],
                       capture_output=True, text=True, timeout=600, env=env)
    line = next((x for x in p.stdout.splitlines() if x.startswith("PROBE")), None)
    assert line, (p.stdout + p.stderr)[-4000:]
    report = json.loads(line[len("PROBE"):])
    assert report["start_gap"] < bound
    assert len(report["updates"]) == UPDATES
    for u in report["updates"]:
        assert u["gap"] < bound, report  # the trainer's new weights, in every layer
        assert u["gap_to_previous"] > max(10 * u["gap"], 1.0), report  # an update that moved them well beyond that
        if kernel:  # the path forced is the path taken, at every update
            assert u["calls"].get(kernel, 0) > 0, report
    assert {"wrap.update_weights_from_ipc", "wrap.process_weights_after_loading"} <= set(report["called"])
