"""Accelerator code paths of the loop, exercised on CPU with stand-ins:
bf16 autocast (CPU autocast in place of a bf16 device), the DDP backend and
device choice per platform (a fake CUDA platform, a fake process group)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tpu_pipeline.device import select_device
from tpu_pipeline.errors import NotBuiltError
from tpu_pipeline.train import distributed, runner


def test_bf16_autocast_path_trains_and_keeps_fp32_weights(tmp_path, monkeypatch):
    cpu = select_device("cpu")
    bf16_cpu = dataclasses.replace(cpu, bf16=True)  # as a TPU/Ampere platform reports it
    monkeypatch.setattr("tpu_pipeline.select_device", lambda kind="auto": bf16_cpu)
    seen = []
    real = torch.autocast

    def spy(*a, **kw):
        seen.append(kw.get("dtype"))
        return real(*a, **kw)

    monkeypatch.setattr(torch, "autocast", spy)
    cfg = {"loop.steps": 4, "loop.log_every": 2, "loop.batch_size": 16}
    runner.run("digits_cnn", tmp_path / "bf", overrides=cfg)
    assert seen and set(seen) == {torch.bfloat16}
    sd = torch.load(tmp_path / "bf/model.pt", weights_only=True)["state_dict"]
    assert all(v.dtype == torch.float32 for v in sd.values())
    rows = [json.loads(x) for x in (tmp_path / "bf/metrics.jsonl").read_text().splitlines()]
    assert all(r["loss"] == r["loss"] for r in rows)  # finite, not NaN
    seen.clear()
    runner.run("digits_cnn", tmp_path / "nobf", overrides={**cfg, "loop.bf16": False})
    assert not seen


def test_process_group_backend_and_device_per_platform(monkeypatch):
    cpu = select_device("cpu")
    cuda = dataclasses.replace(cpu, kind="cuda", device=torch.device("cuda"))
    tpu = dataclasses.replace(cpu, kind="tpu", device=torch.device("cpu"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    calls = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend: calls.append(backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(f"cuda:{i}"))
    info = distributed.init(cpu)
    assert (info.rank, info.world, info.local_rank, info.main) == (1, 2, 1, False)
    assert calls == ["gloo"]
    calls.clear()
    distributed.init(cuda)
    assert calls == ["cuda:1", "nccl"]
    assert distributed.device_for(cuda, info) == torch.device("cuda", 1)
    assert distributed.device_for(cpu, info) == torch.device("cpu")
    with pytest.raises(NotBuiltError, match="data-parallel training on TPU is not built yet"):
        distributed.init(tpu)


def test_single_process_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.init(select_device("cpu")) == distributed.DistInfo()
