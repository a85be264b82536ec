"""Benchmark the Pallas kernels against their PyTorch counterparts.

    # On a CUDA GPU (needs JAX's CUDA plugin next to torch): native Pallas vs torch
    python bench/kernels.py --device cuda --out bench-kernels.json
    # The same in under 4 minutes on an H200, compilation included (bench/gpu_check.sh)
    python bench/kernels.py --device cuda --quick
    # On CPU: small shapes, Pallas in interpret mode (a correctness tool's cost, not speed)
    .venv/bin/python bench/kernels.py --device cpu

Each kernel is timed forward and forward+backward against its torch
counterpart: flash_attention vs F.scaled_dot_product_attention (GQA via
enable_gqa), rms_norm vs eager RMSNorm, token_logprobs vs log_softmax + gather,
linear_token_logprobs vs matmul + log_softmax + gather. On GPU the timer is
CUDA events (median of --iters after --warmup); on CPU perf_counter medians.

Figures are reported against ceilings measured in the same run: a large
device copy gives the bandwidth ceiling (GB/s), a large matmul (bf16 on GPU,
float32 on CPU) the FLOP ceiling. Memory-bound ops report achieved GB/s,
compute-bound ones achieved TFLOP/s (useful FLOPs: recomputation in the
backward passes is not counted), each also as a fraction of the ceiling.

Peak memory (GPU) of one forward+backward, inputs excluded. torch:
torch.cuda.max_memory_allocated. Pallas: what torch allocated around the kernels
plus what JAX holds, which torch cannot see: the outputs of every kernel call
of the step plus the largest temporary buffer of any of them, read from XLA's
memory analysis of the compiled calls (an upper bound: they may not coincide).
On CPU: n/a.

The Llama step: a transformers Llama (4 layers, hidden 1024, GQA 16/4,
sequence 1024, batch 8, bf16; issue 13's shape) trained with AdamW, stock
(sdpa attention) against `use_kernels(model, "pallas")`: ms per step and
tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import jax  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tpu_pipeline.kernels import _bridge  # noqa: E402
from tpu_pipeline.kernels import flash_attention, linear_token_logprobs, rms_norm, token_logprobs  # noqa: E402
from tpu_pipeline.kernels import use_kernels  # noqa: E402

SHAPES = {
    "cuda": dict(attn=(4, 16, 4, 2048, 128), rms=(16384, 4096), lp=(4096, 32768), lin=(4096, 2048, 32768),
                 dtype=torch.bfloat16, copy_mib=1024, mm=8192,
                 # layers, hidden, heads, kv heads, seq, batch, vocab
                 llama=(4, 1024, 16, 4, 1024, 8, 32000)),
    "cpu": dict(attn=(1, 4, 2, 128, 32), rms=(512, 256), lp=(128, 2048), lin=(128, 64, 2048),
                dtype=torch.float32, copy_mib=64, mm=1024, llama=(2, 64, 4, 2, 32, 2, 256)),
}
WORK = ("attention", "rms", "logprobs", "linear", "llama")


class Timer:
    def __init__(self, device: torch.device, warmup: int, iters: int):
        self.device, self.warmup, self.iters = device, warmup, iters

    def __call__(self, fn) -> float:
        """Median milliseconds of fn()."""
        for _ in range(self.warmup):
            fn()
        times = []
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            for _ in range(self.iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for _ in range(self.iters):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)


def ceilings(dev, shapes, timer) -> dict:
    n = shapes["copy_mib"] * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=dev).normal_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    bw = 2 * src.numel() * 4 / (ms * 1e-3) / 1e9  # read + write
    m = shapes["mm"]
    mm_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = torch.randn(m, m, device=dev, dtype=mm_dtype)
    b = torch.randn(m, m, device=dev, dtype=mm_dtype)
    ms = timer(lambda: a @ b)
    tflops = 2 * m**3 / (ms * 1e-3) / 1e12
    del src, dst, a, b
    return {"bandwidth_gbs": bw, "matmul_tflops": tflops, "matmul_dtype": str(mm_dtype).replace("torch.", "")}


class JaxCalls:
    """Records the Pallas calls the torch bridge makes, to read their compiled memory, and
    the shared memory Triton reports for each kernel compiled meanwhile (JAX > 0.10.2
    compiles Triton kernels while lowering; jax._src.lib.triton is JAX-internal, so this
    is best effort: an empty list when the hook is not there)."""

    def __init__(self):
        self.calls = []
        self.triton = []  # (num_warps, num_stages, shared memory bytes) per compiled kernel
        self._real = _bridge._run
        self._real_compile = None

    def __enter__(self):
        def spy(fn, tensors, **static):
            self.calls.append((fn, [t.detach().contiguous() for t in tensors], static))
            return self._real(fn, tensors, **static)

        _bridge._run = spy
        try:
            from jax._src.lib import triton as triton_lib  # JAX-internal: the Triton compile hook
        except ImportError:
            triton_lib = None
        if triton_lib is not None and hasattr(triton_lib, "compile"):
            self._triton_lib, self._real_compile = triton_lib, triton_lib.compile

            def compile_spy(*args, **kwargs):
                result = self._real_compile(*args, **kwargs)
                self.triton.append((kwargs.get("num_warps"), kwargs.get("num_stages"),
                                    getattr(result, "smem_bytes", None)))
                return result

            triton_lib.compile = compile_spy
        return self

    def __exit__(self, *exc):
        _bridge._run = self._real
        if self._real_compile is not None:
            self._triton_lib.compile = self._real_compile

    def bytes(self) -> int:
        """Outputs of every recorded call + the largest temporary buffer of any."""
        outputs, temp = 0, 0
        for fn, tensors, static in self.calls:
            args = [jax.ShapeDtypeStruct(tuple(t.shape), jax.dlpack.from_dlpack(t).dtype) for t in tensors]
            with jax.enable_x64(any(t.dtype == torch.float64 for t in tensors)):
                mem = fn.native.lower(*args, interpret=False, **static).compile().memory_analysis()
            outputs += mem.output_size_in_bytes
            temp = max(temp, mem.temp_size_in_bytes)
        return outputs + temp

    def blocks(self) -> list[str]:
        """The block configuration of each call and its estimated shared memory (kernels/_blocks.py)."""
        rows = set()
        for fn, tensors, static in self.calls:
            cfg = static.get("cfg")
            direction = "fwd" if fn.__name__.endswith("_fwd") else "bwd"
            smem = cfg.onchip_bytes(tensors[0].element_size(), direction) if cfg is not None else 0
            rows.add(f"{fn.__name__}: {cfg}, ~{smem / 1024:.0f} KiB on-chip (estimate)")
        return sorted(rows)


def peak_memory(dev, fn, pallas: bool) -> dict:
    """Peak bytes of fn() above what is allocated before it (GPU); see the module docstring."""
    if dev.type != "cuda":
        return {"peak_mib": None}
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with JaxCalls() as calls:
        fn()
        torch.cuda.synchronize()
    torch_peak = torch.cuda.max_memory_allocated() - base
    jax_bytes = calls.bytes() if pallas else 0
    return {"peak_mib": (torch_peak + jax_bytes) / 2**20, "torch_alloc_mib": torch_peak / 2**20,
            "jax_mib": jax_bytes / 2**20}


def _fwd_bwd(fn, inputs):
    def run():
        out = fn()
        grads = torch.autograd.grad(out.float().sum(), inputs)
        return grads

    return run


def bench_attention(dev, s, timer, impl):
    B, H, Hkv, S, D = s["attn"]
    mk = lambda h: torch.randn(B, h, S, D, device=dev, dtype=s["dtype"], requires_grad=True)  # noqa: E731
    q, k, v = mk(H), mk(Hkv), mk(Hkv)
    ours = lambda: flash_attention(q, k, v, causal=True, impl=impl)  # noqa: E731
    theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
    flops = 4 * B * H * S * S * D * 0.5  # causal: half the score matrix
    return _pair("flash_attention", ours, theirs, (q, k, v), timer, flops=flops, bwd_factor=2.5,
                 shape=f"B={B} H={H} Hkv={Hkv} S={S} D={D}")


def bench_rms(dev, s, timer, impl):
    N, D = s["rms"]
    x = torch.randn(N, D, device=dev, dtype=s["dtype"], requires_grad=True)
    w = torch.randn(D, device=dev, dtype=s["dtype"], requires_grad=True)

    def eager():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)

    nbytes = 2 * N * D * x.element_size()  # read x, write y
    return _pair("rms_norm", lambda: rms_norm(x, w, impl=impl), eager, (x, w), timer, nbytes=nbytes,
                 bwd_bytes=3 * N * D * x.element_size(), shape=f"N={N} D={D}")


def bench_logprobs(dev, s, timer, impl):
    N, V = s["lp"]
    logits = torch.randn(N, V, device=dev, dtype=s["dtype"], requires_grad=True)
    labels = torch.randint(0, V, (N,), device=dev)
    ref = lambda: torch.log_softmax(logits.float(), -1).gather(-1, labels[:, None])[:, 0]  # noqa: E731
    nbytes = N * V * logits.element_size()  # read the logits once
    return _pair("token_logprobs", lambda: token_logprobs(logits, labels, impl=impl), ref, (logits,), timer,
                 nbytes=nbytes, bwd_bytes=2 * nbytes, shape=f"N={N} V={V}")


def bench_linear(dev, s, timer, impl):
    N, Hd, V = s["lin"]
    h = torch.randn(N, Hd, device=dev, dtype=s["dtype"], requires_grad=True)
    w = (torch.randn(V, Hd, device=dev, dtype=s["dtype"]) * Hd**-0.5).requires_grad_()
    labels = torch.randint(0, V, (N,), device=dev)
    ref = lambda: torch.log_softmax((h @ w.t()).float(), -1).gather(-1, labels[:, None])[:, 0]  # noqa: E731
    return _pair("linear_token_logprobs", lambda: linear_token_logprobs(h, w, labels, impl=impl), ref, (h, w),
                 timer, flops=2 * N * Hd * V, bwd_factor=2.0, shape=f"N={N} H={Hd} V={V}")


def _pair(name, ours, theirs, inputs, timer, *, flops=None, nbytes=None, bwd_factor=None, bwd_bytes=None, shape=""):
    row = {"kernel": name, "shape": shape}
    dev = inputs[0].device
    with JaxCalls() as calls:
        _fwd_bwd(ours, inputs)()  # compiles, and records the blocks the device configuration chose
    row["blocks"] = calls.blocks()
    row["triton_compiled"] = [{"num_warps": w, "num_stages": st, "smem_bytes": b} for w, st, b in calls.triton]
    row["memory"] = {"pallas": peak_memory(dev, _fwd_bwd(ours, inputs), True),
                     "torch": peak_memory(dev, _fwd_bwd(theirs, inputs), False)}
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    for mode, wrap in (("fwd", lambda f: f), ("fwd+bwd", lambda f: _fwd_bwd(f, inputs))):
        with torch.set_grad_enabled(mode != "fwd"):
            t_ours = timer(wrap(ours))
            t_ref = timer(wrap(theirs))
        work_flops = None if flops is None else flops * (1 if mode == "fwd" else 1 + bwd_factor)
        work_bytes = None if nbytes is None else nbytes + (0 if mode == "fwd" else bwd_bytes)
        row[mode] = {"pallas_ms": t_ours, "torch_ms": t_ref, "speedup_vs_torch": t_ref / t_ours}
        if work_flops is not None:
            row[mode]["pallas_tflops"] = work_flops / (t_ours * 1e-3) / 1e12
            row[mode]["torch_tflops"] = work_flops / (t_ref * 1e-3) / 1e12
        if work_bytes is not None:
            row[mode]["pallas_gbs"] = work_bytes / (t_ours * 1e-3) / 1e9
            row[mode]["torch_gbs"] = work_bytes / (t_ref * 1e-3) / 1e9
    return row


def bench_llama(dev, s, timer, impl, steps: int):
    """ms per AdamW step and tokens/s: stock transformers Llama (sdpa) vs use_kernels(model, impl)."""
    import transformers  # heavy: only the Llama step needs it

    layers, hidden, heads, kv_heads, seq, batch, vocab = s["llama"]
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=seq, attn_implementation="sdpa")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)
    row = {"kernel": "llama_train_step", "shape": f"layers={layers} hidden={hidden} heads={heads}/{kv_heads} "
                                                  f"seq={seq} batch={batch} {str(s['dtype']).replace('torch.', '')}"}
    for name in ("torch", "pallas"):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).to(device=dev, dtype=s["dtype"]).train()
        if name == "pallas":
            use_kernels(model, impl)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss

        losses = [step().item() for _ in range(2)]  # compile / warm up
        t = Timer(dev, 0, steps)
        ms = t(step)
        row[name] = {"ms_per_step": ms, "tokens_per_s": batch * seq / (ms * 1e-3), "first_losses": losses,
                     "memory": peak_memory(dev, step, name == "pallas")}
        del model, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    row["speedup_vs_torch"] = row["torch"]["ms_per_step"] / row["pallas"]["ms_per_step"]
    return row


def _mib(m: dict) -> str:
    return "n/a" if m.get("peak_mib") is None else f"{m['peak_mib']:.0f} MiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--only", default=",".join(WORK), help=f"comma-separated subset of {','.join(WORK)}")
    ap.add_argument("--quick", action="store_true",
                    help="fewer timed iterations (3 warm-up, 10 timed; 5 Llama steps): < 4 min on an H200")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    kind = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device(kind)
    if kind == "cuda":
        if not any(d.platform == "gpu" for d in jax.devices()):
            print("error: JAX sees no GPU; native Pallas needs jax[cuda12] (pip install 'jax[cuda12]')",
                  file=sys.stderr)
            return 2
        mode = "native Pallas (Triton/Mosaic GPU)"
        name = torch.cuda.get_device_name(0)
    else:
        # One thread: these machines are shared, and JAX and torch would fight over cores.
        torch.set_num_threads(1)
        mode = "Pallas INTERPRET mode on CPU: a correctness tool's cost, not a speed figure"
        name = f"{platform.machine()} CPU, {os.cpu_count()} cores"
    shapes = SHAPES[kind]
    warmup, iters = (3, 10) if args.quick else ((10, 50) if kind == "cuda" else (3, 15))
    timer = Timer(dev, args.warmup if args.warmup is not None else warmup,
                  args.iters if args.iters is not None else iters)
    unknown = set(args.only.split(",")) - set(WORK)
    if unknown:
        print(f"error: --only: unknown {', '.join(sorted(unknown))}; valid: {', '.join(WORK)}", file=sys.stderr)
        return 2

    result = {"device": name, "mode": mode, "date": time.strftime("%Y-%m-%d"),
              "torch": torch.__version__, "ceilings": ceilings(dev, shapes, timer), "kernels": []}
    benches = {"attention": bench_attention, "rms": bench_rms, "logprobs": bench_logprobs, "linear": bench_linear}
    t0 = time.perf_counter()
    for key in args.only.split(","):
        if key == "llama":
            result["llama"] = bench_llama(dev, shapes, timer, "pallas", steps=5 if args.quick else 20)
        else:
            result["kernels"].append(benches[key](dev, shapes, timer, "pallas"))
        if kind == "cuda":
            torch.cuda.empty_cache()
    result["wall_s"] = time.perf_counter() - t0

    print(f"# {name}: {mode}")
    c = result["ceilings"]
    print(f"# ceilings (same run): copy {c['bandwidth_gbs']:.1f} GB/s, {c['matmul_dtype']} matmul "
          f"{c['matmul_tflops']:.2f} TFLOP/s")
    for r in result["kernels"]:
        for m in ("fwd", "fwd+bwd"):
            f = r[m]
            rate = ""
            if "pallas_tflops" in f:
                rate = (f"{f['pallas_tflops']:.3f} vs {f['torch_tflops']:.3f} TFLOP/s "
                        f"({f['pallas_tflops'] / c['matmul_tflops']:.1%} of ceiling)")
            elif "pallas_gbs" in f:
                rate = (f"{f['pallas_gbs']:.1f} vs {f['torch_gbs']:.1f} GB/s "
                        f"({f['pallas_gbs'] / c['bandwidth_gbs']:.1%} of ceiling)")
            print(f"{r['kernel']:22s} {m:8s} {r['shape']:28s} pallas {f['pallas_ms']:9.3f} ms  torch "
                  f"{f['torch_ms']:9.3f} ms  torch/pallas {f['speedup_vs_torch']:6.3f}  {rate}")
        mem = r["memory"]
        ratio = ("" if mem["pallas"]["peak_mib"] is None else
                 f" ({mem['pallas']['peak_mib'] / max(mem['torch']['peak_mib'], 1e-9):.1%} of torch's)")
        print(f"{'':22s} peak memory fwd+bwd: pallas {_mib(mem['pallas'])}{ratio}, torch {_mib(mem['torch'])}")
        for b in r["blocks"]:
            print(f"{'':22s} blocks {b}")
        for t in r["triton_compiled"]:
            print(f"{'':22s} Triton compiled: {t['num_warps']} warps, {t['num_stages']} stages, "
                  f"{t['smem_bytes']} B shared memory")
    if "llama" in result:
        r = result["llama"]
        for name in ("torch", "pallas"):
            print(f"llama step {name:6s} {r['shape']}: {r[name]['ms_per_step']:.2f} ms/step, "
                  f"{r[name]['tokens_per_s']:.0f} tokens/s, peak {_mib(r[name]['memory'])}, "
                  f"first losses {', '.join(f'{x:.4f}' for x in r[name]['first_losses'])}")
        print(f"llama step pallas vs torch: {r['speedup_vs_torch']:.3f}x")
    print(f"# wall {result['wall_s']:.1f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
