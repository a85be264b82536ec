"""`rl --engine verl --ray-address http://HEAD:8265`: VeRL's trainer as a job on a running Ray cluster.

What a submission does, in order (each step fails in one line before the next starts):

1. `connect(address)`: Ray's job API at the dashboard address (http:// or https://; a GCS address
   HEAD:6379 or a Ray Client address ray://HEAD:10001 is refused, exit 2, naming the form to use).
   Token authentication as Ray 2.60 documents it: a token in RAY_AUTH_TOKEN, the file
   RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token is sent without the user exporting
   RAY_AUTH_MODE=token (Ray's own `maybe_enable_token_auth_if_token_available`, which `ray start
   --head` also runs). The token is only ever in this process's environment and Ray's request
   headers: never in the printed command, the job's environment, the logs or OUT.
   Nobody answering: exit 6; a missing or wrong token: exit 2.
2. `read_cluster(client)`: the cluster's alive nodes and their resources, read from the cluster
   (Ray's state API behind the same address), never from this machine: `choose_device` picks
   cuda (GPUs), tpu (TPUs) or cpu, and `check_fit` refuses (exit 2) a recipe whose
   nnodes x n_gpus_per_node the nodes cannot hold.
3. `stage(...)`: the job's runtime_env. working_dir: the recipe's data (train/val parquet),
   the policy folder, a reward module that lives outside the project, and `run.sh`, the
   entrypoint; py_modules: the project itself (tpu_pipeline, copied as it is imported here);
   env_vars: what the workers need (VeRL's CPU platform plugin on a CPU cluster, the metrics
   file). Nothing is assumed about the nodes beyond Ray, VeRL and VeRL's dependencies.
4. `run.sh` runs on the head with the interpreter Ray itself runs on there (the raylet starts
   every Ray worker, the job supervisor included, with it: its --python_worker_command), so a
   head whose PATH lacks the VeRL environment still runs VeRL's; it checks that OUT is the
   same folder the head sees (OUT must be on storage shared with the nodes: checkpoints,
   metrics and the trainer's files land there, where this process reads them) and execs
   `python -m verl.trainer.main_ppo`.
5. `follow(...)`: the job's logs stream to DIR/verl/trainer.log and the terminal; Ctrl-C (or
   SIGTERM) stops the job on the cluster (`ray job stop`) and waits for it to end, leaving
   its checkpoints; a head whose job agent is still starting is retried for AGENT_WAIT_S.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shlex
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tpu_pipeline.errors import TrainerError, UserError
from tpu_pipeline.rl.verl_launch import Outcome, _terminate_as_interrupt

# How long a head whose job agent is not up yet ("No available agent to submit job") is retried.
AGENT_WAIT_S = 120.0
AGENT_BUSY = "No available agent to submit job"
# How long a stopped job is waited for before this process gives up on it (it says so).
STOP_WAIT_S = 60.0
POLL_S = 1.0

# A line run.sh prints when the cluster cannot run the job as asked (exit 2 here, not a trainer failure).
REFUSED = "TPU_PIPELINE_REFUSED:"
# run.sh's first line on success: which python, and where tpu_pipeline and verl come from on the head.
PROVENANCE = "TPU_PIPELINE_JOB:"

# Packages of the project the job imports (the CPU platform, the vLLM weight sync, the rewards,
# and what they import). convert is never imported by rl (pyproject's contract) and stays here.
SHIPPED = ("tpu_pipeline", "tpu_pipeline.rl", "tpu_pipeline.train", "tpu_pipeline.kernels")
# A policy folder up to this size travels with the job; a larger one is named by its path, which
# must then be on storage the nodes share (Ray's working_dir upload is capped at 512 MiB).
SHIP_POLICY_MAX_BYTES = 400 * 2**20


def check_address(address: str) -> str:
    """The job API address Ray's JobSubmissionClient takes, or UserError naming the form to use."""
    a = address.strip().rstrip("/")
    if a.startswith(("http://", "https://")):
        return a
    if a.startswith("ray://"):
        why = "a Ray Client address (ray://) is not taken"
    elif a in ("auto", "local", ""):
        why = f"{a or 'an empty address'} names no cluster"
    else:
        why = "a GCS address (HEAD:6379) is not taken"
    raise UserError(f"--ray-address {address}: {why}; pass the head's job API address, http://HEAD:8265 "
                    "(the dashboard port; `ray start --head` prints it)")


