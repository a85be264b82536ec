"""`tpu_pipeline.train.run`: one call from a recipe name to a trained run folder.

Everything that can be refused is checked before anything is written or
any process is launched: the recipe and its values, the device, the
kernels choice, and on --resume the checkpoint (checksum, format, config).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable

from ..config import load
from ..errors import NotBuiltError, UserError
from ..recipes import find_recipe
from . import distributed
from .checkpoint import Checkpointer
from .config import Recipe, validate

KERNELS = ("auto", "pallas", "torch")


def load_recipe(recipe: str, overrides: dict[str, Any] | None = None) -> tuple[str, Recipe]:
    path = find_recipe("train", recipe)
    return path.stem, validate(load(Recipe, path, overrides), str(path))


def fingerprint(r: Recipe) -> dict:
    """What a checkpoint must agree with to be resumed (everything that shapes the losses)."""
    d = dataclasses.asdict(r)
    d.pop("description", None)
    for k in ("log_every", "eval_every", "checkpoint_every", "compile"):
        d["loop"].pop(k, None)
    return d


def default_out(name: str) -> Path:
    return Path("runs") / "train" / name


def run(recipe: str, out: str | Path | None = None, *, device: str = "auto", steps: int | None = None,
        compile: bool | None = None, pallas: bool = False, kernels: str = "auto", resume: bool = False,
        seed: int | None = None, nproc: int = 1, overrides: dict[str, Any] | None = None,
        hooks: Iterable = (), progress: bool | None = None) -> dict:
    """Trains `recipe` into `out` and returns the held-out figures (also in out/eval.json).

    hooks: callables `hook(step, row)` run after every step in this process (not
    forwarded to the processes `nproc > 1` launches). progress: the rich progress bar
    (None: when stderr is a terminal).
    """
    ov = dict(overrides or {})
    if steps is not None:
        ov["loop.steps"] = steps
    if seed is not None:
        ov["seed"] = seed
    if compile is not None:
        ov["loop.compile"] = compile
    name, r = load_recipe(recipe, ov)
    out = Path(out) if out is not None else default_out(name)
    if kernels not in KERNELS:
        raise UserError(f"unknown kernels {kernels!r}; valid: {', '.join(KERNELS)}")
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    world = int(os.environ["WORLD_SIZE"]) if distributed.under_torchrun() else nproc
    if r.loop.batch_size % world:
        raise UserError(f"loop.batch_size ({r.loop.batch_size}) must be divisible by the number of processes ({world})")
    from .. import select_device

    platform = select_device(device)
    config = fingerprint(r)
    ckpt = Checkpointer(out)
    if resume:
        ckpt.load(config)  # refuses a missing, corrupt or foreign checkpoint before anything is written
    elif ckpt.exists() or (out / "model.pt").exists():
        raise UserError(f"{out} already holds a training run; pass --resume to continue it, or choose another --out")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a folder")

    if nproc > 1 and not distributed.under_torchrun():
        if list(hooks):
            raise UserError("hooks run in this process only; they cannot follow nproc > 1 (use torchrun directly)")
        distributed.launch(nproc, {"recipe": recipe, "out": str(out), "device": device, "steps": steps,
                                   "compile": compile, "pallas": pallas, "kernels": kernels, "resume": resume,
                                   "seed": seed, "nproc": nproc, "overrides": overrides, "progress": progress})
        import json

        return json.loads((out / "eval.json").read_text())

    from .loop import train
    from .tasks import get_task

    task = get_task(r, name)
    kernels_note, model_hook = _kernels(kernels, r.task)
    dist = distributed.init(platform)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return train(task, r, platform=platform, device=distributed.device_for(platform, dist), out=out,
                     config=config, resume=resume, use_compile=r.loop.compile, pallas=pallas,
                     kernels_note=kernels_note, dist=dist, hooks=hooks, model_hook=model_hook, progress=progress)
    finally:
        distributed.shutdown()


def _kernels(impl: str, task: str):
    """(what the run used, a function that applies it to the model or None)."""
    if task != "arith_lm":
        return "n/a (no Llama modules)", None
    if impl == "torch":
        return "torch", None
    try:
        from ..kernels import use_kernels
    except ImportError:
        use_kernels = None
    if use_kernels is None:
        if impl == "pallas":
            raise NotBuiltError("--kernels pallas: tpu_pipeline.kernels.use_kernels is not built yet")
        return "torch (tpu_pipeline.kernels not built yet)", None
    return impl, lambda model: use_kernels(model, impl)
