"""`tpu_pipeline.train.run`: one call from a recipe name to a trained run folder.

Everything that can be refused is checked before anything is written or
any process is launched: the recipe and its values, the device, the
kernels choice, and on --resume the checkpoint (checksum, format, config).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import tpu_pipeline
from tpu_pipeline.checkpoint import Checkpointer
from tpu_pipeline.errors import UserError
from tpu_pipeline.kernels import use_kernels
from tpu_pipeline.library_noise import quieted
from tpu_pipeline.recipes import find_recipe
from tpu_pipeline.train import distributed
from tpu_pipeline.train.loop import train
from tpu_pipeline.train.recipe import Recipe, fingerprint, load, validate
from tpu_pipeline.train.tasks import TASKS
from tpu_pipeline.train.tasks.base import Task
from tpu_pipeline.training import Hook

# --kernels: "pallas" is our hand-written Pallas kernels (tpu_pipeline.kernels),
# not Inductor's Pallas code generator (--inductor-pallas).
KERNELS = ("auto", "pallas", "torch")


def load_recipe(recipe: str, overrides: dict[str, Any] | None = None) -> tuple[str, Recipe]:
    path = find_recipe("train", recipe)
    return path.stem, validate(load(path, overrides), str(path))


def get_task(recipe: Recipe, recipe_name: str) -> Task:
    return TASKS.get(recipe.task)(recipe.settings, seed=recipe.seed, recipe_name=recipe_name)


def default_out(name: str) -> Path:
    return Path("runs") / "train" / name


@quieted()  # the libraries' chatter off while it runs (tpu_pipeline/library_noise.py)
def run(recipe: str, out: str | Path | None = None, *, device: str = "auto", steps: int | None = None,
        compile: bool | None = None, inductor_pallas: bool = False, kernels: str = "auto", resume: bool = False,
        seed: int | None = None, nproc: int = 1, overrides: dict[str, Any] | None = None,
        hooks: Iterable[Hook] = (), progress: bool | None = None) -> dict:
    """Trains `recipe` into `out` and returns the held-out figures (also in out/eval.json).

    inductor_pallas: compile with Inductor's Pallas code generator (implies compile).
    kernels: attention/RMSNorm of Llama models: "pallas" (tpu_pipeline.kernels'
    hand-written Pallas kernels), "torch", or "auto".
    hooks: `hook(step, row)` (tpu_pipeline.training.Hook) run after every step in this
    process (not forwarded to the processes `nproc > 1` launches). progress: the rich
    progress bar (None: when stderr is a terminal).
    Raises DivergedError when the loss or gradients become NaN/inf.
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
    platform = tpu_pipeline.select_device(device)
    config = fingerprint(r)
    ckpt = Checkpointer(out, resume_hint="resume with the same recipe, --steps and --seed, or use another --out")
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
                                   "compile": compile, "inductor_pallas": inductor_pallas, "kernels": kernels,
                                   "resume": resume, "seed": seed, "nproc": nproc, "overrides": overrides,
                                   "progress": progress})
        return json.loads((out / "eval.json").read_text())

    task = get_task(r, name)
    kernels_note, model_hook = _kernels(kernels, r.task)
    dist = distributed.init(platform)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return train(task, r, platform=platform, device=distributed.device_for(platform, dist), out=out,
                     config=config, resume=resume, use_compile=r.loop.compile, inductor_pallas=inductor_pallas,
                     kernels_note=kernels_note, dist=dist, hooks=hooks, model_hook=model_hook, progress=progress)
    finally:
        distributed.shutdown()


def _kernels(impl: str, task: str):
    """(what the run used, a function that applies it to the model or None)."""
    if not TASKS.get(task).uses_kernels:
        return "n/a (no Llama modules)", None
    if impl == "torch":
        return "torch", None
    return impl, lambda model: use_kernels(model, impl)
