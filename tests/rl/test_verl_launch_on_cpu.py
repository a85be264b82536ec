"""`rl --engine verl` for real on this CPU host: VeRL's Ray trainer (FSDP2 on gloo,
vLLM's CPU rollout). Three real launches: the first has its FSDP worker SIGKILLed after
step 1's checkpoint (one line, exit 6, the checkpoint kept and named); `--resume`
continues it to 3 steps, and the run folder then holds what the local engine writes; the
third starts from an empty cache and stops at the recipe's time budget.
No Ray or vLLM process, and none of their temporary files, outlives either command.
Also: the supervisor stops every process it started; a Ray cluster that cannot be
reached is one line with exit 6; a policy vLLM cannot load is named from vLLM's own
failure (vLLM alone, not a whole launch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from omegaconf import OmegaConf

from tpu_pipeline.cli import cli
from tpu_pipeline.errors import EXIT_TRAINER
from tpu_pipeline.rl.verl_launch import MARKER, supervise, survivors
from tpu_pipeline.testing.processes import alive

from .conftest import SMALL

SPAWN = textwrap.dedent("""
    import os, subprocess, sys
    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(a.pid, b.pid, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(3)
    import time; time.sleep(300)
""")


# What a VeRL run left in the temporary folder before its cluster got a folder of its own: vLLM's
# file-store records and ZMQ sockets (uuid4 names), VeRL's checkpoint locks, the Ray session folder,
# VeRL's weight-transfer socket (a killed trainer worker never removes it).
# Matched by name, not with the private_tmp fixture: under pytest's long temporary path Ray's socket
# paths pass the 107 bytes a Unix socket allows.
LEFT_IN_TMP = re.compile(r"vllm_dist_[0-9a-f]{32}|ckpt_[0-9a-f]{8}\.lock|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
                         r"|tpray-.+|rl-colocate-zmq-.+\.sock")


def _left_in_tmp() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if LEFT_IN_TMP.fullmatch(p.name)}


TEST_TAG = "TPU_PIPELINE_TEST_VERL_TAG"  # set by a test around its own run; inherited like the marker


def _marked_processes(tag: str) -> list[int]:
    """Processes of the --engine verl run a test started under `tag` (their environment carries the
    launch's marker and the tag): another run on this machine (a second test suite, a user's run) is
    neither counted as left behind nor killed."""
    needles = [f"{MARKER}=".encode(), f"{TEST_TAG}={tag}".encode() + b"\0"]
    pids = []
    for e in Path("/proc").iterdir():
        if e.name.isdigit() and int(e.name) != os.getpid():
            try:
                environ = (e / "environ").read_bytes()
                if all(n in environ for n in needles) and alive(int(e.name)):
                    pids.append(int(e.name))
            except OSError:
                pass
    return pids


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_supervisor_stops_every_process_it_started(tmp_path, mode):
    log = tmp_path / "log.txt"
    out = supervise([sys.executable, "-c", SPAWN, mode], dict(os.environ), log, timeout_s=None if mode == "exit" else 5)
    pids = [int(x) for x in log.read_text().split()[:2]]
    assert out.survivors == []
    assert not any(alive(p) for p in pids)  # the one in its own session too: found by the marker
    assert (out.returncode == 3) if mode == "exit" else out.returncode != 0


def test_sigterm_to_the_supervisor_stops_every_process_it_started(tmp_path):
    # a scheduler's or `timeout`'s SIGTERM: the trainer runs in its own session, so the supervisor
    # must stop it on the way out, as for Ctrl-C
    log = tmp_path / "log.txt"
    driver = textwrap.dedent(f"""
        import sys
        from tpu_pipeline.rl.verl_launch import supervise
        try:
            supervise([sys.executable, "-c", {SPAWN!r}, "hang"], {{}}, __import__("pathlib").Path({str(log)!r}))
        except KeyboardInterrupt as e:
            print("interrupted:", e, flush=True)
            sys.exit(130)
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PATH": os.environ.get("PATH", "")})
    deadline = time.monotonic() + 60
    while not (log.is_file() and len(log.read_text().split()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(x) for x in log.read_text().split()[:2]]
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted: signal SIGTERM" in out
    assert not any(alive(p) for p in pids)


def test_interrupt_stops_the_cluster_and_reraises(tmp_path):
    log = tmp_path / "log.txt"
    t0 = time.monotonic()

    def interrupt():
        if log.is_file() and len(log.read_text().split()) >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        supervise([sys.executable, "-c", SPAWN, "hang"], dict(os.environ), log, on_poll=interrupt)
    pids = [int(x) for x in log.read_text().split()[:2]]
    assert not any(alive(p) for p in pids) and time.monotonic() - t0 < 60


def test_unreachable_ray_cluster_is_one_line_exit_6(tmp_path, tiny_policy, monkeypatch):
    out = tmp_path / "v"
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TAG, tag)
    r = CliRunner().invoke(cli, ["rl", "--engine", "verl", "--ray-address", "http://127.0.0.1:9", "--steps", "2",
                                 "--policy", str(tiny_policy), "--out", str(out)]
                           + [x for k, v in SMALL.items() for x in ("--set", f"{k}={v}")])
    assert r.exit_code == EXIT_TRAINER, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: --engine verl: no Ray cluster answers at http://127.0.0.1:9"), last
    assert "Traceback" not in r.output and _marked_processes(tag) == []
    assert not out.exists()  # refused before anything was written


# Lines of real failed launches on this box (ANSI colours removed), each beside lines that must not decide.
REAL_FAILURES = (
    ("(raylet) A worker died or was killed while executing a task by an unexpected system error. To troubleshoot "
     "the problem, check the logs for the dead worker.", "a VeRL worker died"),
    ("(vLLMHttpServer pid=11052) (Worker pid=11697) ERROR 12-01 11:06:52 [multiproc_executor.py:1047] RuntimeError: "
     "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0", "vLLM could not load the policy"),
    ("[rank0]: RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
     "vLLM could not load the policy"),
    ("ConnectionError: Failed to connect to Ray at address: http://127.0.0.1:9.", "Ray could not start"),
)
# (the first once named a killed worker: the test's folder name was in it)
NOT_DECIDING = ("ray init kwargs: {'num_cpus': 8, 'runtime_env': {'env_vars': {'VERL_FILE_LOGGER_PATH': "
                "'/tmp/pytest-of-root/test_worker_killed_mid_run_is_0/v/verl/metrics.jsonl'}}}",
                "INFO:2026-12-01 10:57:42,502:Platform override from VERL_PLATFORM: cpu")


@pytest.mark.parametrize("line, what", REAL_FAILURES)
def test_each_real_failure_line_is_named_for_what_failed(tmp_path, line, what):
    from tpu_pipeline.rl.verl_launch import diagnose

    log = tmp_path / "trainer.log"
    log.write_text("\n".join((*NOT_DECIDING, "\x1b[36m" + line + "\x1b[0m", "Traceback (most recent call last):")))
    assert diagnose(log) == f"{what} ({line[:197] + '...' if len(line) > 200 else line})"


def _need_the_extra():
    from tpu_pipeline.rl.verl_bridge import cpu_backend_missing, trainer_python

    missing = cpu_backend_missing(trainer_python())
    if missing:
        pytest.skip(f"the verl-cpu extra is not installed ({missing}); `make install` builds .venv-verl")


def _worker_pids(tag: str) -> list[int]:
    """VeRL's FSDP actor processes (Ray names them ray::WorkerDict...) of the run tagged `tag`."""
    pids = []
    for pid in _marked_processes(tag):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::WorkerDict"):
                pids.append(pid)
        except OSError:
            pass
    return pids


# Both launches: 3 steps, a checkpoint after each, a reward a random policy earns about half the time
# (the recipe's is ~0 for it, so no gradient); VeRL's reward workers import it as
# pkg://rewards_for_tests, from PYTHONPATH.
LAUNCH = ["rl", "--engine", "verl", "--steps", "3", "--reward", "rewards_for_tests:odd_char_sum"] + [
    x for k, v in {**SMALL, "trainer.save_every": 1}.items() for x in ("--set", f"{k}={v}")]
TESTS_PATH = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, verl_policy):
    """A real fault: the FSDP worker process is SIGKILLed once step 1's checkpoint is on disk."""
    import signal

    _need_the_extra()
    out = tmp_path_factory.mktemp("verl_run") / "run"
    tag, in_tmp = uuid.uuid4().hex, _left_in_tmp()
    proc = subprocess.Popen([sys.executable, "-m", "tpu_pipeline", *LAUNCH, "--policy", str(verl_policy),
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, TEST_TAG: tag, "PYTHONPATH": TESTS_PATH})
    tracker = out / "verl" / "checkpoints" / "latest_checkpointed_iteration.txt"
    killed, deadline = [], time.monotonic() + 600
    while proc.poll() is None and not killed and time.monotonic() < deadline:
        if tracker.is_file():
            killed = _worker_pids(tag)
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    stdout, stderr = proc.communicate(timeout=300)
    step = int(tracker.read_text()) if tracker.is_file() else None
    return out, proc.returncode, stdout, stderr, killed, step, _marked_processes(tag), _left_in_tmp() - in_tmp


