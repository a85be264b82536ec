"""A short, fixed fuzz run of the loaders and the CLI (issue 19 item 6; the 10,000-input
measurement is bench/fuzz_convert.py). hypothesis draws damaged .pt2, model.pt, state_dict,
malicious-pickle and .npz inputs (tpu_pipeline.testing.fuzz_inputs) with a derandomized seed
and a small example budget. Each input stays cheap: the loader runs in process, and the CLI
runs through CliRunner with only its load stage (the float export is replaced by a stop, exit 3).
Every input must end in a documented exit code without a traceback, leave no file outside
--out, and never unpickle the malicious seed (no --trust-pickle is passed)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tpu_pipeline.testing import fuzz_inputs as F


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    seeds, man = F.build_seeds(root / "seeds")
    return seeds, man, root


def _check(o: F.Outcome, allowed: set[int]) -> None:
    assert o.traceback is None, o.traceback
    assert o.exit_code in allowed, o.exit_code
    assert not o.outside, o.outside
    assert not o.pickle_ran, "the malicious pickle ran without --trust-pickle"
    assert not o.backstop, "typed only by a catch-all: a case the loader should name"


FUZZ = settings(max_examples=120, derandomize=True, deadline=None, database=None, phases=["generate", "shrink"],
                suppress_health_check=list(HealthCheck))


def test_fuzz_loaders_in_process(seeds):
    seeds, man, root = seeds

    @FUZZ
    @given(F.damaged(seeds))
    def one(case):
        s, data, _how = case
        _check(F.run_loader(s, data, root, man), {0, 2})

    one()


def test_fuzz_cli_load_stage(seeds):
    seeds, man, root = seeds

    @settings(FUZZ, max_examples=80)
    @given(F.damaged(seeds))
    def one(case):
        s, data, _how = case
        _check(F.run_cli(s, data, root, man), {2, 3})  # 3: loaded, stopped before the export

    with F.load_stage_only():
        one()


def test_the_seeds_load_and_the_pickle_is_refused(seeds):
    """The fuzz starts from inputs that work (or are refused for the right reason)."""
    seeds, man, root = seeds
    for name, s in seeds.items():
        o = F.run_loader(s, s.data, root, man)
        _check(o, {2} if name.startswith("pickle") else {0})  # pickle, pickle_pt2: refused