def enable_token_auth() -> None:
    """Ray's token authentication for this client as Ray documents it: a token in RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH's file or ~/.ray/auth_token turns it on unless RAY_AUTH_MODE says otherwise
    (Ray's CLI reads the token only with RAY_AUTH_MODE=token; `ray start --head` decides the same way)."""
    # heavy and private: Ray's own helper, so the token is looked up exactly where Ray looks
    from ray._private.authentication import authentication_token_setup as setup

    quiet = logging.getLogger(setup.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its notice tells a cluster's operator how to opt out, not this client
    try:
        setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)


def connect(address: str):
    """A JobSubmissionClient for `address`; TrainerError (exit 6) when nobody answers, UserError
    (exit 2) when the cluster refuses the token."""
    # heavy: Ray's job SDK (aiohttp, requests); only a cluster submission needs it
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    enable_token_auth()
    try:
        client = JobSubmissionClient(address)
        client.list_jobs()  # the version check above is not authenticated everywhere; this is
    except AuthenticationError as e:
        raise UserError(f"--ray-address {address}: the cluster refused this client's Ray token "
                        f"({_auth_reason(e)}); set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH to the cluster's token "
                        "(`ray get-auth-token` on the head prints it)") from None
    except (ConnectionError, OSError) as e:
        raise TrainerError(f"--engine verl: no Ray cluster answers at {address} ({_first_line(e)}); start one "
                           "(`ray start --head`) or check the address") from None
    except RuntimeError as e:  # Ray's SDK wraps HTTP failures in RuntimeError
        raise TrainerError(f"--engine verl: the Ray cluster at {address} failed the request "
                           f"({_first_line(e)})") from None
    return client


def _auth_reason(e: Exception) -> str:
    text = str(e)
    if "Missing" in text or "no authentication token was found" in text:
        return "no token was found here"
    if "Invalid" in text or "incorrect" in text:
        return "the token is not the cluster's"
    return _first_line(e)


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


@dataclass
class Node:
    node_id: str
    ip: str
    head: bool
    resources: dict[str, float]


@dataclass
class Cluster:
    address: str
    nodes: list[Node] = field(default_factory=list)

    def total(self, name: str) -> float:
        return sum(n.resources.get(name, 0.0) for n in self.nodes)

    def describe(self) -> str:
        parts = [f"{len(self.nodes)} node(s)"]
        for name in ("CPU", "GPU", "TPU"):
            if self.total(name):
                parts.append(f"{self.total(name):g} {name}")
        return ", ".join(parts)


def read_cluster(address: str) -> Cluster:
    """The cluster's alive nodes and what each offers, read from the cluster (Ray's state API)."""
    # heavy: Ray's state API client
    from ray.util.state import list_nodes

    try:
        nodes = list_nodes(address=address, detail=True, raise_on_missing_output=False)
    except Exception as e:  # the state API raises its own RayStateApiException for HTTP failures
        raise TrainerError(f"--engine verl: cannot read the nodes of the Ray cluster at {address} "
                           f"({_first_line(e)})") from None
    alive = [Node(n.node_id, n.node_ip, bool(n.is_head_node), dict(n.resources_total or {}))
             for n in nodes if n.state == "ALIVE"]
    return Cluster(address, sorted(alive, key=lambda n: not n.head))


def choose_device(cluster: Cluster, asked: str) -> str:
    """The device the cluster offers: the recipe's trainer.device when it names one the cluster has,
    else GPUs (cuda), then TPUs (tpu), else the CPU. Never this machine's."""
    offered = [d for d, res in (("cuda", "GPU"), ("tpu", "TPU")) if cluster.total(res) > 0]
    if asked in ("cuda", "tpu"):
        if asked not in offered:
            res = "GPU" if asked == "cuda" else "TPU"
            raise UserError(f"trainer.device={asked}: the Ray cluster at {cluster.address} has no {res} "
                            f"({cluster.describe()}); leave trainer.device=auto to train on what it has")
        return asked
    return offered[0] if offered else "cpu"


# The Ray resource each of VeRL's trainer processes holds, by device. On a CPU cluster the CPU
# platform plugin counts CPUs (tpu_pipeline.rl.verl_cpu_platform.CLUSTER_SLOT_ENV).
SLOT = {"cuda": "GPU", "tpu": "TPU", "cpu": "CPU"}