@pytest.fixture(scope="module")
def verl_run(killed_run, verl_policy):
    """`--resume` of the killed run, to its 3 steps."""
    out, *_ = killed_run
    tag = uuid.uuid4().hex
    t0, in_tmp = time.time(), _left_in_tmp()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TEST_TAG, tag)
        mp.syspath_prepend(str(Path(__file__).parent))  # this process scores eval.json with the reward
        mp.setenv("PYTHONPATH", TESTS_PATH)
        r = CliRunner().invoke(cli, [*LAUNCH, "--resume", "--policy", str(verl_policy), "--out", str(out)])
    return out, r, time.time() - t0, set(_marked_processes(tag)), _left_in_tmp() - in_tmp


@pytest.mark.slow
def test_worker_killed_mid_run_is_one_line_exit_6_and_keeps_the_checkpoint(killed_run):
    out, returncode, stdout, stderr, killed, step, left, left_in_tmp = killed_run
    assert killed, f"no worker to kill (exit {returncode}): {stderr[-3000:]}"
    assert returncode == EXIT_TRAINER, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Error: --engine verl: a VeRL worker died"), last
    assert "Traceback" not in stderr + stdout
    kept = out / "verl" / "checkpoints" / f"global_step_{step}"
    assert f"last good checkpoint: {kept}" in last and (kept / "actor").is_dir()
    assert left == []  # Ray, vLLM and the other workers stopped too
    assert left_in_tmp == set()  # and none of their files stayed in the temporary folder


