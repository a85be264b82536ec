"""--engine verl: the recipe composes against VeRL's own ppo_trainer.yaml (with
hydra, on CPU); options VeRL cannot express and a CPU host without the verl-cpu
extra stop early, exit 2. The real launch: test_verl_launch_on_cpu.py."""

from __future__ import annotations

import json
import sys
import time

import pytest
from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import UserError

from .conftest import SMALL


@pytest.fixture(scope="module")
def dry(tmp_path_factory, tiny_policy):
    from tpu_pipeline.rl import run

    out = tmp_path_factory.mktemp("verl")
    ov = {**SMALL, "algorithm.use_kl_loss": True, "algorithm.kl_loss_coef": 0.01, "rollout.n": 6,
          "algorithm.clip_ratio_high": 0.28}
    res = run("grpo_math", out, engine="verl", dry_run=True, steps=7, policy=str(tiny_policy), overrides=ov,
              log=lambda m: None)
    return out, res


def test_composed_config_carries_the_recipe(dry, tiny_policy):
    from omegaconf import OmegaConf

    out, res = dry
    c = OmegaConf.load(res["config"])
    assert c.algorithm.adv_estimator == "grpo" and c.algorithm.norm_adv_by_std_in_grpo is True
    a = c.actor_rollout_ref
    assert a.rollout.n == 6 and a.rollout.temperature == 1.0
    assert a.actor.use_kl_loss is True and a.actor.kl_loss_coef == 0.01 and a.actor.kl_loss_type == "low_var_kl"
    assert a.actor.loss_agg_mode == "token-mean" and a.actor.clip_ratio_high == 0.28
    assert a.actor.optim.lr == 3e-5 and a.actor.ppo_mini_batch_size == 8
    assert a.model.path == str(tiny_policy.resolve())
    assert c.reward.custom_reward_function.path == "pkg://tpu_pipeline.train.tasks.rewards"
    assert c.reward.custom_reward_function.name == "compute_score"
    assert c.data.train_batch_size == 8 and c.data.max_response_length == 12
    assert c.trainer.total_training_steps == 7
    assert c.trainer.resume_mode == "disable"  # VeRL's "auto" would pick up old checkpoints unasked
    assert res["command"].split()[1:3] == ["-m", "verl.trainer.main_ppo"]


def test_data_is_verl_parquet_and_the_reward_path_resolves(dry):
    from verl.utils.import_utils import load_extern_object

    from tpu_pipeline.train.tasks.rows import read_parquet

    out, _ = dry
    train = read_parquet(out / "verl" / "train.parquet")
    val = read_parquet(out / "verl" / "val.parquet")
    assert len(train) == 7 * 8 and len(val) == 40
    assert not {p.prompt[0]["content"] for p in train} & {p.prompt[0]["content"] for p in val}
    fn = load_extern_object("pkg://tpu_pipeline.train.tasks.rewards", "compute_score")
    p = train[0]
    assert fn(p.data_source, f"#### {p.ground_truth}", p.ground_truth) == 1.0
    assert fn(p.data_source, p.ground_truth, p.ground_truth) == 0.0  # strict format


def test_dr_grpo_maps_to_verl_keys(tmp_path, tiny_policy):
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.verl_bridge import compose, hydra_overrides

    cfg = load_recipe("grpo_math", {"algorithm.adv_estimator": "dr_grpo"})
    ov = hydra_overrides(cfg, train_file=tmp_path / "t.parquet", val_file=tmp_path / "v.parquet",
                         policy_path=str(tiny_policy), out=tmp_path)
    c = compose(ov)
    assert c.algorithm.norm_adv_by_std_in_grpo is False
    assert c.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"


def test_unknown_override_is_rejected_by_verls_schema(tmp_path, tiny_policy):
    from tpu_pipeline.rl.verl_bridge import compose

    with pytest.raises(UserError, match="VeRL's config rejects"):
        compose(["actor_rollout_ref.actor.no_such_key=1"])