def check_fit(cluster: Cluster, device: str, nnodes: int, per_node: int) -> None:
    """UserError (exit 2) when `nnodes` nodes with `per_node` trainer slots each are not there."""
    res = SLOT[device]
    fit = [n for n in cluster.nodes if n.resources.get(res, 0.0) >= per_node]
    if len(fit) < nnodes:
        raise UserError(f"the Ray cluster at {cluster.address} cannot hold the trainer: it asks {nnodes} node(s) "
                        f"with {per_node} {res} each (--nnodes, --gpus-per-node), the cluster has {len(fit)} such "
                        f"node(s) ({cluster.describe()})")


def _package_dirs() -> list[tuple[str, Path]]:
    """(package, folder) of each shipped package as this interpreter imports it."""
    out = []
    for name in SHIPPED:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"--ray-address: {name} cannot be found to ship with the job")
        out.append((name, Path(list(spec.submodule_search_locations)[0])))
    return out


def stage_project(dest: Path) -> Path:
    """dest/tpu_pipeline: the project's shipped packages in one folder (a py_modules entry), laid
    out as they import (the repository maps rl/, train/, kernels/ into tpu_pipeline)."""
    root = dest / "tpu_pipeline"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name, folder in _package_dirs():
        target = root.joinpath(*name.split(".")[1:])
        if target.exists():  # an installed wheel: the sub-package came with its parent
            continue
        shutil.copytree(folder, target, ignore=ignore)
    return root


def reward_module_path(module: str) -> Path | None:
    """The file or package folder of a reward module that is not part of the project (it must
    travel with the job); None for the project's own rewards."""
    if module == "tpu_pipeline" or module.startswith("tpu_pipeline."):
        return None
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or spec.origin is None:
        raise UserError(f"--reward {module}: the module cannot be found here to ship with the job")
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# The entrypoint: the interpreter the head's raylet starts Ray workers with (this script's parent is
# Ray's job supervisor, a Ray worker; its parent is the raylet, whose --python_worker_command names it).
RUN_SH = """\
#!/bin/sh
# Written by tpu-pipeline for one `rl --engine verl --ray-address` job; run by Ray on the head node.
# The interpreter Ray runs on here: the raylet, an ancestor of this script (it started Ray's job
# supervisor), starts every Ray worker with it (its --python_worker_command).
PY= pid=$$
for _ in 1 2 3 4 5 6; do
  pid=$(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ')
  [ -n "$pid" ] && [ "$pid" != 0 ] || break
  PY=$(tr '\\0' '\\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n 's/^--python_worker_command=\\([^ ]*\\).*/\\1/p')
  [ -n "$PY" ] && break
done
[ -x "$PY" ] || PY=$(command -v python3 || command -v python)
"$PY" - <<'EOF' || exit 3
import importlib.util as u, os, sys
out, nonce = os.environ["TPU_PIPELINE_OUT"], os.environ["TPU_PIPELINE_NONCE"]
if u.find_spec("verl") is None:
    print("{refused} the cluster's python (%s) has no verl: the nodes need VeRL and its dependencies "
          "(docs/rl.md, 'On a Ray cluster')" % sys.executable, flush=True)
    sys.exit(3)
try:
    seen = open(os.path.join(out, "verl", "cluster_nonce")).read().strip()
except OSError:
    seen = None
if seen != nonce:
    print("{refused} the head node does not see this run's folder %s: --out must be on storage the "
          "cluster's nodes share (checkpoints and metrics are written there)" % out, flush=True)
    sys.exit(3)
print("{provenance} python %s; tpu_pipeline from %s; verl from %s" % (sys.executable,
      u.find_spec("tpu_pipeline").origin, u.find_spec("verl").origin), flush=True)
EOF
exec "$PY" -m verl.trainer.main_ppo {overrides}
"""


def write_entrypoint(stage: Path, overrides: list[str]) -> str:
    """stage/run.sh for `overrides`; returns the entrypoint command."""
    text = (RUN_SH.replace("{refused}", REFUSED).replace("{provenance}", PROVENANCE)
            .replace("{overrides}", " ".join(shlex.quote(o) for o in overrides)))
    (stage / "run.sh").write_text(text)
    return "sh run.sh"


def runtime_env(stage: Path, project: Path, extra_modules: list[Path], env_vars: dict[str, str]) -> dict:
    # every value a string: Ray's runtime_env takes env_vars as str -> str
    return {"working_dir": str(stage), "py_modules": [str(project), *map(str, extra_modules)],
            "env_vars": {k: str(v) for k, v in env_vars.items()}}


