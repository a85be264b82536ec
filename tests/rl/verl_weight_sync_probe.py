"""Run by test_verl_weight_sync_on_cpu.py in .venv-verl (it imports vLLM and VeRL):

    python verl_weight_sync_probe.py GEMM_PATH POLICY_DIR UPDATES

vLLM's own engine on the policy, in this process, with the worker extension `--engine verl`
names; GEMM_PATH chooses the CPU GEMM branch vLLM's `dispatch_cpu_unquantized_gemm` takes by
forcing the capability checks it reads (so a CPU without AMX takes the AMX branches).
UPDATES times, the trainer's weights move and travel through VeRL's real weight transfer
(BucketedWeightSender over ZMQ and shared memory, several buckets) into
`CpuWorkerExtension.update_weights_from_ipc`; after each, vLLM's log-probabilities of every
token at every position of a prompt are compared with Hugging Face's forward pass of the
trainer's weights. Prints one JSON line: PROBE{...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import uuid

# a job id as short as Ray's (8 hex digits): the socket path must stay under 107 bytes in pytest's TMPDIR
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VERL_RAY_JOB_ID=uuid.uuid4().hex[:8])

import torch  # noqa: E402

GEMM_PATHS = ("native", "amx-float32", "amx-bf16", "onednn", "avx2", "zentorch", "torch-linear")
CALLS: dict[str, int] = {}


def _counted(name, fn):
    def wrapper(*a, **k):
        CALLS[name] = CALLS.get(name, 0) + 1
        return fn(*a, **k)
    return wrapper


def force(path: str) -> None:
    """Makes vLLM's CPU dispatch take `path` on this CPU, and counts the kernel-preparing calls."""
    if path != "native":  # before vLLM is imported: it loads its AVX-512 or its AVX2 build by this check
        amx = path.startswith("amx")
        torch.cpu._is_amx_tile_supported = lambda: amx
        if path == "avx2":  # with ONEDNN_MAX_CPU_ISA=AVX2 and ATEN_CPU_CAPABILITY=avx2 from the test
            torch.cpu._is_avx512_supported = lambda: False
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform

    if path == "torch-linear":
        ops._supports_onednn = False
    if path == "zentorch":
        # zentorch is not installed here: its two ops stand in as torch ops, the prepack a copy of
        # the weight (as zentorch's own is), so a layer prepared from old weights keeps them
        lib = torch.library.Library("zentorch", "DEF")
        lib.define("zentorch_weight_prepack_for_linear(Tensor w) -> Tensor")
        lib.define("zentorch_linear_unary(Tensor x, Tensor w, Tensor? b, *, bool is_weight_prepacked) -> Tensor")
        lib.impl("zentorch_weight_prepack_for_linear", _counted("zentorch", lambda w: w.clone()), "CPU")
        lib.impl("zentorch_linear_unary",
                 lambda x, w, b, is_weight_prepacked: torch.nn.functional.linear(x, w, b), "CPU")
        force.keep = lib
        current_platform.is_zen_cpu = lambda: True
    ops.create_onednn_mm = _counted("onednn", ops.create_onednn_mm)
    if hasattr(torch.ops._C, "convert_weight_packed"):  # vLLM's AVX2 build has no sgl-kernel
        torch.ops._C.convert_weight_packed = _counted("sgl", torch.ops._C.convert_weight_packed)


def main() -> None:
    path, policy, updates = sys.argv[1], sys.argv[2], int(sys.argv[3])
    force(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from tpu_pipeline.rl.verl_cpu_platform import CALLED
    from tpu_pipeline.rl.verl_cpu_vllm import QUALNAME

    dtype = "bfloat16" if path == "amx-bf16" else "float32"
    trainer = AutoModelForCausalLM.from_pretrained(policy, torch_dtype=torch.float32)
    vocab = trainer.config.vocab_size
    # block_size 16: the AMX paths' CPU attention stays on its vector kernel (its AMX one would
    # run AMX instructions, which a CPU without AMX cannot)
    llm = LLM(model=policy, dtype=dtype, enforce_eager=True, max_model_len=64, gpu_memory_utilization=0.1,
              max_logprobs=vocab, worker_extension_cls=QUALNAME, block_size=16, seed=0)
    ids = AutoTokenizer.from_pretrained(policy)("12+3-4=5+6-7=")["input_ids"]

    def vllm_logprobs() -> torch.Tensor:
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                           SamplingParams(max_tokens=1, prompt_logprobs=vocab), use_tqdm=False)[0]
        rows = torch.full((len(ids) - 1, vocab), float("-inf"))
        for i, d in enumerate(out.prompt_logprobs[1:]):
            for k, v in d.items():
                rows[i, k] = v.logprob
        return rows

    def trainer_logprobs() -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(trainer(torch.tensor([ids])).logits[0, :-1].float(), -1)

    report = {"path": path, "dtype": dtype, "start_gap": (vllm_logprobs() - trainer_logprobs()).abs().max().item(),
              "updates": []}
    handle = llm.collective_rpc("_get_zmq_handle")[0]
    gen = torch.Generator().manual_seed(1)
    for _ in range(updates):
        before = trainer_logprobs()
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        weights = [(n, t.detach().clone()) for n, t in trainer.state_dict().items()]
        CALLS.clear()
        sender = BucketedWeightSender(handle, bucket_size_mb=1, use_shm=True)  # the policy is ~1.5 MB
        thread = threading.Thread(target=lambda: asyncio.run(sender.async_send_weights(iter(weights))))
        thread.start()
        llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True})
        thread.join(timeout=120)
        got = vllm_logprobs()
        report["updates"].append({"gap": (got - trainer_logprobs()).abs().max().item(),
                                  "gap_to_previous": (got - before).abs().max().item(), "calls": dict(CALLS)})
    report["called"] = sorted(CALLED)
    print("PROBE" + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
