"""Typed configuration of an RL run, filled from a recipe TOML (rl/recipes/*.toml).

Field names follow VeRL's hydra config where a VeRL key exists (adv_estimator,
loss_agg_mode, clip_ratio_*, use_kl_loss, kl_loss_coef, kl_loss_type, n), so
`--engine verl` maps them one to one (see verl_bridge.hydra_overrides).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Literal

from tpu_pipeline import config as _config
from tpu_pipeline.errors import UserError
from tpu_pipeline.recipes import find_recipe
from tpu_pipeline.train.tasks import TASK_SOURCES


@dataclasses.dataclass(kw_only=True)
class PolicyConfig:
    warm_start: str = ""  # a train recipe whose hf/ is the starting policy ("": policy.path is required)
    warm_start_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    path: str = ""
    carry_optimizer_state: bool = True
    require_chat_template: bool = False  # refuse a policy whose tokenizer has none (chat-message recipes)
    lora_rank: int = 0  # > 0: train LoRA adapters only (rl/lora.py), merged into policy/ at the end
    lora_alpha: float = 0.0  # 0 = 2 * lora_rank
    lora_target_modules: str = "all-linear"  # peft target_modules: "all-linear" or comma-separated names


@dataclasses.dataclass(kw_only=True)
class DataConfig:
    source: str = ""  # a registered rl task source (tpu_pipeline.train.tasks.TASK_SOURCES); "" with `file`
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # typed by the source's Options
    difficulty: dict[str, Any] = dataclasses.field(default_factory=dict)  # typed by the source's Difficulty
    file: str = ""
    heldout_n: int = 1000
    max_prompt_length: int = 32
    max_response_length: int = 12
    overlong_prompt: Literal["truncate", "refuse"] = "refuse"


@dataclasses.dataclass(kw_only=True)
class RolloutConfig:
    n: int = 8
    temperature: float = 1.0


@dataclasses.dataclass(kw_only=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling (VeRL algorithm.filter_groups): keep only groups whose
    verifier scores differ, sampling more prompts until the batch is full."""
    enable: bool = False
    max_num_gen_batches: int = 3  # generation rounds per step at most (the first included)


@dataclasses.dataclass(kw_only=True)
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (VeRL reward_model.overlong_buffer, DAPORewardManager)."""
    enable: bool = False
    len: int = 4  # the last `len` tokens before data.max_response_length are the buffer
    penalty_factor: float = 1.0  # penalty at max_response_length (linear from 0 at the buffer's start)


@dataclasses.dataclass(kw_only=True)
class AlgorithmConfig:
    adv_estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    policy_loss: str = "vanilla"
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    drop_uniform_groups: bool = True
    filter_groups: FilterGroupsConfig = dataclasses.field(default_factory=FilterGroupsConfig)
    overlong_buffer: OverlongBufferConfig = dataclasses.field(default_factory=OverlongBufferConfig)


@dataclasses.dataclass(kw_only=True)
class OptimConfig:
    lr: float = 3e-5
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0


@dataclasses.dataclass(kw_only=True)
class TrainerConfig:
    steps: int = 1000
    time_budget_s: float = 0.0
    prompts_per_step: int = 64
    ppo_epochs: int = 1
    minibatches: int = 1
    seed: int = 0
    save_every: int = 25
    keep_checkpoints: int = 2
    eval_every: int = 25
    eval_k: int = 8
    eval_temperature: float = 1.0
    reward: str = "verl_default"  # a registered reward (tpu_pipeline.train.tasks.REWARDS) or module:function
    reward_timeout_s: float = 5.0
    max_nan_steps: int = 3
    track_kl: bool = True
    device: str = "auto"
    kernels: Literal["auto", "pallas", "torch"] = "auto"
    threads: int = 0
    precision: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 elsewhere
    micro_batch_size: int = 0  # rows per forward/backward, gradients accumulated (0 = whole minibatch)


@dataclasses.dataclass(kw_only=True)
class VerlConfig:
    n_gpus_per_node: int = 1
    nnodes: int = 1
    rollout_name: str = "vllm"
    strategy: str = "fsdp"
    extra_overrides: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(kw_only=True)
class RLConfig:
    description: str = ""
    expected_minutes_cpu: float = 0.0  # default run's wall minutes on 2 CPU cores (tpu-pipeline recipes; 0: not measured)
    expected_minutes_gpu: float = 0.0  # the same on one GPU (0: not measured)
    name: str = ""
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = dataclasses.field(default_factory=AlgorithmConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    verl: VerlConfig = dataclasses.field(default_factory=VerlConfig)


def load_recipe(recipe: str | Path, overrides: dict[str, Any] | None = None) -> RLConfig:
    """A shipped rl recipe by name (or a path to a TOML copy) with dotted overrides."""
    path = find_recipe("rl", str(recipe))
    try:
        cfg = _config.load(RLConfig, path, overrides)
    except UserError as e:
        if "data: unknown key 'tasks'" in str(e) or "data: unknown key 'pool_size'" in str(e):
            # a recipe copied before the tasks layer (issue 18) kept its task list in [data]
            raise UserError(f"{e} ([data] now names its task source, data.source = one of "
                            f"{', '.join(TASK_SOURCES.names())}, and moves the source's keys into "
                            f"data.options; compare with the shipped recipe it was copied from)") from None
        raise
    if not cfg.name:
        cfg.name = path.stem
    return cfg


def to_dict(cfg: RLConfig) -> dict:
    return _config.to_dict(cfg)


# Fields a resumed run may change: how long it runs, how often it saves, logs and
# evaluates, and where it runs. Everything else shapes the steps and must match.
_RESUMABLE = {"trainer": ("steps", "time_budget_s", "save_every", "keep_checkpoints", "eval_every", "device",
                          "threads")}


RESUME_HINT = ("resume with the same recipe, --set overrides, --seed and --policy (only --steps, "
               "--time-budget and logging may change), or use another --out")


def fingerprint(cfg: RLConfig | dict) -> dict:
    """What a checkpoint must agree with to be resumed (tpu_pipeline.checkpoint compares it); of a
    config or of its to_dict form (a run folder's config.json)."""
    d = copy.deepcopy(cfg) if isinstance(cfg, dict) else to_dict(cfg)
    for k in ("description", "expected_minutes_cpu", "expected_minutes_gpu", "verl"):
        d.pop(k, None)
    for section, keys in _RESUMABLE.items():
        for k in keys:
            d[section].pop(k, None)
    return d
