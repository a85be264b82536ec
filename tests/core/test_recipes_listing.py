"""`tpu-pipeline recipes`: every shipped train and rl recipe, with its one-line
description and expected cost read from the recipe's own TOML fields."""

from __future__ import annotations

import json
import tomllib

from click.testing import CliRunner

from tpu_pipeline.cli import cli
from tpu_pipeline.recipes import STAGES, cost_text, list_recipes, recipe_dir, recipe_names


def test_every_recipe_is_listed_with_a_description_and_a_declared_cost():
    rows = {(r["stage"], r["name"]): r for r in list_recipes()}
    shipped = {(s, n) for s in STAGES for n in recipe_names(s)}
    assert set(rows) == shipped
    assert {("train", "countdown_lm"), ("rl", "dapo_math"), ("rl", "grpo_countdown"), ("rl", "grpo_math")} <= shipped
    for (stage, name), r in rows.items():
        data = tomllib.loads((recipe_dir(stage) / f"{name}.toml").read_text())
        assert r["description"] and "\n" not in r["description"], name
        # the cost is data in the recipe, commented like every field (0 = not measured)
        assert "expected_minutes_cpu" in data and "expected_minutes_gpu" in data, name
        assert r["expected_minutes_cpu"] == (data["expected_minutes_cpu"] or None)


def test_cost_fields_load_through_the_typed_recipes():
    from tpu_pipeline.rl.recipe import fingerprint, load_recipe
    from tpu_pipeline.train.runner import load_recipe as load_train

    cfg = load_recipe("grpo_countdown")
    assert cfg.expected_minutes_cpu == 10.4
    assert "expected_minutes_cpu" not in fingerprint(cfg)  # a cost estimate never blocks a --resume
    _, r = load_train("countdown_lm")
    assert r.expected_minutes_cpu == 3.1 and r.expected_minutes_gpu == 0.0


def test_cost_text():
    assert cost_text({"expected_minutes_cpu": 8.0, "expected_minutes_gpu": None}) == "~8 min CPU"
    assert cost_text({"expected_minutes_cpu": 1.5, "expected_minutes_gpu": 0.5}) == "~1.5 min CPU, ~0.5 min GPU"
    assert cost_text({"expected_minutes_cpu": None, "expected_minutes_gpu": None}) == "?"


def test_cli_table_and_json():
    res = CliRunner().invoke(cli, ["recipes"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].split() == ["stage", "recipe", "cost", "description"]
    by_name = {ln.split()[1]: ln for ln in lines[1:]}
    assert set(by_name) == {r["name"] for r in list_recipes()}
    assert "~8 min CPU" in by_name["grpo_math"] and by_name["dapo_math"].split()[0] == "rl"
    assert "DAPO" in by_name["dapo_math"]
    res = CliRunner().invoke(cli, ["recipes", "--json"])
    rows = json.loads(res.output)
    assert {r["name"] for r in rows} == set(by_name) and all("expected_minutes_cpu" in r for r in rows)


def test_registries_lists_every_registry_with_where_each_entry_is_defined():
    import importlib
    from pathlib import Path

    r = CliRunner().invoke(cli, ["recipes", "--registries", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["kind"]: row for row in json.loads(r.output)}
    assert set(rows) >= {"command", "train task", "rl task source", "rl reward", "kernel model family",
                         "LM recipe", "model kind", "LM family", "target"}
    assert {"train", "rl", "convert"} <= {e["name"] for e in rows["command"]["entries"]}
    assert {e["name"] for e in rows["target"]["entries"]} == {"android", "android-npu", "ios", "desktop", "web", "iot"}
    for row in rows.values():
        assert row["how_to_add"] and row["entries"], row["kind"]
        for e in row["entries"]:
            assert e["description"] and "\n" not in e["description"], (row["kind"], e)
            where = e["defined_in"]
            assert Path(where).is_file() if where.endswith(".toml") else importlib.import_module(where), where
