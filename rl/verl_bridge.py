"""`--engine verl`: the same recipe as a run of VeRL's Ray trainer.

    tpu-pipeline rl --recipe grpo_math --engine verl --dry-run
    tpu-pipeline rl --recipe grpo_math --engine verl --ray-address http://head:8265

What it does: writes the recipe's data as VeRL parquet (DIR/verl/train.parquet,
val.parquet), resolves the policy path (the cached warm start, or
policy.path), points VeRL's custom reward at the recipe's reward function
(`pkg://module`, so the same function scores both engines), maps every recipe
field to its hydra override, composes the result against VeRL's own
ppo_trainer.yaml (so an override VeRL does not know fails here, not on the
cluster), and launches `python -m verl.trainer.main_ppo` (or `ray job submit`).

VeRL's trainer needs accelerators: without a GPU/NPU/TPU here and without a
Ray address, a real launch stops with exit 2 before Ray starts.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tpu_pipeline._tpu_guard import tpu_hardware_present
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_text
from tpu_pipeline.rl.algo import resolve
from tpu_pipeline.rl.data import build_source
from tpu_pipeline.rl.policy import home, warm_start, warm_start_key, warm_start_overrides
from tpu_pipeline.rl.recipe import RLConfig
from tpu_pipeline.rl.rewards import reward_location
from tpu_pipeline.train.tasks.rows import write_parquet

VERL_ENTRY = ["-m", "verl.trainer.main_ppo"]


def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("--engine verl: verl is not installed (pip install verl==0.9.1)")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


def _b(v: bool) -> str:
    return "True" if v else "False"


def hydra_overrides(cfg: RLConfig, *, train_file: Path, val_file: Path, policy_path: str, out: Path,
                    device: str = "cuda") -> list[str]:
    """Recipe fields -> VeRL hydra overrides (key=value), one to one."""
    alg, t, d, r, o, v = cfg.algorithm, cfg.trainer, cfg.data, cfg.rollout, cfg.optim, cfg.verl
    a = resolve(alg)
    mod, fn = reward_location(t.reward)
    mini = max(1, t.prompts_per_step // t.minibatches)
    micro = t.micro_batch_size or max(1, min(mini * r.n, 64))  # rows per forward/backward, as locally
    ov = [
        f"algorithm.adv_estimator={a['adv_estimator']}",
        f"algorithm.norm_adv_by_std_in_grpo={_b(a['norm_adv_by_std_in_grpo'])}",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train_file}",
        f"data.val_files={val_file}",
        f"data.train_batch_size={t.prompts_per_step}",
        f"data.max_prompt_length={d.max_prompt_length}",
        f"data.max_response_length={d.max_response_length}",
        f"data.truncation={'error' if d.overlong_prompt == 'refuse' else 'left'}",
        f"data.seed={t.seed}",
        f"actor_rollout_ref.model.path={policy_path}",
        f"actor_rollout_ref.actor.strategy={v.strategy}",
        f"actor_rollout_ref.actor.optim.lr={o.lr}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={o.warmup_steps}",
        f"actor_rollout_ref.actor.optim.weight_decay={o.weight_decay}",
        f"actor_rollout_ref.actor.grad_clip={o.grad_clip}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.ppo_epochs={t.ppo_epochs}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={alg.policy_loss}",
        f"actor_rollout_ref.actor.loss_agg_mode={a['loss_agg_mode']}",
        f"actor_rollout_ref.actor.clip_ratio_low={alg.clip_ratio_low}",
        f"actor_rollout_ref.actor.clip_ratio_high={alg.clip_ratio_high}",
        f"actor_rollout_ref.actor.clip_ratio_c={alg.clip_ratio_c}",
        f"actor_rollout_ref.actor.use_kl_loss={_b(alg.use_kl_loss)}",
        f"actor_rollout_ref.actor.kl_loss_coef={alg.kl_loss_coef}",
        f"actor_rollout_ref.actor.kl_loss_type={alg.kl_loss_type}",
        f"actor_rollout_ref.rollout.name={v.rollout_name}",
        f"actor_rollout_ref.rollout.n={r.n}",
        f"actor_rollout_ref.rollout.temperature={r.temperature}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"reward.custom_reward_function.path=pkg://{mod}",
        f"reward.custom_reward_function.name={fn}",
        f"trainer.n_gpus_per_node={v.n_gpus_per_node}",
        f"trainer.nnodes={v.nnodes}",
        f"trainer.device={device}",
        f"trainer.total_training_steps={t.steps}",
        f"trainer.save_freq={t.save_every or -1}",
        f"trainer.test_freq={t.eval_every or -1}",
        f"trainer.default_local_dir={out / 'verl' / 'checkpoints'}",
        "trainer.logger=[console,tensorboard]",
        "trainer.project_name=tpu-pipeline",
        f"trainer.experiment_name={cfg.name}",
    ]
    if cfg.policy.lora_rank:
        p = cfg.policy
        ov += [f"actor_rollout_ref.model.lora_rank={p.lora_rank}",
               f"actor_rollout_ref.model.lora_alpha={p.lora_alpha or 2 * p.lora_rank}",
               f"actor_rollout_ref.model.target_modules={p.lora_target_modules}"]
    if device == "tpu":
        # VeRL imports external_lib in every worker: that registers our TorchTPU platform there.
        ov.append("actor_rollout_ref.model.external_lib=tpu_pipeline.rl.tpu_platform")
    return ov + list(v.extra_overrides)


def compose(overrides: list[str]):
    """VeRL's ppo_trainer.yaml with `overrides`, composed by hydra (no GPU needed)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
            return hydra_compose(config_name="ppo_trainer", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(f"--engine verl: VeRL's config rejects the overrides ({str(e).splitlines()[0]})") from None
    finally:
        GlobalHydra.instance().clear()


def accelerator_here() -> str | None:
    """The accelerator VeRL could use on this machine: 'cuda', 'npu', 'tpu' or None."""
    if torch.cuda.is_available() and torch.cuda.device_count():
        return "cuda"
    if importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    if importlib.util.find_spec("torch_tpu") is not None and tpu_hardware_present():
        return "tpu"
    return None


def command(overrides: list[str], ray_address: str | None) -> list[str]:
    if ray_address:
        return ["ray", "job", "submit", "--address", ray_address, "--", "python", *VERL_ENTRY, *overrides]
    return [sys.executable, *VERL_ENTRY, *overrides]


def prepare(cfg: RLConfig, out: Path, *, log: Callable[[str], None], device: str) -> tuple[list[str], Path]:
    """Writes DIR/verl/{train,val}.parquet and returns (overrides, policy path)."""
    source = build_source(cfg.data, cfg.trainer.seed)
    vdir = out / "verl"
    n_train = max(cfg.trainer.prompts_per_step * min(cfg.trainer.steps, 1000), cfg.trainer.prompts_per_step)
    if hasattr(source, "_train"):  # a parquet file: its own training rows
        train_rows = source._train
    else:
        train_rows = [p for s in range(max(1, n_train // cfg.trainer.prompts_per_step))
                      for p in source.train_batch(s, cfg.trainer.prompts_per_step, cfg.trainer.seed)]
    train_file = write_parquet(train_rows, vdir / "train.parquet", "train")
    val_file = write_parquet(source.heldout(), vdir / "val.parquet", "test")
    if cfg.policy.path:
        policy_path = str(Path(cfg.policy.path).resolve())
    else:
        ws_ov = warm_start_overrides(cfg)
        cached = home() / "warm_start" / warm_start_key(cfg.policy.warm_start, ws_ov) / "hf"
        if not (cached / "config.json").is_file() and accelerator_here() is not None:
            warm_start(cfg.policy.warm_start, ws_ov, log=log)
        policy_path = str(cached)
    ov = hydra_overrides(cfg, train_file=train_file.resolve(), val_file=val_file.resolve(), policy_path=policy_path,
                         out=out.resolve(), device=device)
    return ov, Path(policy_path)


def launch(cfg: RLConfig, out: Path, *, dry_run: bool, ray_address: str | None, log: Callable[[str], None]) -> dict:
    accel = accelerator_here()
    device = accel or ("cuda" if cfg.trainer.device in ("auto", "cpu") else cfg.trainer.device)
    if cfg.trainer.device in ("cuda", "tpu", "npu"):
        device = cfg.trainer.device
    if not dry_run and not ray_address and accel is None:
        raise UserError("--engine verl: VeRL's Ray trainer needs a GPU, NPU or TPU and none is visible here; "
                        "pass --ray-address (or RAY_ADDRESS) for a cluster, use --dry-run to see the command, "
                        "or run the local engine (--engine local)")
    ov, policy_path = prepare(cfg, out, log=log, device=device)
    composed = compose(ov)
    yaml = OmegaConf.to_yaml(composed)
    atomic_write_text(out / "verl" / "ppo_trainer.yaml", yaml)
    cmd = command(ov, ray_address)
    result = {"engine": "verl", "command": shlex.join(cmd), "config": str(out / "verl" / "ppo_trainer.yaml"),
              "overrides": ov, "policy": str(policy_path), "dry_run": dry_run}
    if dry_run:
        log(yaml)
        return result
    if not Path(policy_path, "config.json").is_file():
        raise UserError(f"--engine verl: policy {policy_path} does not exist yet; run the local engine once to "
                        "train the warm start, or set policy.path")
    env = dict(os.environ)
    if device == "tpu":
        env["VERL_PLATFORM"] = "tpu"
    log(f"launching: {result['command']}")
    proc = subprocess.run(cmd, env=env)
    result["returncode"] = proc.returncode
    if proc.returncode != 0:
        raise UserError(f"--engine verl: VeRL exited with code {proc.returncode} (its log is above)")
    return result
