"""The training loop: AdamW, warm-up + cosine, clipping, bf16 autocast, checkpoints.

Task-agnostic (a tpu_pipeline.train.tasks Task supplies data, loss, eval and export). The machinery
is the training core rl shares: tpu_pipeline.checkpoint, .metrics,
.schedule and .training (hooks, divergence). Every step's batch indices and
dropout RNG derive from (seed, step) alone, so a resumed run repeats exactly
the steps an uninterrupted run would take, and every data-parallel process
agrees on the global batch without communicating. Hooks (`hook(step, row)`)
let recipes and tests observe or stop the loop without forking it.

A loss or gradient norm that turns NaN/inf is noticed at the next logged or
checkpointed step (the flag stays on the device in between, so no step
waits for it) and stops the run with DivergedError before anything from
the diverged steps is saved.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel

from tpu_pipeline.checkpoint import Checkpointer
from tpu_pipeline.device import compile as compile_model
from tpu_pipeline.errors import NotBuiltError
from tpu_pipeline.files import atomic_write_json
from tpu_pipeline.metrics import MetricsWriter
from tpu_pipeline.schedule import scheduler
from tpu_pipeline.train.distributed import DistInfo
from tpu_pipeline.train.recipe import Recipe
from tpu_pipeline.train.tasks.base import Task
from tpu_pipeline.training import Hook, call_hooks, diverged


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
          use_compile: bool, inductor_pallas: bool, kernels_note: str, dist: DistInfo,
          hooks: Iterable[Hook] = (), model_hook: Callable[[torch.nn.Module], Any] | None = None,
          progress: bool | None = None) -> dict:
    L, O = recipe.loop, recipe.optim
    torch.manual_seed(recipe.seed)
    model = task.build_model().to(device)
    if model_hook is not None:
        model_hook(model)
    opt = torch.optim.AdamW(model.parameters(), lr=O.lr, betas=tuple(O.betas), eps=O.eps,
                            weight_decay=O.weight_decay)
    sched = scheduler(opt, total=L.steps, warmup=O.warmup_steps, min_ratio=O.min_lr_ratio)
    ckpt = Checkpointer(out, resume_hint="resume with the same recipe, --steps and --seed, or use another --out")
    start = 0
    last_saved: int | None = None
    if resume:
        state = ckpt.load(config)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start = last_saved = state["step"]

    step_model: torch.nn.Module = model
    if dist.world > 1:
        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if use_compile or inductor_pallas:
        step_model = compile_model(step_model, platform=platform, inductor_pallas=inductor_pallas)

    writer = MetricsWriter(out, total_steps=L.steps, start_step=start, enabled=dist.main,
                           progress=progress, description=task.recipe_name)
    flops = task.flops_per_sample(model)
    hooks = list(hooks)
    window_loss = torch.zeros((), device=device)
    window_steps, window_samples, window_t0 = 0, 0, time.perf_counter()
    first_bad = torch.zeros((), dtype=torch.int64, device=device)  # first step with a NaN/inf loss or gradient

    def check_finite() -> None:
        bad = int(first_bad)
        if bad:
            raise diverged(f"{task.recipe_name}'s loss or gradient norm became NaN/inf at step {bad}",
                           checkpoint_dir=ckpt.dir, last_good=last_saved, lr_key="optim.lr")

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
            first_pallas = inductor_pallas and step == start + 1
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
                    f"--inductor-pallas: Inductor's Pallas code generator failed on {task.recipe_name} "
                    f"(torch {torch.__version__}: {type(e).__name__}: {msg}); run without --inductor-pallas, "
                    "or use --kernels pallas for the hand-written Pallas kernels") from None
            if O.grad_clip > 0:
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), O.grad_clip)
            else:
                gnorm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
            opt.step()
            sched.step()
            finite = torch.isfinite(loss_sum.detach()) & torch.isfinite(gnorm)
            first_bad = torch.where((first_bad == 0) & ~finite, step, first_bad)
            window_loss += loss_sum.detach() / total
            window_steps += 1
            window_samples += L.batch_size

            row = None
            if step % L.log_every == 0 or step == L.steps:
                mean = window_loss / window_steps
                if dist.world > 1:
                    tdist.all_reduce(mean)  # shard sums add up to the global mean
                dt = time.perf_counter() - window_t0
                row = {"step": step, "loss": float(mean), "lr": sched.get_last_lr()[0],
                       "grad_norm": float(gnorm), "samples_per_s": window_samples / dt,
                       "gflops_per_s": flops * window_samples / dt / 1e9}
                window_loss.zero_()
                window_steps, window_samples, window_t0 = 0, 0, time.perf_counter()
            save = (L.checkpoint_every and step % L.checkpoint_every == 0) or step == L.steps
            if row is not None or save:
                check_finite()
            if L.eval_every and step % L.eval_every == 0 and step != L.steps and dist.main:
                ev = task.evaluate(model, device)
                row = {**(row or {"step": step}), **{f"eval/{k}": v for k, v in ev.items()
                                                     if isinstance(v, (int, float))}}
            if row is not None:
                writer.log(row)
            else:
                writer.advance(step)
            if save:
                if dist.main:
                    ckpt.save(step, config=config, state={"model": model.state_dict(), "optimizer": opt.state_dict(),
                                                          "scheduler": sched.state_dict()})
                last_saved = step
                _barrier(dist)
            call_hooks(hooks, step, row)
        train_seconds = time.perf_counter() - train_t0
        if dist.main:
            evals = task.evaluate(model, device)
            evals.update({"recipe": task.recipe_name, "steps": L.steps, "resumed_from": start,
                          "train_seconds": round(train_seconds, 2), "device": platform.kind,
                          "processes": dist.world, "compile": bool(use_compile or inductor_pallas),
                          "inductor_pallas": inductor_pallas,
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
        tdist.barrier()