def test_ray_address_makes_a_ray_job_submit(tmp_path, tiny_policy):
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--dry-run", "--ray-address", "http://head:8265",
                                 "--policy", str(tiny_policy), "--out", str(tmp_path / "v"), "--steps", "3"]
                           + [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index('{\n  "engine"'):])
    assert res["command"].startswith("ray job submit --address http://head:8265 --submission-id tpu-pipeline-")
    assert res["command"].endswith(" -- sh run.sh")  # run.sh finds the head's own Ray interpreter
    c = {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in res["overrides"]}
    # a running cluster takes no resources from ray.init (Ray refuses num_cpus/num_gpus there)...
    assert not [k for k in c if k.startswith("ray_kwargs.ray_init.")]
    # ...and the job carries its data and policy: named relative to the job's working_dir
    assert c["data.train_files"] == "train.parquet" and c["actor_rollout_ref.model.path"] == "policy"
    # the CPU plugin reaches the workers through the job's runtime_env, shown in the command
    env = json.loads(res["command"].split("--runtime-env-json ", 1)[1].split(" -- ")[0].strip("'"))["env_vars"]
    assert env["VERL_USE_EXTERNAL_MODULES"] == "tpu_pipeline.rl.verl_cpu_platform"
    assert env["TPU_PIPELINE_CPU_SLOT"] == "CPU"  # VeRL's pools hold CPUs, not fake GPUs


@pytest.mark.parametrize("address, words", [("127.0.0.1:6379", "a GCS address (HEAD:6379) is not taken"),
                                            ("ray://head:10001", "a Ray Client address (ray://) is not taken")])
def test_ray_address_other_than_the_job_api_is_refused_exit_2(tmp_path, tiny_policy, address, words):
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--ray-address", address, "--policy", str(tiny_policy),
                                 "--out", str(tmp_path / "v"), "--steps", "1"])
    assert r.exit_code == 2 and words in r.output and "http://HEAD:8265" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "v").exists()


def test_cpu_overrides_compose_and_name_the_plugin(dry):
    from omegaconf import OmegaConf

    _, res = dry
    assert res["device"] == "cpu"
    c = OmegaConf.load(res["config"])
    a = c.actor_rollout_ref
    assert c.trainer.device == "cpu" and a.actor.strategy == "fsdp2"
    assert a.rollout.engine_kwargs.vllm.worker_extension_cls == "tpu_pipeline.rl.verl_cpu_vllm.CpuWorkerExtension"
    assert a.rollout.enable_sleep_mode is False and a.rollout.free_cache_engine is False
    assert c.ray_kwargs.ray_init.num_gpus == 1 and c.ray_kwargs.ray_init.num_cpus >= 8
    assert c.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    assert "hf_model" in a.actor.checkpoint.save_contents
    # the trainer computes in float32 (VeRL's FSDP default is bf16 parameters and autocast), as the local engine
    for worker in (a.actor, a.ref):
        assert dict(worker.fsdp_config.mixed_precision) == {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                            "buffer_dtype": "fp32"}
        assert worker.fsdp_config.use_torch_compile is False
    assert a.model.enable_gradient_checkpointing is False
    # trainer.threads reaches every Ray worker (Ray's default for the FSDP worker is one thread)
    assert c.ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS == "1"
    assert any("drop_uniform_groups" in d for d in res["departures"])


def test_the_recipe_as_it_is_composes_its_time_budget_saving_every_step(tmp_path):
    # `rl --recipe grpo_math --engine verl` with no flag: the recipe's 360 s budget and its step cap; the
    # warm start is only named on a dry run (trained on a real one, from an empty cache as locally)
    from omegaconf import OmegaConf

    from tpu_pipeline.rl import run
    from tpu_pipeline.rl.recipe import load_recipe

    cfg = load_recipe("grpo_math")
    assert cfg.trainer.time_budget_s > 0
    res = run("grpo_math", tmp_path / "v", engine="verl", dry_run=True, overrides={"data.heldout_n": 40},
              log=lambda m: None)
    c = OmegaConf.load(res["config"])
    assert c.trainer.save_freq == 1  # the budget stops the run after a step: that step's checkpoint is the policy
    assert c.trainer.total_training_steps == cfg.trainer.steps
    assert "/warm_start/arith_lm-" in c.actor_rollout_ref.model.path
    assert not (tmp_path / "v" / "policy").exists()


