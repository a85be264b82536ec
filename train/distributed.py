"""Data parallelism through PyTorch's own engine (torchrun + DistributedDataParallel).

`--nproc N` re-launches the same run under `torch.distributed.run` (what
`torchrun` is); each process joins a process group (gloo on CPU, nccl on
CUDA) and trains a shard of every global batch. Running `torchrun -m
tpu_pipeline.train.worker ...` by hand works the same way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tpu_pipeline.errors import (ConversionError, DivergedError, NotBuiltError, ParityError, PipelineError,
                                  UserError)


@dataclasses.dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def init(platform) -> DistInfo:
    """Joins the process group torchrun set up; single process otherwise."""
    if not under_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return DistInfo()
    if platform.kind == "tpu":
        raise NotBuiltError("data-parallel training on TPU is not built yet (use --nproc 1)")
    info = DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    if platform.kind == "cuda":
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if platform.kind == "cuda" else "gloo")
    return info


def device_for(platform, info: DistInfo):
    if platform.kind == "cuda":
        return torch.device("cuda", info.local_rank)
    return platform.device


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


STATUS_ENV = "TPU_PIPELINE_WORKER_STATUS"  # file where the first failing worker leaves its error
_ERRORS = {e.exit_code: e for e in (UserError, ConversionError, ParityError, DivergedError)}


def report_failure(e: PipelineError) -> None:
    """In a worker: leave the error for the launcher (torchrun itself exits 1 whatever the worker's
    code, so a diverged run would otherwise look like a bug). The first rank to fail wins."""
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    try:
        with open(path, "x") as f:
            json.dump({"exit_code": e.exit_code, "message": str(e), "rank": os.environ.get("RANK", "0")}, f)
    except FileExistsError:
        pass


def launch(nproc: int, kwargs: dict) -> None:
    """Runs `tpu_pipeline.train.worker` in `nproc` processes; raises if any fails, with the failing
    worker's own error class and message (DivergedError: exit 5, bad input: 2)."""
    env = dict(os.environ)
    # Share the cores instead of each process grabbing all of them.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-workers-") as tmp:
        # --log-dir: torchrun's per-rank error files; without it torchrun makes a torchelastic_* folder
        # in /tmp at every launch and never removes it
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               f"--log-dir={tmp}/torchrun", "-m", "tpu_pipeline.train.worker", json.dumps(kwargs)]
        status = Path(tmp) / "failure.json"
        env[STATUS_ENV] = str(status)
        rc = subprocess.call(cmd, env=env)
        failure = json.loads(status.read_text()) if status.exists() else None
    if rc != 0 and failure:
        raise _ERRORS.get(failure["exit_code"], PipelineError)(f"{failure['message']} (process {failure['rank']})")
    if rc != 0:
        raise PipelineError(f"data-parallel training failed: torchrun exited {rc} (see the worker output above)")
