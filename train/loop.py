"""The training loop: AdamW, warm-up + cosine, clipping, bf16 autocast, checkpoints.

Task-agnostic (tasks.py supplies data, loss, eval and export). Every step's
batch indices and dropout RNG derive from (seed, step) alone, so a resumed
run repeats exactly the steps an uninterrupted run would take, and every
data-parallel process agrees on the global batch without communicating.
Hooks (`on_step(step, row)`) let recipes and tests observe or stop the loop
without forking it.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..errors import NotBuiltError
from ..files import atomic_write_json
from .checkpoint import Checkpointer
from .config import Recipe
from .distributed import DistInfo
from .metrics import MetricsWriter
from .tasks import Task

Hook = Callable[[int, dict], None]


def lr_factor(step: int, *, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warm-up, then cosine."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    return ((seed * 1_000_003 + step) * 1_009 + rank) % (2**63 - 1)


def sample_indices(seed: int, step: int, n: int, batch_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step_seed(seed, step))
    return torch.randint(n, (batch_size,), generator=g)


def _autocast(platform, enabled: bool):
    if not (enabled and platform.bf16):
        return contextlib.nullcontext()
    return torch.autocast(device_type=platform.device.type, dtype=torch.bfloat16)


def train(task: Task, recipe: Recipe, *, platform, device, out: Path, config: dict, resume: bool,
          use_compile: bool, pallas: bool, kernels_note: str, dist: DistInfo,
          hooks: Iterable[Hook] = (), model_hook: Callable[[torch.nn.Module], Any] | None = None,
          progress: bool | None = None) -> dict:
    L, O = recipe.loop, recipe.optim
    torch.manual_seed(recipe.seed)
    model = task.build_model().to(device)
    if model_hook is not None:
        model_hook(model)
    opt = torch.optim.AdamW(model.parameters(), lr=O.lr, betas=tuple(O.betas), eps=O.eps,
                            weight_decay=O.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, total=L.steps, warmup=O.warmup_steps, min_ratio=O.min_lr_ratio))
    ckpt = Checkpointer(out)
    start = 0
    if resume:
        state = ckpt.load(config)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start = state["step"]

    step_model: torch.nn.Module = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        step_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if use_compile or pallas:
        from ..device import compile as compile_fn

        step_model = compile_fn(step_model, platform=platform, inductor_pallas=pallas)

    writer = MetricsWriter(out, total_steps=L.steps, start_step=start, enabled=dist.main,
                           progress=progress, description=task.recipe_name)
    flops = task.flops_per_sample(model)
    hooks = list(hooks)
    window_loss = torch.zeros((), device=device)
    window_steps, window_samples, window_t0 = 0, 0, time.perf_counter()
    train_t0 = time.perf_counter()
    evals: dict[str, Any] = {}
    model.train()
    try:
        for step in range(start + 1, L.steps + 1):
            idx = sample_indices(recipe.seed, step, task.num_train, L.batch_size)
            total = task.count(task.make_batch(idx))
            local = {k: v.to(device, non_blocking=True) for k, v in
                     task.make_batch(idx[dist.rank:: dist.world]).items()}
            torch.manual_seed(step_seed(recipe.seed, step, dist.rank))  # dropout
            first_pallas = pallas and step == start + 1
            try:
                with _autocast(platform, L.bf16):
                    loss_sum = task.loss_sum(step_model, local)
                # Sum over this shard / global count, times world because DDP averages
                # gradients: the shards add up to exactly the global-batch mean.
                loss = loss_sum * (dist.world / total)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            except Exception as e:
                if not first_pallas:
                    raise
                # Inductor's Pallas code generator is experimental in torch 2.13; it
                # fails on these models' fused kernels (broadcasting in generated code).
                msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
                raise NotBuiltError(
                    f"--pallas: Inductor's Pallas code generator failed on {task.recipe_name} "
                    f"(torch {torch.__version__}: {type(e).__name__}: {msg}); run without --pallas, or use "
                    "--kernels pallas for the hand-written Pallas kernels") from None
            if O.grad_clip > 0:
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), O.grad_clip)
            else:
                gnorm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
            opt.step()
            sched.step()
            window_loss += loss_sum.detach() / total
            window_steps += 1
            window_samples += L.batch_size

            row = None
            if step % L.log_every == 0 or step == L.steps:
                mean = window_loss / window_steps
                if dist.world > 1:
                    import torch.distributed as tdist

                    tdist.all_reduce(mean)  # shard sums add up to the global mean
                dt = time.perf_counter() - window_t0
                row = {"step": step, "loss": float(mean), "lr": sched.get_last_lr()[0],
                       "grad_norm": float(gnorm), "samples_per_s": window_samples / dt,
                       "gflops_per_s": flops * window_samples / dt / 1e9}
                window_loss.zero_()
                window_steps, window_samples, window_t0 = 0, 0, time.perf_counter()
            if L.eval_every and step % L.eval_every == 0 and step != L.steps and dist.main:
                ev = task.evaluate(model, device)
                row = {**(row or {"step": step}), **{f"eval/{k}": v for k, v in ev.items()
                                                     if isinstance(v, (int, float))}}
            if row is not None:
                writer.log(row)
            else:
                writer.advance(step)
            if (L.checkpoint_every and step % L.checkpoint_every == 0) or step == L.steps:
                if dist.main:
                    ckpt.save(step, config=config, model=model, optimizer=opt, scheduler=sched)
                _barrier(dist)
            for h in hooks:
                h(step, row or {"step": step})
        train_seconds = time.perf_counter() - train_t0
        if dist.main:
            evals = task.evaluate(model, device)
            evals.update({"recipe": task.recipe_name, "steps": L.steps, "resumed_from": start,
                          "train_seconds": round(train_seconds, 2), "device": platform.kind,
                          "processes": dist.world, "compile": bool(use_compile or pallas), "pallas": pallas,
                          "kernels": kernels_note, "seed": recipe.seed})
            metrics = {k: v for k, v in evals.items() if isinstance(v, (int, float, str, bool))}
            task.export(model, out, optimizer=opt, metrics=metrics)
            atomic_write_json(out / "eval.json", evals)
        _barrier(dist)
    finally:
        writer.close()
    return evals


def _barrier(dist: DistInfo) -> None:
    if dist.world > 1:
        import torch.distributed as tdist

        tdist.barrier()