def test_budget_stops_after_the_step_that_spends_it_once_its_checkpoint_is_complete(tmp_path):
    from tpu_pipeline.rl.verl_outputs import BudgetWatch, MetricsFollower

    out = tmp_path / "run"
    (out / "verl" / "checkpoints").mkdir(parents=True)
    follower = MetricsFollower(out, total_steps=100, log=lambda m: None)
    watch = BudgetWatch(follower, out / "verl" / "checkpoints", budget_s=10.0)
    tracker = out / "verl" / "checkpoints" / "latest_checkpointed_iteration.txt"
    seen = []
    for step, seconds in ((1, 4.0), (2, 4.0), (3, 4.0), (4, 4.0)):
        tracker.write_text(str(step - 1))  # the step's checkpoint not complete yet
        with open(out / "verl" / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "data": {"timing_s/step": seconds}}) + "\n")
        follower.poll()
        before = watch()
        tracker.write_text(str(step))
        seen.append((step, before, watch()))
    follower.close()
    # 4 + 4 < 10 s: go on; step 3 reaches 12 s: stop, but only once step 3's checkpoint is complete
    assert seen[:3] == [(1, None, None), (2, None, None), (3, None, BudgetWatch.REASON)]


@pytest.mark.parametrize("flag, msg", [
    (["--steps", "2", "--set", "algorithm.filter_groups.enable=true"], "filter_groups (DAPO's dynamic sampling)"),
    (["--steps", "2", "--kernels", "pallas"], "trainer.kernels=pallas"),
])
def test_recipe_option_verl_cannot_express_is_refused_exit_2(tmp_path, tiny_policy, flag, msg):
    out = tmp_path / "v"
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--policy", str(tiny_policy), "--out", str(out), *flag]
                           + [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")])
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()  # nothing half-written


def test_cpu_host_without_the_extra_stops_early_exit_2(tmp_path, tiny_policy, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("TPU_PIPELINE_VERL_PYTHON", sys.executable)  # the main venv: no vllm there
    t0 = time.time()
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--policy", str(tiny_policy), "--out", str(tmp_path / "v"),
                                 "--steps", "2"] + [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")])
    assert r.exit_code == 2, r.output
    assert "install the verl-cpu extra" in r.output and "Traceback" not in r.output
    assert time.time() - t0 < 120  # never waits on Ray


def test_a_launch_refused_before_it_starts_leaves_nothing_in_the_temporary_folder(tmp_path, private_tmp, tiny_policy):
    from tpu_pipeline.rl.verl_bridge import cpu_backend_missing, trainer_python

    if cpu_backend_missing(trainer_python()):
        pytest.skip("the verl-cpu extra is not installed; `make install` builds .venv-verl")
    # an override VeRL's config does not know: refused after the cluster's folder was made (at the
    # composition), before anything starts
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--steps", "2", "--out", str(tmp_path / "v"),
                                 "--policy", str(tiny_policy), "--set", 'verl.extra_overrides=["trainer.no_such_key=1"]']
                           + [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")])
    assert r.exit_code == 2 and "VeRL's config rejects the overrides" in r.output, r.output
    assert list(private_tmp.iterdir()) == []


def test_resume_continues_only_what_it_can(tmp_path, tiny_policy):
    from tpu_pipeline.rl.recipe import load_recipe, to_dict
    from tpu_pipeline.rl.verl_bridge import resume_point

    out = tmp_path / "run"
    cfg = load_recipe("grpo_math", {"trainer.steps": 3})
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--resume", "--steps", "3", "--policy", str(tiny_policy),
                                 "--out", str(out)])
    assert r.exit_code == 2 and r.output.startswith("Error: --resume: ") and "holds no VeRL checkpoint" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--resume", "--dry-run", "--steps", "3", "--policy",
                                 str(tiny_policy), "--out", str(out)])
    assert r.exit_code == 2 and r.output.startswith("Error: --resume and --dry-run") and not out.exists()
    ckpts = out / "verl" / "checkpoints"
    (ckpts / "global_step_2").mkdir(parents=True)
    (ckpts / "latest_checkpointed_iteration.txt").write_text("2")
    (out / "config.json").write_text(json.dumps(to_dict(cfg)))
    assert resume_point(cfg, out) == ckpts / "global_step_2"
    # how long it runs and how often it saves may change; what shapes the steps may not
    assert resume_point(load_recipe("grpo_math", {"trainer.steps": 9, "trainer.save_every": 1}), out).name == \
        "global_step_2"
    with pytest.raises(UserError, match=r"different config \(optim\.lr: checkpoint has 3e-05, this run 0\.0001\)"):
        resume_point(load_recipe("grpo_math", {"trainer.steps": 3, "optim.lr": 1e-4}), out)
    with pytest.raises(UserError, match="at step 2 already; pass --steps above 2"):
        resume_point(load_recipe("grpo_math", {"trainer.steps": 2}), out)
    (ckpts / "latest_checkpointed_iteration.txt").write_text("7")  # a tracker naming a folder that is gone
    with pytest.raises(UserError, match="holds no VeRL checkpoint"):
        resume_point(cfg, out)