@pytest.mark.slow
def test_killed_run_resumes_and_its_three_verl_steps_train_the_policy_leaving_no_process(verl_run, killed_run,
                                                                                         verl_policy):
    from safetensors.torch import load_file

    out, r, seconds, left, left_in_tmp = verl_run
    assert r.exit_code == 0, r.output + (out / "verl" / "trainer.log").read_text()[-4000:]
    assert left == set()  # no Ray, vLLM or trainer process outlived the command
    assert left_in_tmp == set()  # nor any of their files
    step = killed_run[5]
    assert f"resuming from {out / 'verl' / 'checkpoints' / f'global_step_{step}'} (step {step})" in r.output
    assert f"Resuming from {(out / 'verl' / 'checkpoints' / f'global_step_{step}').resolve()}" in \
        (out / "verl" / "trainer.log").read_text()  # VeRL's own word that it loaded the checkpoint
    assert (out / "verl" / "trainer.1.log").is_file()  # the killed run's log is kept
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]  # the killed run's step 1, the resumed run's 2 and 3
    for row in rows:
        assert 0.0 <= row["reward"] <= 1.0 and 0.0 <= row["accuracy"] <= 1.0
        assert row["step_seconds"] > 0 and row["rollout_seconds"] > 0 and row["response_length"] > 0
        # the trainer recomputes vLLM's sampling probabilities in float32: bf16 left gaps of ~1e-2
        assert row["rollout_probs_diff_max"] < 1e-3 and row["rollout_probs_diff_mean"] < 1e-4, row
    assert any(0.0 < row["reward"] < 1.0 for row in rows)  # mixed groups: a gradient to follow
    evals = json.loads((out / "eval.json").read_text())
    assert evals["engine"] == "verl" and evals["steps"] == 3 and evals["leftover_processes"] == []
    assert evals["before"]["n"] == evals["after"]["n"] == SMALL["data.heldout_n"]
    assert 0.0 <= evals["after"]["accuracy"] <= 1.0 and Path(evals["curve"]).is_file()
    # policy/ is a Hugging Face folder of the trained weights: same tensors, moved by 3 updates
    start, trained = load_file(verl_policy / "model.safetensors"), load_file(out / "policy" / "model.safetensors")
    assert start.keys() == trained.keys()
    moved = [k for k in start if not (start[k].float() - trained[k].float()).abs().max() == 0]
    assert moved, "VeRL's 3 steps left every weight where it started"
    assert (out / "policy" / "tokenizer.json").is_file() and (out / "policy" / "config.json").is_file()
    assert not (out / "policy" / "chat_template.jinja").exists()  # the start had none
    # where the start-up went, read from the trainer's log (rl/verl_startup.py)
    names = [p["phase"] for p in evals["startup_phases"]]
    assert names[0] == "driver imported VeRL" and {"Ray started", "vLLM engine ready, trainer ready"} <= set(names)
    assert all(p["took_s"] >= 0 for p in evals["startup_phases"])
    print(f"verl resumed launch (steps 2-3): {seconds:.0f} s wall, startup {evals['startup_seconds']} s, "
          f"steps {[round(r['step_seconds'], 2) for r in rows]}, phases {evals['startup_phases']}")


