"""`rl --engine verl --ray-address` against a real running Ray cluster: two nodes on loopback
started the plain way (`ray start --head`, `ray start --address`, CPUs only, token auth as Ray
2.60 sets it; tpu_pipeline.testing.ray_cluster), stopped by process id at the end.

The submitting shell has no Ray variable but RAY_AUTH_TOKEN (no RAY_AUTH_MODE, no
~/.ray/auth_token in its HOME). One tiny GRPO step runs with its trainer across both nodes
(--nnodes 2) and leaves the policy, eval.json and metrics in OUT; a second submission is
interrupted (SIGINT, as Ctrl-C) and the job is stopped on the cluster. Bad input: an address
nobody answers (exit 6), a missing or wrong token and a cluster too small for the recipe (exit 2),
each one line before anything is written. The token is in no printed line and no file of OUT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tpu_pipeline.errors import EXIT_BAD_INPUT, EXIT_TRAINER

from .conftest import SMALL

HERE = Path(__file__).parent
# one step, its checkpoint, a reward a random policy earns about half the time (rewards_for_tests,
# shipped with the job: the nodes have no copy of it)
LAUNCH = ["rl", "--engine", "verl", "--reward", "rewards_for_tests:odd_char_sum"] + [
    x for k, v in {**SMALL, "trainer.save_every": 1}.items() for x in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module")
def cluster(verl_python):
    from tpu_pipeline.testing.ray_cluster import start_cluster

    c = start_cluster(Path(verl_python).parent / "ray")
    yield c
    left = c.stop()
    assert left == [], f"cluster processes {left} outlived the stop"


def _submit(cluster, tmp_path: Path, args: list[str], *, token: str | None = "cluster", **popen):
    home = tmp_path / "client_home"
    home.mkdir(exist_ok=True)
    env = cluster.client_env(home=home, token=cluster.token if token == "cluster" else token)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "tpu_pipeline", *LAUNCH, *args]
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def _one_error_line(p) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], p.stderr[-3000:]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dead address", "no token", "wrong token", "too small"])
def test_bad_input_is_one_line_before_anything_is_written(cluster, tmp_path, verl_policy, case):
    from tpu_pipeline.testing.ray_cluster import free_port

    out = tmp_path / "run"
    args, token = ["--steps", "1", "--policy", str(verl_policy), "--out", str(out)], "cluster"
    if case == "dead address":
        args += ["--ray-address", f"http://127.0.0.1:{free_port()}"]
    else:
        args += ["--ray-address", cluster.address]
    if case == "no token":
        token = None
    if case == "wrong token":
        token = "0" * 64
    if case == "too small":
        args += ["--nnodes", "3"]  # one trainer process on each of 3 nodes; the cluster has 2
    p = _submit(cluster, tmp_path, args, token=token)
    line = _one_error_line(p)
    expected = {
        "dead address": (EXIT_TRAINER, "Error: --engine verl: no Ray cluster answers at http://127.0.0.1:"),
        "no token": (EXIT_BAD_INPUT, f"Error: --ray-address {cluster.address}: the cluster refused this client's "
                                     "Ray token (no token was found here)"),
        "wrong token": (EXIT_BAD_INPUT, f"Error: --ray-address {cluster.address}: the cluster refused this client's "
                                        "Ray token (the token is not the cluster's)"),
        "too small": (EXIT_BAD_INPUT, f"Error: the Ray cluster at {cluster.address} cannot hold the trainer: it asks "
                                      "3 node(s) with 1 CPU each"),
    }[case]
    assert p.returncode == expected[0] and line.startswith(expected[1]), (p.returncode, line)
    assert not out.exists()


def _token_in(cluster, folder: Path) -> list[str]:
    needle = cluster.token.encode()
    return [str(f) for f in folder.rglob("*") if f.is_file() and needle in f.read_bytes()]


@pytest.mark.slow
def test_ctrl_c_stops_the_job_on_the_cluster(cluster, tmp_path, verl_policy):
    out = tmp_path / "run"
    p = _submit(cluster, tmp_path, ["--steps", "1", "--ray-address", cluster.address, "--policy", str(verl_policy),
                                    "--out", str(out)], start_new_session=True)
    log, deadline = out / "verl" / "trainer.log", time.monotonic() + 600
    # the job runs VeRL on the cluster: run.sh has found the head's interpreter and exec'd the trainer
    while p.poll() is None and time.monotonic() < deadline and not (
            log.is_file() and "TPU_PIPELINE_JOB:" in log.read_text(errors="replace")):
        time.sleep(0.5)
    assert p.poll() is None, p.communicate()[1][-3000:]
    submission = json.loads((out / "verl" / "job.json").read_text())["submission_id"]
    assert cluster.job(submission)["status"] == "RUNNING"
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130, stderr[-3000:]
    assert f"stopping Ray job {submission} on the cluster" in stderr and f"Ray job {submission}: STOPPED" in stderr
    assert cluster.job(submission)["status"] == "STOPPED"  # the cluster's word, not ours
    assert cluster.token not in stdout + stderr and _token_in(cluster, out) == []


@pytest.mark.slow
def test_one_grpo_step_across_both_nodes(cluster, tmp_path, verl_policy, verl_python):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    p = _submit(cluster, tmp_path, ["--steps", "1", "--nnodes", "2", "--ray-address", cluster.address,
                                    "--policy", str(verl_policy), "--out", str(out)])
    log = (out / "verl" / "trainer.log").read_text(errors="replace")[-4000:] if (out / "verl").is_dir() else ""
    assert p.returncode == 0, p.stderr[-4000:] + log
    evals = json.loads((out / "eval.json").read_text())
    assert evals["engine"] == "verl" and evals["steps"] == 1 and evals["device"] == "cpu"
    assert evals["before"]["n"] == evals["after"]["n"] == SMALL["data.heldout_n"]
    assert 0.0 <= evals["after"]["accuracy"] <= 1.0
    assert cluster.job(evals["ray_submission_id"])["status"] == "SUCCEEDED"
    # the trainer's two FSDP processes ran one on each node (the cluster's node ids, from its state API)
    nodes = {n["node_id"] for n in cluster.alive_nodes()}
    trainers = {node for actor, node in evals["actor_nodes"].items() if actor.split(":")[0].endswith("WorkerDict")}
    assert len(nodes) == 2 and trainers == nodes, evals["actor_nodes"]
    # the head's own Ray interpreter ran the job (the submitting shell's PATH never reached it), and the
    # project came with the job (Ray's py_modules), not from an install on the nodes
    python, project, _ = evals["cluster_python"].split("; ")
    assert python == f"python {verl_python}"
    assert "/runtime_resources/py_modules_files/" in project, project
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["step_seconds"] > 0 and 0.0 <= rows[0]["reward"] <= 1.0
    start, trained = load_file(verl_policy / "model.safetensors"), load_file(out / "policy" / "model.safetensors")
    assert start.keys() == trained.keys()
    assert any((start[k].float() - trained[k].float()).abs().max() > 0 for k in start), "the step moved no weight"
    assert cluster.token not in p.stdout + p.stderr and _token_in(cluster, out) == []
    print(f"two-node cluster step: {rows[0]['step_seconds']:.1f} s, startup {evals['startup_seconds']} s, "
          f"wall {evals['wall_seconds']} s")


@pytest.mark.slow  # runs the job's entrypoint script (a child process), no cluster
@pytest.mark.parametrize("case", ["no verl", "OUT not seen", "runs"])
def test_the_entrypoint_refuses_a_head_it_cannot_run_on(tmp_path, verl_python, case):
    """run.sh outside Ray (no raylet among its ancestors) takes `python3` from PATH: a PATH whose
    python3 lacks VeRL, and a head that does not see OUT's nonce, are each one REFUSED line, exit 3."""
    from tpu_pipeline.rl.verl_cluster import PROVENANCE, REFUSED, write_entrypoint

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # -S: no site-packages, so no VeRL (the main venv has one too)
    python = f"{sys.executable} -S" if case == "no verl" else verl_python
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {python} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    (out / "verl").mkdir(parents=True)
    (out / "verl" / "cluster_nonce").write_text("the-job" if case == "runs" else "another-job")
    write_entrypoint(tmp_path, ["--version"])  # exec'd as `python -m verl.trainer.main_ppo --version`
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TPU_PIPELINE_OUT": str(out), "TPU_PIPELINE_NONCE": "the-job"}
    p = subprocess.run(["sh", "run.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    lines = p.stdout.splitlines()
    if case == "runs":
        assert lines[0].startswith(f"{PROVENANCE} python {verl_python}") and "verl from" in lines[0], p.stdout
        # then VeRL's trainer itself, exec'd with the overrides (hydra's --version answers)
        assert p.returncode == 0 and lines[1].startswith("Hydra "), p.stdout + p.stderr
        return
    assert p.returncode == 3 and len([ln for ln in lines if ln.startswith(REFUSED)]) == 1, p.stdout + p.stderr
    want = "has no verl" if case == "no verl" else f"does not see this run's folder {out}"
    assert want in lines[0], lines