def test_a_local_engine_run_is_neither_overwritten_nor_resumed_by_verl(tmp_path, tiny_policy):
    out = tmp_path / "local"
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    (out / "config.json").write_text("{}")
    for flags, words in ((["--resume"], "holds a run of the local engine, not VeRL's; resume it with --engine local"),
                         ([], "already holds a run of the local engine")):
        r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--steps", "3", "--policy", str(tiny_policy),
                                     "--out", str(out), *flags])
        assert r.exit_code == 2 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "reward": 0.5}\n'
    assert (out / "config.json").read_text() == "{}" and not (out / "verl").exists()


def test_a_resumed_runs_metrics_go_on_from_its_checkpoint(tmp_path):
    """The killed run logged step 3 but saved step 2 only: its row 3 is replaced by the resumed
    run's, whose first row carries the rate given for update 3 and the time goes on from step 2."""
    from tpu_pipeline.rl.verl_outputs import MetricsFollower

    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": k, "reward": 0.1 * k, "elapsed_seconds": float(k)}) + "\n" for k in (1, 2, 3)))
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "metrics.jsonl").write_text("".join(  # VeRL's file, rewritten by the resumed trainer
        json.dumps({"step": k, "data": {"timing_s/step": 1.5, "actor/lr": 0.1 * k}}) + "\n" for k in (3, 4)))
    f = MetricsFollower(tmp_path, total_steps=4, log=lambda m: None, first_lr=0.25, start_step=2)
    f.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["step"] for r in f.rows] == [3, 4]
    assert [r["elapsed_seconds"] for r in rows] == [1.0, 2.0, 3.5, 5.0]
    assert rows[1]["reward"] == pytest.approx(0.2) and "reward" not in rows[2]  # step 3 is the new run's
    assert [r["lr"] for r in rows[2:]] == pytest.approx([0.25, 0.3])
    (tmp_path / "metrics.jsonl").unlink()  # a folder whose figures were removed by hand: the time starts at 0
    f = MetricsFollower(tmp_path, total_steps=4, log=lambda m: None, first_lr=0.25, start_step=2)
    f.close()
    assert [r["elapsed_seconds"] for r in f.rows] == [1.5, 3.0]