# vLLM's own engine on a policy its CPU attention has no kernel for (head_dim 16), without Ray or FSDP:
# the failure a launch meets, at a fraction of a launch's start-up (the launch path to exit 6 is the
# killed run above).
# In-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: no EngineCore and Worker processes to spawn), 53 s here
# against 272 s for the launch it replaced.
VLLM_LOAD = textwrap.dedent("""
    import sys
    from vllm import LLM
    llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=64, gpu_memory_utilization=0.1)
    llm.generate(["1+2="])  # the CPU attention kernel is chosen at the first forward pass
""")


@pytest.mark.slow
def test_vllm_that_cannot_load_the_policy_is_named_in_one_line(tmp_path, tiny_policy):
    from tpu_pipeline.rl.verl_bridge import trainer_python
    from tpu_pipeline.rl.verl_cpu_platform import ENV
    from tpu_pipeline.rl.verl_launch import diagnose

    _need_the_extra()
    log = tmp_path / "trainer.log"
    env = {**os.environ, **ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TMPDIR": str(tmp_path)}  # its file store
    out = supervise([trainer_python(), "-c", VLLM_LOAD, str(tiny_policy)], env, log, timeout_s=300)
    assert out.returncode != 0 and out.stopped is None and out.survivors == []
    line = diagnose(log)
    assert line.startswith("vLLM could not load the policy") and "head_dim=16" in line and "\n" not in line, line


# `rl --engine verl` from nothing, taking the recipe as it is (the third launch, here rather than in a file of
# its own: two launches side by side would each count the other's cluster folder as left in /tmp).
#
# `rl --engine verl` from nothing, taking the recipe as it is: no warm start in the cache (the
# test's own TPU_PIPELINE_HOME), so it is trained first, as the local engine would; then VeRL's
# trainer runs under the recipe's time budget (no --steps) and is stopped after the step that
# spends it, at that step's checkpoint. A budget of 0.01 s is spent by the first step on any
# machine, so the run stops after step 1 however fast or loaded the box is.
#
# A warm start of seconds (the recipe's model, 20 updates, a small held-out check): a real one,
# trained and cached by the launch itself.
WARM_START = json.dumps({"loop.steps": 20, "loop.batch_size": 16, "loop.log_every": 10, "arith.n_heldout": 40,
                         "arith.pass_k": 0})


@pytest.mark.slow
def test_verl_from_an_empty_cache_trains_the_warm_start_and_honours_the_time_budget(tmp_path, monkeypatch):
    _need_the_extra()
    home = Path(os.environ["TPU_PIPELINE_HOME"])
    assert not (home / "warm_start").exists()
    out, tag, in_tmp = tmp_path / "run", uuid.uuid4().hex, _left_in_tmp()
    monkeypatch.setenv(TEST_TAG, tag)
    monkeypatch.setenv("PYTHONPATH", TESTS_PATH)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    small = {k: v for k, v in SMALL.items() if k != "trainer.time_budget_s"}
    r = CliRunner().invoke(cli, ["rl", "--recipe", "grpo_math", "--engine", "verl", "--time-budget", "0.01",
                                 "--reward", "rewards_for_tests:odd_char_sum", "--out", str(out),
                                 "--set", f"policy.warm_start_overrides={WARM_START}"]
                           + [x for k, v in small.items() for x in ("--set", f"{k}={v}")])
    log = (out / "verl" / "trainer.log").read_text()[-4000:] if (out / "verl" / "trainer.log").is_file() else ""
    assert r.exit_code == 0, r.output + log
    cached = list((home / "warm_start").glob("arith_lm-*/hf/config.json"))
    assert len(cached) == 1 and "warm start: training arith_lm" in r.output
    assert OmegaConf.load(out / "verl" / "ppo_trainer.yaml").actor_rollout_ref.model.path == str(cached[0].parent)
    assert "time budget 0.01 s spent after step 1" in r.output
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert rows[0]["rollout_probs_diff_max"] < 1e-3
    evals = json.loads((out / "eval.json").read_text())
    assert evals["steps"] == 1 and evals["stopped"].startswith("time budget 0.01 s spent after step 1")
    assert evals["checkpoint"].endswith("global_step_1") and evals["leftover_processes"] == []
    assert any((out / "policy").glob("*.safetensors")) and (out / "policy" / "config.json").is_file()
    assert _marked_processes(tag) == [] and _left_in_tmp() - in_tmp == set()
