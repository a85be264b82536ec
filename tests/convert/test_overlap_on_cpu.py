"""Targets in threads taking turns (convert/runtimes/overlap.py) and one browser per conversion
(browser.session): the order of the parent's work is fixed, a stopped conversion leaves no child
process and no files, and a browser that cannot start fails its target with the reason."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import tpu_pipeline.convert as tc
from tpu_pipeline.convert.runtimes import browser, overlap
from tpu_pipeline.convert.runtimes.browser import browser_unavailable
from tpu_pipeline.testing.processes import descendants

needs_browser = pytest.mark.skipif(browser_unavailable() is not None,
                                   reason=f"browser runtime: {browser_unavailable()}")


def test_turns_go_lowest_rank_first_and_pass_on_while_waiting():
    turns, log = overlap.Turns(3), []
    child_done = threading.Event()

    def target(name, wait_on=None):
        log.append(f"{name} start")
        if wait_on is not None:
            with overlap.waiting():  # stands for a child process working
                log.append(f"{name} waits")
                child_done.wait(5)
            log.append(f"{name} back")
        if name == "b":
            child_done.set()  # a's child finishes during b's turn: a asks for its turn back meanwhile
            time.sleep(0.3)
        log.append(f"{name} end")

    # started in the worst order: c (rank 2) first, a (rank 0) last
    threads = [threading.Thread(target=turns.run, args=(2, target, "c")),
               threading.Thread(target=turns.run, args=(1, target, "b")),
               threading.Thread(target=turns.run, args=(0, target, "a", True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    # a, then b while a waits on its child; a takes its turn back before c, the highest rank
    assert log[:4] == ["a start", "a waits", "b start", "b end"], log
    assert log[4:] == ["a back", "a end", "c start", "c end"], log
    assert overlap.turn_wait_s() == 0.0  # this thread never waited for a turn


def test_cancelled_turns_start_no_more_work():
    turns, ran = overlap.Turns(1), []
    turns.cancel()
    with pytest.raises(overlap.Cancelled):
        turns.run(0, ran.append, 1)
    assert ran == []
    with overlap.waiting():  # outside a turn: nothing to hand on
        pass


def _cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 10)).eval(), (torch.randn(1, 1, 8, 8),)


@needs_browser
def test_an_interrupted_conversion_leaves_no_process_and_no_files(tmp_path):
    net, x = _cnn()
    before = descendants()
    seen = []

    def say(msg):
        seen.append(msg)
        # android's GPU worker and web's browser jobs are in flight while ios has its turn
        if msg.startswith("ios: compatibility"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tc.convert(net, x, targets="all", out=tmp_path / "out", progress=say)
    assert any(m.startswith("web: parity") for m in seen) and any(m.startswith("android: parity") for m in seen)
    assert descendants() <= before  # Chromium, its helpers and the GPU worker all ended and were reaped
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert not browser._active


@needs_browser
def test_a_browser_that_cannot_start_fails_web_with_its_reason(tmp_path, monkeypatch):
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TPU_PIPELINE_CHROMIUM", str(fake))
    net, x = _cnn()
    before = descendants()
    result = tc.convert(net, x, targets="web", out=tmp_path / "out", latency=False)
    web = result.targets["web"]
    assert not web.passed and not result.passed
    assert any("browser exited (status 3)" in e for e in web.errors), web.errors
    assert not (tmp_path / "out" / "web" / "model.tflite").exists()  # only under failed/
    assert (tmp_path / "out" / "web" / "failed" / "model.tflite").exists()
    assert descendants() <= before
