"""One `rl --engine verl --ray-address` run as a Ray job: what it ships, how it runs, what it leaves.

`ClusterJob` is the cluster side of `verl_bridge.launch`: `relocate` points VeRL's overrides at
the files the job carries (the parquet data and the policy travel in the job's working_dir and
are named relative to it, since every Ray worker starts there on its own node; checkpoints and
metrics stay absolute paths in OUT, on storage the nodes share), `run` stages the runtime_env
(tpu_pipeline.rl.verl_cluster), submits and follows the job, and `facts` records what the run
was (the submission id, the cluster's python and where the project was imported from on the
head, the nodes the job's actors ran on) for eval.json.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from tpu_pipeline.files import atomic_write_json, atomic_write_text
from tpu_pipeline.rl.recipe import RLConfig
from tpu_pipeline.rl.rewards import reward_location
from tpu_pipeline.rl.verl_cluster import (PROVENANCE, SHIP_POLICY_MAX_BYTES, Cluster, display_command, folder_bytes,
                                          follow, job_actor_nodes, reward_module_path, runtime_env, stage_project,
                                          submit, write_entrypoint)
from tpu_pipeline.rl.verl_cpu_platform import CLUSTER_SLOT_ENV, ENV as CPU_ENV
from tpu_pipeline.rl.verl_launch import Outcome

ENTRYPOINT = "sh run.sh"


class ClusterJob:
    def __init__(self, address: str, cfg: RLConfig, out: Path, device: str, cluster: Cluster | None):
        self.address, self.cfg, self.out, self.device, self.cluster = address, cfg, out.resolve(), device, cluster
        self.submission_id = f"tpu-pipeline-{cfg.name}-{uuid.uuid4().hex[:8]}"
        self.facts: dict = {"ray_address": address, "ray_submission_id": self.submission_id}
        self.ship_policy = True

    def relocations(self, policy: Path) -> dict[str, str]:
        """The overrides the job runs with over the local ones: its data and policy from its
        working_dir, its metrics in a file this process follows, a Hugging Face copy in each checkpoint."""
        self.ship_policy = not policy.is_dir() or folder_bytes(policy) <= SHIP_POLICY_MAX_BYTES
        out = {"data.train_files": "train.parquet", "data.val_files": "val.parquet", "trainer.logger": "[console,file]",
               "actor_rollout_ref.actor.checkpoint.save_contents": "[model,optimizer,extra,hf_model]"}
        if self.ship_policy:
            out["actor_rollout_ref.model.path"] = "policy"
        return out

    def env_vars(self) -> dict[str, str]:
        """What the job's driver and every worker it starts need in their environment."""
        env = {"VERL_FILE_LOGGER_PATH": str(self.out / "verl" / "metrics.jsonl"), "PYTHONUNBUFFERED": "1",
               "RAY_DEDUP_LOGS": "0", "TPU_PIPELINE_OUT": str(self.out), "TPU_PIPELINE_NONCE": self.submission_id}
        if self.device == "cpu":
            env.update(CPU_ENV)
            if self.cluster is None or self.cluster.total("GPU") == 0:
                env.update(CLUSTER_SLOT_ENV)  # VeRL's pools count CPUs: no fake GPUs on the nodes
        if self.device == "tpu":
            env["VERL_PLATFORM"] = "tpu"
        if self.cfg.trainer.threads > 0:
            env["OMP_NUM_THREADS"] = str(self.cfg.trainer.threads)
        return env

    def _env_shown(self) -> dict:
        return {"working_dir": ".", "py_modules": ["tpu_pipeline"], "env_vars": self.env_vars()}

    def command(self, ov: list[str]) -> str:
        return display_command(self.address, self.submission_id, self._env_shown(), ENTRYPOINT, "ray")

    def run(self, client, ov: list[str], policy: Path, *, log: Callable[[str], None], log_path: Path,
            on_poll: Callable[[], None], stop_when: Callable[[], str | None]) -> Outcome:
        vdir = self.out / "verl"
        atomic_write_text(vdir / "cluster_nonce", self.submission_id)  # run.sh checks the head sees OUT
        with tempfile.TemporaryDirectory(prefix="tpjob-") as tmp:
            stage = Path(tmp, "run")
            stage.mkdir()
            for name in ("train.parquet", "val.parquet"):
                shutil.copy2(vdir / name, stage / name)
            if self.ship_policy:
                shutil.copytree(policy, stage / "policy")
            else:
                log(f"policy {policy} is over {SHIP_POLICY_MAX_BYTES >> 20} MiB: the job names its path, which the "
                    "nodes must see (shared storage)")
            extra = []
            module = reward_module_path(reward_location(self.cfg.trainer.reward)[0])
            if module is not None and module.is_file():
                shutil.copy2(module, stage / module.name)  # the working_dir is on every worker's path
            elif module is not None:
                extra.append(module)
            write_entrypoint(stage, ov)
            env = runtime_env(stage, stage_project(Path(tmp, "pkg")), extra, self.env_vars())
            # the upload happens inside submit: the staged folder may go once it returns
            submit(client, entrypoint=ENTRYPOINT, runtime_env=env, submission_id=self.submission_id, log=log)
        atomic_write_json(vdir / "job.json", {"address": self.address, "submission_id": self.submission_id,
                                              "device": self.device})
        log(f"submitted Ray job {self.submission_id} to {self.address}; Ctrl-C stops it on the cluster")
        try:
            outcome = follow(client, self.submission_id, log_path, log=log, on_poll=on_poll, stop_when=stop_when)
        finally:
            self._record(client, log_path)
        return outcome

    def _record(self, client, log_path: Path) -> None:
        """facts: the head's python and imports (run.sh's line), the nodes the job's actors ran on."""
        try:
            for line in log_path.read_text(errors="replace").splitlines():
                if line.startswith(PROVENANCE):
                    self.facts["cluster_python"] = line[len(PROVENANCE):].strip()
                    break
        except OSError:
            pass
        try:
            job_id = client.get_job_info(self.submission_id).job_id
            nodes = job_actor_nodes(self.address, job_id) if job_id else {}
        except Exception as e:  # the record is a report, not the run: say what could not be read
            self.facts["actor_nodes_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            return
        self.facts["actor_nodes"] = nodes
        self.facts["nodes_used"] = len(set(nodes.values()))
        atomic_write_json(self.out / "verl" / "job.json", {"address": self.address,
                                                           "submission_id": self.submission_id,
                                                           "device": self.device, **self.facts})