def display_command(address: str, submission_id: str, env: dict, entrypoint: str, python: str) -> str:
    """The equivalent `ray job submit` line, for the user (no token: it never is in `env`)."""
    ray = Path(python).parent / "ray"
    shown = {**env, "working_dir": "<staged run folder>", "py_modules": ["<tpu_pipeline>"] +
             [Path(p).name for p in env.get("py_modules", [])[1:]]}
    return shlex.join([str(ray) if ray.is_file() else "ray", "job", "submit", "--address", address,
                       "--submission-id", submission_id, "--runtime-env-json", json.dumps(shown, sort_keys=True),
                       "--", *entrypoint.split()])


def submit(client, *, entrypoint: str, runtime_env: dict, submission_id: str, log: Callable[[str], None],
           wait_s: float = AGENT_WAIT_S) -> str:
    """client.submit_job, retried while the head's job agent is still starting (bounded)."""
    deadline, told = time.monotonic() + wait_s, False
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env, submission_id=submission_id)
        except RuntimeError as e:
            if AGENT_BUSY not in str(e) or time.monotonic() > deadline:
                if AGENT_BUSY in str(e):
                    raise TrainerError(f"--engine verl: the Ray head at {client.get_address()} has had no job "
                                       f"agent for {wait_s:g} s ({AGENT_BUSY}); is its dashboard agent "
                                       "running?") from None
                raise TrainerError(f"--engine verl: the Ray cluster refused the job ({_first_line(e)})") from None
            if not told:
                log(f"the Ray head's job agent is still starting; retrying the submission for up to {wait_s:g} s")
                told = True
            time.sleep(2.0)


TERMINAL = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 130}


def follow(client, submission_id: str, log_path: Path, *, log: Callable[[str], None],
           on_poll: Callable[[], None] = lambda: None,
           stop_when: Callable[[], str | None] = lambda: None) -> Outcome:
    """Streams the job's logs into `log_path` and `log` until it ends; Ctrl-C, SIGTERM or a
    `stop_when()` reason stops the job on the cluster (its checkpoints stay) before returning
    or re-raising."""
    t0, seen, stopped = time.monotonic(), 0, None
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def pull() -> None:
        nonlocal seen
        try:
            text = client.get_job_logs(submission_id)
        except Exception:  # a dashboard hiccup: the next poll reads on
            return
        if len(text) > seen:
            new = text[seen:]
            with open(log_path, "a") as f:
                f.write(new)
            for line in new[: new.rfind("\n") + 1].splitlines():
                log(f"  | {line}")
            seen += new.rfind("\n") + 1

    with _terminate_as_interrupt():
        try:
            while True:
                status = str(client.get_job_status(submission_id)).split(".")[-1]
                pull()
                on_poll()
                if status in TERMINAL:
                    break
                stopped = stop_when()
                if stopped:
                    stop(client, submission_id, log)
                    status = "STOPPED"
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            stop(client, submission_id, log)
            pull()
            raise
    pull()
    on_poll()
    return Outcome(TERMINAL[status], time.monotonic() - t0, [], stopped)


def stop(client, submission_id: str, log: Callable[[str], None]) -> str:
    """`ray job stop`: asks the cluster to stop the job and waits (bounded) until it has."""
    log(f"stopping Ray job {submission_id} on the cluster")
    try:
        client.stop_job(submission_id)
    except Exception as e:
        log(f"warning: the cluster did not take the stop request ({_first_line(e)})")
        return "UNKNOWN"
    deadline = time.monotonic() + STOP_WAIT_S
    status = "UNKNOWN"
    while time.monotonic() < deadline:
        status = str(client.get_job_status(submission_id)).split(".")[-1]
        if status in TERMINAL:
            log(f"Ray job {submission_id}: {status}")
            return status
        time.sleep(POLL_S)
    log(f"warning: Ray job {submission_id} is still {status} {STOP_WAIT_S:g} s after the stop request")
    return status


def refusal(log_path: Path) -> str | None:
    """The line run.sh printed when the cluster cannot run the job as asked, if it did."""
    try:
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith(REFUSED):
                return line[len(REFUSED):].strip()
    except OSError:
        pass
    return None


def job_actor_nodes(address: str, job_id: str) -> dict[str, str]:
    """{actor class name + pid: node id} of the job's actors, from the cluster's state API."""
    from ray.util.state import list_actors

    actors = list_actors(address=address, filters=[("job_id", "=", job_id)], detail=True, limit=1000,
                         raise_on_missing_output=False)
    return {f"{a.class_name}:{a.pid}": a.node_id for a in actors}