@pytest.mark.parametrize("warmup", [20, 0])
def test_learning_rate_schedule_is_the_local_engines(tmp_path, tiny_policy, warmup):
    """The rate each update runs at, step by step: VeRL's own FSDP engine scheduler built from
    the composed config against the local engine's lr_at; the follower's rows name the same."""
    from types import SimpleNamespace

    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from tpu_pipeline.rl.engine import Engine
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.verl_bridge import compose, hydra_overrides
    from tpu_pipeline.rl.verl_outputs import MetricsFollower

    steps = 30
    cfg = load_recipe("grpo_math", {"optim.warmup_steps": warmup, "trainer.steps": steps})
    c = compose(hydra_overrides(cfg, train_file=tmp_path / "t.parquet", val_file=tmp_path / "v.parquet",
                                policy_path=str(tiny_policy), out=tmp_path))

    def verl_rates(optim_cfg):
        oc = omega_conf_to_dataclass(optim_cfg)
        oc.total_training_steps = steps  # what VeRL's trainer injects
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=oc.lr)
        sched = FSDPEngine._build_lr_scheduler(SimpleNamespace(optimizer_config=oc, rank=1), opt)
        ran, logged = [], []
        for _ in range(steps):  # engine_workers.train_batch: the update, then lr_scheduler_step()
            ran.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            logged.append(sched.get_last_lr()[0])
        return ran, logged

    local = [Engine.lr_at(SimpleNamespace(cfg=cfg), k) for k in range(steps)]
    ran, logged = verl_rates(c.actor_rollout_ref.actor.optim)
    assert ran == pytest.approx(local, rel=1e-12, abs=0)
    if warmup:
        assert local[0] == pytest.approx(3e-5 / warmup)
        # VeRL's default "constant" schedule: the first update at lr 0, each warm-up step one behind
        default = compose(hydra_overrides(cfg, train_file=tmp_path / "t.parquet", val_file=tmp_path / "v.parquet",
                                          policy_path=str(tiny_policy), out=tmp_path)
                          + ["actor_rollout_ref.actor.optim.lr_scheduler_type=constant"])
        old_ran, _ = verl_rates(default.actor_rollout_ref.actor.optim)
        assert old_ran[0] == 0.0 and old_ran[1] == pytest.approx(local[0])

    # VeRL logs the rate after its scheduler step; metrics.jsonl rows carry the rate the update ran at
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": k + 1, "data": {"timing_s/step": 1.0, "actor/lr": lr}}) + "\n"
        for k, lr in enumerate(logged)))
    f = MetricsFollower(tmp_path, total_steps=steps, log=lambda m: None, first_lr=local[0])
    f.close()
    assert [r["lr"] for r in f.rows] == pytest.approx(local, rel=1e-12, abs=0)


def test_verl_feeds_the_local_engines_prompt_tokens(dry, tiny_policy, tmp_path):
    """VeRL's agent loop (its HFModelConfig applying the launch's chat template, its Continuous
    Token builder) tokenizes each training prompt as the local engine does: BOS first."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from tpu_pipeline.rl.evaluate import encode_prompts
    from tpu_pipeline.rl.verl_bridge import JOINED_TEMPLATE, prompt_tokens_differ
    from .chat_models import save_chat_policy
    from tpu_pipeline.train.tasks.rows import read_parquet

    out, res = dry
    problems = read_parquet(out / "verl" / "train.parquet")
    local_tok = AutoTokenizer.from_pretrained(tiny_policy)
    local = encode_prompts(local_tok, problems, 32, "refuse")
    assert all(ids[0] == local_tok.bos_token_id for ids in local)

    mc = omega_conf_to_dataclass(OmegaConf.load(res["config"]).actor_rollout_ref.model)
    builder = create_continuous_token_builder(mc.tokenizer, hf_model_type=mc.hf_config.model_type)
    assert [list(builder.build_initial_tokens(p.prompt)) for p in problems] == local
    assert not any("prompt tokens" in d for d in res["departures"])

    # the template without the BOS (before the fix) is caught, naming the first prompt
    local_tok.chat_template = JOINED_TEMPLATE
    differ = prompt_tokens_differ(local, local_tok, problems, hf_model_type="llama")
    assert differ and differ.startswith("prompt 0: the local engine feeds [1, ")

    # a policy with its own chat template: the local engine renders it as VeRL does
    chat = save_chat_policy(tmp_path / "chat")
    ctok = AutoTokenizer.from_pretrained(chat)
    cl = encode_prompts(ctok, problems, 64, "refuse")
    assert prompt_tokens_differ(cl, ctok, problems, hf_model_type="llama") is None


def test_worker_threads_follow_trainer_threads_as_the_local_engine(monkeypatch):
    from tpu_pipeline.rl.recipe import load_recipe
    from tpu_pipeline.rl.verl_bridge import worker_threads

    assert worker_threads(load_recipe("grpo_math", {"trainer.threads": 3}), local_cluster=False) == 3
    auto = load_recipe("grpo_math", {"trainer.threads": 0})
    assert worker_threads(auto, local_cluster=False) is None  # a cluster's nodes: Ray's own default
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("tpu_pipeline.cpu_load.busy_cores", lambda: 1.8)
    assert worker_threads(auto, local_cluster=True) == 1  # loaded: competing OpenMP threads spin-wait
    monkeypatch.setattr("tpu_pipeline.cpu_load.busy_cores", lambda: 0.2)
    assert worker_threads(auto, local_cluster=True) == 2
