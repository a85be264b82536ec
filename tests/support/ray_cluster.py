"""A Ray cluster of two nodes on loopback, started the plain way, for tests and benchmarks.

    cluster = start_cluster(ray_bin)          # `ray start --head` + `ray start --address`
    ... cluster.address (http://127.0.0.1:PORT, the job API), cluster.client_env() ...
    cluster.stop()                            # by process id: never `ray stop`

As a user on Ray 2.60 would: a token made with `ray get-auth-token --generate` in the
cluster's own HOME (never the user's ~/.ray), which `ray start --head` finds and turns token
authentication on with; the worker node joins with RAY_AUTH_MODE=token (without it Ray
refuses it: "Authentication token is missing or incorrect"). Both nodes declare CPUs only
(`--num-cpus`, no GPUs) and run with `--block`, so each node is one process id to stop.
Every process of the cluster (GCS, raylets, dashboard, Ray workers, a job's actors)
inherits a marker in its environment and a temporary folder of the cluster's own; `stop` SIGTERMs the two `ray start` processes and
then stops by id whatever still carries the marker (rl.verl_launch.stop_all), so another
Ray on this machine is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tpu_pipeline.rl.verl_launch import MARKER, stop_all, survivors

# Variables of the calling shell that would point Ray elsewhere than this cluster's own HOME.
RAY_VARS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_API_SERVER_ADDRESS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayCluster:
    root: Path
    ray: Path
    gcs_port: int
    dashboard_port: int
    marker: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def token(self) -> str:
        return (self.home / ".ray" / "auth_token").read_text().strip()

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
        return {**env, "HOME": str(self.home), "RAY_USAGE_STATS_ENABLED": "0"}

    def client_env(self, *, home: Path, token: str | None) -> dict[str, str]:
        """A submitting shell: its own HOME (no ~/.ray/auth_token there), the token in RAY_AUTH_TOKEN
        (None: no token at all), and no RAY_AUTH_MODE."""
        env = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
        env["HOME"] = str(home)
        if token is not None:
            env["RAY_AUTH_TOKEN"] = token
        return env

    def get(self, path: str) -> dict:
        req = urllib.request.Request(self.address + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def alive_nodes(self) -> list[dict]:
        try:
            rows = self.get("/api/v0/nodes?detail=true")["data"]["result"]["result"]
        except OSError:
            return []
        return [n for n in rows if n.get("state") == "ALIVE"]

    def job(self, submission_id: str) -> dict:
        return self.get(f"/api/jobs/{submission_id}")

    def stop(self) -> list[int]:
        """Stops the nodes by process id; returns the ids of any cluster process left (none)."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        left = stop_all(self.marker, grace_s=10.0)
        shutil.rmtree(self.root, ignore_errors=True)
        return left

    def processes(self) -> list[int]:
        return survivors(self.marker)


def start_cluster(ray: Path, *, head_cpus: int = 4, worker_cpus: int = 4, wait_s: float = 240.0) -> RayCluster:
    # a short root: Ray's session sockets must stay under the 107 bytes a Unix socket path allows
    root = Path(tempfile.mkdtemp(prefix="tpc-", dir="/tmp"))
    cluster = RayCluster(root, ray, free_port(), free_port(), uuid.uuid4().hex)
    # TMPDIR: what the cluster's processes (vLLM's sockets and file store, VeRL's locks) leave stays in root
    env = {**cluster.base_env(), MARKER: cluster.marker, "TMPDIR": str(root / "tmp")}
    cluster.home.mkdir()
    (root / "tmp").mkdir()
    subprocess.run([str(ray), "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=120)
    common = ["--block", "--node-ip-address", "127.0.0.1", "--temp-dir", str(root / "r"),
              "--disable-usage-stats"]
    head = [str(ray), "start", "--head", "--port", str(cluster.gcs_port), "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(cluster.dashboard_port), "--ray-client-server-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--num-cpus", str(head_cpus), *common]
    worker = [str(ray), "start", "--address", f"127.0.0.1:{cluster.gcs_port}", "--num-cpus", str(worker_cpus),
              "--dashboard-agent-listen-port", str(free_port()), *common]
    try:
        with open(root / "head.log", "wb") as log:
            cluster.procs.append(subprocess.Popen(head, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL))
        _wait(lambda: len(cluster.alive_nodes()) >= 1, wait_s, cluster, "the head node")
        with open(root / "worker.log", "wb") as log:
            cluster.procs.append(subprocess.Popen(worker, env={**env, "RAY_AUTH_MODE": "token"}, stdout=log,
                                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        _wait(lambda: len(cluster.alive_nodes()) >= 2, wait_s, cluster, "the worker node")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ready, wait_s: float, cluster: RayCluster, what: str) -> None:
    deadline = time.monotonic() + wait_s
    while not ready():
        dead = [p.args[2] for p in cluster.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "".join((cluster.root / n).read_text(errors="replace")[-2000:]
                           for n in ("head.log", "worker.log") if (cluster.root / n).is_file())
            raise RuntimeError(f"{what} did not come up ({'exited' if dead else 'timeout'}): {logs}")
        time.sleep(1.0)
