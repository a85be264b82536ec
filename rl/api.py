"""Library entry points behind `tpu-pipeline rl` and `tpu-pipeline eval`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import tpu_pipeline
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json
from tpu_pipeline.kernels import use_kernels
from tpu_pipeline.library_noise import quieted
from tpu_pipeline.metrics import MetricsWriter
from tpu_pipeline.rl import algo, dapo
from tpu_pipeline.rl.accel import compute_dtype
from tpu_pipeline.rl.recipe import RLConfig, fingerprint, load_recipe, to_dict
from tpu_pipeline.rl.curve import plot_curve
from tpu_pipeline.rl.data import build_source
from tpu_pipeline.rl.engine import Engine, make_reference, set_threads, write_eval
from tpu_pipeline.rl.evaluate import evaluate
from tpu_pipeline.rl.lora import AdaptersOff, add_lora
from tpu_pipeline.rl.policy import (build_optimizer, check_policy_files, load_policy, save_policy, warm_start,
                                    warm_start_overrides, warm_start_recipe)
from tpu_pipeline.rl.rewards import GuardedReward, load_reward
from tpu_pipeline.rl.task_eval import Generate, TaskEval, wilson, write_record
from tpu_pipeline.train.tasks import TASK_SOURCES
from tpu_pipeline.train.tasks.base import TaskSource
from tpu_pipeline.training import Hook

ENGINES = ("local", "verl")

# (label, row key, format) shown beside rl's progress bar.
BAR_FIELDS = (("reward", "reward", "{:.3f}"), ("acc", "accuracy", "{:.3f}"), ("kl", "kl", "{:.4f}"),
              ("len", "response_length", "{:.1f}"), ("s/step", "step_seconds", "{:.2f}"),
              ("heldout", "heldout_accuracy", "{:.3f}"))


def _log_default(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def validate(cfg: RLConfig) -> None:
    t, r, d = cfg.trainer, cfg.rollout, cfg.data
    checks = [
        (r.n >= 2, f"rollout.n must be >= 2 for group-relative advantages, got {r.n}"),
        (r.temperature > 0, f"rollout.temperature must be > 0, got {r.temperature}"),
        (t.prompts_per_step >= 1, f"trainer.prompts_per_step must be >= 1, got {t.prompts_per_step}"),
        (t.ppo_epochs >= 1 and t.minibatches >= 1, "trainer.ppo_epochs and trainer.minibatches must be >= 1"),
        (t.steps >= 0, f"trainer.steps must be >= 0, got {t.steps}"),
        (cfg.optim.lr > 0, f"optim.lr must be > 0, got {cfg.optim.lr}"),
        (d.max_prompt_length >= 2 and d.max_response_length >= 1, "data.max_prompt_length >= 2 and max_response_length >= 1"),
        (t.max_nan_steps >= 1, "trainer.max_nan_steps must be >= 1"),
        (t.reward_timeout_s > 0, "trainer.reward_timeout_s must be > 0"),
        (t.micro_batch_size >= 0, f"trainer.micro_batch_size must be >= 0, got {t.micro_batch_size}"),
        (cfg.policy.lora_rank >= 0, f"policy.lora_rank must be >= 0, got {cfg.policy.lora_rank}"),
        (bool(cfg.policy.path or cfg.policy.warm_start),
         "needs a policy: pass --policy DIR (a Hugging Face causal LM folder)"),
    ]
    for ok, msg in checks:
        if not ok:
            raise UserError(f"recipe {cfg.name}: {msg}")
    if not d.file:
        if not d.source:
            raise UserError(f"recipe {cfg.name}: set data.source (a task source: {', '.join(TASK_SOURCES.names())}) "
                            "or data.file (--data FILE.parquet)")
        source = TASK_SOURCES.get(d.source)
        try:
            source.Difficulty.from_dict(d.difficulty)
        except UserError as e:
            raise UserError(f"recipe {cfg.name}: data.difficulty: {e}") from None
        source.options(d)
    algo.check(cfg.algorithm)
    dapo.check(cfg)


def prepare_config(recipe: str, *, steps: int | None = None, time_budget_s: float | None = None, seed: int | None = None,
                   data: str | None = None, reward: str | None = None, kernels: str | None = None,
                   device: str | None = None, policy: str | None = None, lora_rank: int | None = None,
                   overrides: dict[str, Any] | None = None) -> RLConfig:
    ov = dict(overrides or {})
    for key, val in (("trainer.steps", steps), ("trainer.time_budget_s", time_budget_s), ("trainer.seed", seed),
                     ("data.file", data), ("trainer.reward", reward), ("trainer.kernels", kernels),
                     ("trainer.device", device), ("policy.path", policy), ("policy.lora_rank", lora_rank)):
        if val is not None:
            ov[key] = val
    if steps is not None and time_budget_s is None:
        ov["trainer.time_budget_s"] = 0.0  # an explicit --steps runs exactly that many steps
    cfg = load_recipe(recipe, ov)
    validate(cfg)
    return cfg


def _policy_and_optimizer(cfg: RLConfig, platform, log):
    """(model, tokenizer, optimizer, facts, Lora or None); with LoRA the model is the
    adapted one and the optimizer holds only the adapter weights."""
    lora = cfg.policy.lora_rank > 0
    if cfg.policy.path:
        path = Path(cfg.policy.path)
        check_policy_files(path, need_chat_template=cfg.policy.require_chat_template)
        info = {"path": str(path), "cached": None, "seconds": 0.0}
        carry = path.parent / "optimizer.pt" if cfg.policy.carry_optimizer_state and not lora else None
    else:
        folder, info = warm_start(cfg.policy.warm_start, warm_start_overrides(cfg), device=cfg.trainer.device,
                                  kernels=cfg.trainer.kernels, log=log)
        path = folder / "hf"
        carry = folder / "optimizer.pt" if cfg.policy.carry_optimizer_state and not lora else None
    # LoRA on a bf16 device: the frozen base is held in bf16 (half the memory; autocast
    # computes in bf16 anyway); the trained adapters and their AdamW state stay fp32.
    base_dtype = compute_dtype(cfg.trainer.precision, platform.device) if lora else torch.float32
    model, tok = load_policy(path, platform.device, dtype=base_dtype)
    kernels = cfg.trainer.kernels
    if kernels == "pallas" or (kernels == "auto" and platform.kind != "cpu"):
        # RMSNorm and attention through tpu_pipeline.kernels; on CPU "auto" keeps the plain
        # model (Pallas only runs interpreted there, a correctness tool, not a fast path).
        use_kernels(model, kernels)
    adapted = None
    if lora:
        adapted = add_lora(model, rank=cfg.policy.lora_rank, alpha=cfg.policy.lora_alpha,
                           target_modules=cfg.policy.lora_target_modules, seed=cfg.trainer.seed)
        model = adapted.model
        info["lora_trainable_parameters"] = adapted.trainable_parameters()
    opt, carried = build_optimizer(model, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay,
                                   carry_from=carry if carry and carry.is_file() else None)
    info["optimizer_state_carried"] = carried
    return model, tok, opt, info, adapted


@quieted()  # the libraries' chatter off while it runs (tpu_pipeline/library_noise.py)
def run(recipe: str = "grpo_math", out: str | Path | None = None, *, engine: str = "local", steps: int | None = None,
        time_budget_s: float | None = None, seed: int | None = None, data: str | None = None,
        reward: str | None = None, kernels: str | None = None, device: str | None = None,
        policy: str | None = None, resume: bool = False, overrides: dict[str, Any] | None = None,
        hooks: Sequence[Hook] = (), progress: bool = True, log: Callable[[str], None] | None = None,
        dry_run: bool = False, ray_address: str | None = None, lora_rank: int | None = None) -> dict:
    """Runs an rl recipe; returns the eval figures (DIR/eval.json).

    hooks: `hook(step, row)` after every RL step (tpu_pipeline.training.Hook, as in train).
    resume: continue DIR from its latest checkpoint; refused (UserError) when the
    checkpoint is missing, corrupt or from a different config.
    Raises DivergedError when the loss stays NaN/inf for trainer.max_nan_steps steps.
    """
    log = log or _log_default
    if engine not in ENGINES:
        raise UserError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    t_wall = time.time()
    cfg = prepare_config(recipe, steps=steps, time_budget_s=time_budget_s, seed=seed, data=data, reward=reward,
                         kernels=kernels, device=device, policy=policy, lora_rank=lora_rank, overrides=overrides)
    out = Path(out) if out else Path("runs") / cfg.name
    if engine == "verl":
        # heavy: the bridge composes VeRL's hydra config (hydra, omegaconf, verl)
        from tpu_pipeline.rl.verl_bridge import launch

        if cfg.policy.path:
            check_policy_files(cfg.policy.path, need_chat_template=cfg.policy.require_chat_template)
        return launch(cfg, out, dry_run=dry_run, ray_address=ray_address, log=log, resume=resume)
    if dry_run:
        raise UserError("--dry-run applies to --engine verl (it prints the VeRL command and config)")
    return _run_local(cfg, out, resume=resume, hooks=hooks, progress=progress, log=log, t_wall=t_wall)


def _run_local(cfg: RLConfig, out: Path, *, resume: bool, hooks, progress: bool, log, t_wall: float) -> dict:
    threads = set_threads(cfg.trainer.threads)
    platform = tpu_pipeline.select_device(cfg.trainer.device)
    ckpt = Engine.checkpointer_for(cfg, out)
    # Refuses a missing, corrupt or foreign checkpoint before anything is written.
    state = ckpt.load(fingerprint(cfg)) if resume else None
    if not resume and ((out / "metrics.jsonl").exists() or ckpt.exists()):
        raise UserError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    source = build_source(cfg.data, cfg.trainer.seed)
    heldout = source.heldout()
    reward_fn = load_reward(cfg.trainer.reward)
    model, tok, opt, ws_info, lora = _policy_and_optimizer(cfg, platform, log)
    out.mkdir(parents=True, exist_ok=True)
    if state is None:  # a resumed run keeps the config.json it started with (the checkpoint matched it)
        atomic_write_json(out / "config.json", to_dict(cfg))
    guard = GuardedReward(reward_fn, cfg.trainer.reward_timeout_s)
    ref = None
    if cfg.algorithm.use_kl_loss or cfg.trainer.track_kl:
        # LoRA: the reference is the policy with its adapters off (no second copy of the weights).
        ref = AdaptersOff(lora) if lora else make_reference(model)
    eng = Engine(cfg=cfg, model=model, tokenizer=tok, optimizer=opt, source=source, reward=guard, out=out,
                 device=platform.device, hooks=list(hooks), ref_model=ref, checkpoint_trainable_only=lora is not None)
    before_path = out / "eval_before.json"
    if state is not None:
        before = json.loads(before_path.read_text())
        eng.restore(state)
        log(f"resumed from {eng.checkpointer.dir} (step {eng.step})")
    else:
        log(f"evaluating the starting policy on {len(heldout)} held-out problems")
        before = {**eng.evaluate(heldout, k=cfg.trainer.eval_k), "policy": ws_info["path"]}
        unseen = _unseen_problems(cfg, source)
        if unseen:
            before["unseen_accuracy"] = eng.evaluate(unseen)["accuracy"]
        atomic_write_json(before_path, before)
    mlog = MetricsWriter(out, total_steps=cfg.trainer.steps, start_step=eng.step, progress=progress,
                         description="rl", tb_prefix="rl", fields=BAR_FIELDS, lines=False)
    try:
        with torch.random.fork_rng(devices=[]):
            eng.train(steps=cfg.trainer.steps, time_budget_s=cfg.trainer.time_budget_s, log=mlog, heldout=heldout)
    finally:
        mlog.close()
        guard.close()
    if cfg.trainer.save_every and eng.step % cfg.trainer.save_every:
        eng.save_checkpoint()
    after = {**eng.evaluate(heldout, k=cfg.trainer.eval_k), "policy": str(out / "policy")}
    # LoRA adapters are folded into plain weights: policy/ loads without peft (and converts).
    save_policy(lora.merged() if lora else model, tok, out / "policy",
                extra=lambda stage: write_record(cfg, stage, engine="local"))
    unseen = _unseen_by_warm_start(cfg, eng, source, before)
    evals = {
        "before": before, "after": after,
        **({"unseen_by_warm_start": unseen} if unseen else {}),
        "gain_points": round(100 * (after["accuracy"] - before["accuracy"]), 2),
        "steps": eng.step, "rl_seconds": round(eng.elapsed, 2),
        "warm_start": ws_info, "wall_seconds": round(time.time() - t_wall, 2),
        "totals": eng.totals, "recipe": cfg.name, "device": str(platform.device), "threads": threads,
    }
    write_eval(out, evals)
    try:
        evals["curve"] = str(plot_curve(out, evals))
    except Exception as e:  # a plotting failure must not lose a finished run
        log(f"warning: learning-curve plot failed ({type(e).__name__}: {e})")
    write_eval(out, evals)
    return evals


def _unseen_problems(cfg: RLConfig, source) -> list:
    """Held-out problems the warm start never trained on either (TaskSource.unseen); [] when
    the policy came by path, the data from a file, or the source has no such split."""
    ws = warm_start_recipe(cfg)
    if ws is None or not isinstance(source, TaskSource):
        return []
    return source.unseen(cfg.data.heldout_n, ws)


def _unseen_by_warm_start(cfg: RLConfig, eng, source, before: dict) -> dict | None:
    """Greedy accuracy, before and after RL, on held-out prompts the warm start never saw
    either: reported beside the main split."""
    problems = _unseen_problems(cfg, source)
    if not problems:
        return None
    after = eng.evaluate(problems)["accuracy"]
    if "unseen_accuracy" not in before:  # the starting policy's figure, kept from the first run
        return {"after": after, "n": len(problems), "distinct_prompts": len({p.prompt for p in problems})}
    return {"before": before["unseen_accuracy"], "after": after, "n": len(problems),
            "distinct_prompts": len({p.prompt for p in problems})}


@quieted()  # the libraries' chatter off while it runs (tpu_pipeline/library_noise.py)
def evaluate_policy(recipe: str, policy: str | Path, *, seed: int | None = None, n: int | None = None,
                    k: int | None = None, data: str | None = None, device: str | None = None) -> dict:
    """Accuracy of any policy folder on held-out problems (or fresh ones for `seed`)."""
    ov: dict[str, Any] = {}
    if n is not None:
        if n < 1:
            raise UserError(f"--n must be >= 1, got {n}")
        ov["data.heldout_n"] = n
    cfg = prepare_config(recipe, data=data, device=device, policy=str(policy), overrides=ov)
    platform = tpu_pipeline.select_device(cfg.trainer.device)
    source = build_source(cfg.data, cfg.trainer.seed)
    if seed is None:
        problems, split = source.heldout(), "heldout"
    else:
        problems, split = source.fresh(cfg.data.heldout_n, seed), f"fresh(seed={seed})"
    check_policy_files(policy, need_chat_template=cfg.policy.require_chat_template)
    model, tok = load_policy(policy, platform.device)
    guard = GuardedReward(load_reward(cfg.trainer.reward), cfg.trainer.reward_timeout_s)
    try:
        res = evaluate(model, tok, problems, lambda items: guard(items).scores, max_prompt_length=cfg.data.max_prompt_length,
                       max_response_length=cfg.data.max_response_length, overlong=cfg.data.overlong_prompt,
                       k=cfg.trainer.eval_k if k is None else k, temperature=cfg.trainer.eval_temperature,
                       precision=cfg.trainer.precision)
    finally:
        guard.close()
    return {"policy": str(policy), "split": split, **res, "interval": wilson(res["correct"], res["n"])}


def evaluate_generator(recipe: str, generate: Generate, *, label: str, seed: int | None = None,
                       n: int | None = None, k: int | None = None, data: str | None = None) -> dict:
    """Greedy accuracy of any text generator (`generate(prompt_text, max_new_tokens) -> text`: a
    .litertlm bundle on LiteRT-LM, handed in by the CLI) on the same held-out problems, prompt text,
    response limit and verifier as evaluate_policy scores a PyTorch policy with."""
    if k:
        raise UserError(f"--k {k}: {label} is scored greedy only (pass@k samples at a temperature, and a "
                        "bundle samples with its own sampler); pass --k 0")
    ov: dict[str, Any] = {}
    if n is not None:
        if n < 1:
            raise UserError(f"--n must be >= 1, got {n}")
        ov["data.heldout_n"] = n
    cfg = prepare_config(recipe, data=data, policy=label, overrides=ov)
    task = TaskEval(cfg, seed=seed)
    res = task.generator_accuracy(generate)
    res.pop("responses")
    return {"policy": label, "split": task.split, **res}
