from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Literal

import numpy as np
import pytest
import torch

from tpu_pipeline import UserError
from tpu_pipeline.config import load
from tpu_pipeline.files import append_jsonl, atomic_write_json, sha256_file, staged_dir
from tpu_pipeline.registry import REGISTRIES, Registry


@dataclasses.dataclass(kw_only=True)
class Opt:
    lr: float = 1e-3
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.95])


@dataclasses.dataclass(kw_only=True)
class Cfg:
    name: str
    steps: int = 10
    kind: Literal["a", "b"] = "a"
    opt: Opt = dataclasses.field(default_factory=Opt)


def test_load_toml_with_overrides(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text('name = "x"  # the name\nsteps = 5\n[opt]\nlr = 2e-4\n')
    cfg = load(Cfg, p, {"opt.lr": "3e-4", "kind": "b"})
    assert cfg == Cfg(name="x", steps=5, kind="b", opt=Opt(lr=3e-4))


@pytest.mark.parametrize("data,msg", [
    ({"name": "x", "stepz": 1}, "unknown key 'stepz'; valid keys: kind, name, opt, steps"),
    ({"name": "x", "steps": "many"}, "steps: expected an integer, got 'many'"),
    ({"name": "x", "kind": "c"}, "kind: 'c' is not one of 'a', 'b'"),
    ({"name": "x", "opt": {"lr": True}}, "opt: lr: expected a number"),
    ({}, "missing 1 required keyword-only argument: 'name'"),
])
def test_bad_config_values(data, msg):
    with pytest.raises(UserError, match=msg):
        load(Cfg, data)


def test_bad_toml_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = \n")
    with pytest.raises(UserError, match="not valid TOML"):
        load(Cfg, p)


def test_registry():
    reg = Registry("target", listed=False)
    reg.add("ios", 1, "Apple phones", defined_in="ios.toml")

    @reg.register("web")
    def web():
        """Browsers through LiteRT.js.

        More text that is not the description."""

    assert reg.get("ios") == 1 and reg.names() == ["ios", "web"]
    assert [(e.name, e.description, e.defined_in) for e in reg.entries()] == [
        ("ios", "Apple phones", "ios.toml"), ("web", "Browsers through LiteRT.js.", __name__)]
    with pytest.raises(ValueError, match="already registered"):
        reg.add("ios", 2, "again")
    with pytest.raises(ValueError, match="needs a one-line description"):
        reg.register("bare")(lambda: None)
    assert "bare" not in reg
    with pytest.raises(UserError, match="unknown target 'iot'; valid: ios, web"):
        reg.get("iot")
    assert reg not in REGISTRIES
    listed = Registry("listed kind")
    try:
        assert REGISTRIES[-1] is listed
    finally:
        REGISTRIES.remove(listed)  # other tests list every registry


def test_staged_dir_keeps_old_output_on_failure(tmp_path):
    out = tmp_path / "dist"
    with staged_dir(out) as d:
        atomic_write_json(d / "a.json", {"v": 1})
    with pytest.raises(RuntimeError):
        with staged_dir(out) as d:
            (d / "a.json").write_text("half")
            raise RuntimeError("boom")
    assert (out / "a.json").read_text().strip().startswith("{")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"]
    assert len(sha256_file(out / "a.json")) == 64


def test_json_files_are_standard_json_with_non_finite_figures_as_null(tmp_path):
    # JavaScript's JSON.parse and Swift's JSONDecoder refuse Infinity and NaN, and apps read model.json
    figures = {"snr_db": math.inf, "cosine": 1.0, "worst": np.float32("nan"), "rows": [np.float64(-np.inf), 2],
               "grid": np.array([[1.5, np.nan]]), "loss": torch.tensor(float("nan")), "steps": np.int64(3)}
    want = {"snr_db": None, "cosine": 1.0, "worst": None, "rows": [None, 2], "grid": [[1.5, None]], "loss": None,
            "steps": 3}

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not standard JSON"))

    atomic_write_json(tmp_path / "report.json", figures)
    append_jsonl(tmp_path / "metrics.jsonl", figures)
    assert strict((tmp_path / "report.json").read_text()) == want
    assert strict((tmp_path / "metrics.jsonl").read_text()) == want


def test_written_files_are_readable_like_any_file_the_umask_allows(tmp_path):
    # mkstemp's 0600 and mkdtemp's 0700 left the output unreadable to a web server serving the folder
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "model.json", {"v": 1})
        with staged_dir(tmp_path / "dist") as d:
            atomic_write_json(d / "report.json", {"v": 1})
        os.umask(0o077)
        atomic_write_json(tmp_path / "private.json", {"v": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "model.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "dist").stat().st_mode & 0o777 == 0o755  # the output folder, not mkdtemp's 0700
    assert (tmp_path / "dist" / "report.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.json").stat().st_mode & 0o777 == 0o600
