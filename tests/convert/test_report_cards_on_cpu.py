"""report.html leads with the answer (convert/report.py): a card per target, details folded below.

The report here is written by hand in report.json's schema, with the two cases a user meets
most: a float target that ships, and an iot target refused because its int8 output clips
(figures shaped like the clipped pitch model's: issue 33's output that stops at 0.815 while
the model reaches 1.05, accuracy 0.54 int8 vs 0.97 PyTorch). The cards are checked as text,
then rendered in headless Chromium: every card in the first screen, the details closed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from tpu_pipeline.convert.report import render_html
from tpu_pipeline.convert.runtimes.browser import CHROMIUM_FLAGS, chromium_path

REPORT = {
    "model": "pitch_net",
    "source_format": "model.pt",
    "samples": 64,
    "sample_source": "--eval-data",
    "wall_s": 41.2,
    "targets": {
        "desktop": {
            "passed": True, "quantization": "float32", "size_bytes": 412_160, "runtime": "ai-edge-litert (XNNPACK)",
            "artifact": "dist/pitch_net/desktop/model.tflite",
            "latency_ms": {"artifact": 0.081, "torch_eager": 0.52},
            "chosen_because": "the only precision desktop allows (float32)",
            "parity": {"outputs": {"pitch": {"max_abs": 2e-6, "rmse": 4e-7, "cosine": 0.9999999, "snr_db": 120.0}},
                       "task_score": {"metric": "accuracy", "score": 0.969, "interval": [0.93, 0.986],
                                      "torch_score": 0.969, "torch_interval": [0.93, 0.986], "drop": 0.0,
                                      "drop_interval": [0.0, 0.0], "max_drop": 0.005, "passed": True,
                                      "rows": 256, "runtime": "ai-edge-litert"}},
            "errors": [], "warnings": [],
        },
        "iot": {
            "passed": False, "quantization": "static_int8", "size_bytes": 104_512, "runtime": "tflite-micro",
            "latency_ms": {"artifact": 0.91, "torch_eager": 0.52},
            "parity": {
                "outputs": {"pitch": {"max_abs": 0.24, "rmse": 0.08, "cosine": 0.981, "snr_db": 14.2}},
                "task_score": {"metric": "accuracy", "score": 0.54, "interval": [0.48, 0.6], "torch_score": 0.969,
                               "torch_interval": [0.93, 0.986], "drop": 0.43, "drop_interval": [0.37, 0.49],
                               "max_drop": 0.01, "passed": False, "rows": 256, "runtime": "tflite-micro"},
                "int8_ranges": {"rows": 256, "checked": 14, "outputs_capped": [
                    {"tensor": "pitch", "int8_reached": [-0.02, 0.815], "float_range": [-0.03, 1.05]}],
                    "clipped": [{"tensor": f"t{i}", "module": f"conv{i}", "role": "activation", "op": "CONV_2D",
                                 "float_range": [0, 2.0], "representable": [0, 1.5], "int8_reached": [0, 1.5],
                                 "outside_share": 0.03} for i in range(10)]},
            },
            "errors": ["task accuracy drops by 0.43 (bound 0.01)"] + [f"conv{i} clips" for i in range(10)],
            "warnings": [],
        },
    },
}


def test_cards_lead_with_the_verdict_and_what_to_do():
    page = render_html(REPORT)
    cards = re.findall(r"<div class='card (\w+)' data-target='(\w+)'>(.*?)</div>", page, re.S)
    assert [(c[0], c[1]) for c in cards] == [("ship", "desktop"), ("refuse", "iot")]
    desktop, iot = cards[0][2], cards[1][2]
    assert "ships" in desktop and "float32" in desktop and "412,160 bytes" in desktop
    assert "0.081 ms vs PyTorch 0.52 ms (6.4x faster)" in desktop and "accuracy 0.969 (95% CI 0.93 to 0.986)" in desktop
    assert "ship dist/pitch_net/desktop/model.tflite" in desktop
    assert "refused" in iot and "static_int8" in iot and "0.91 ms vs PyTorch 0.52 ms (1.8x slower)" in iot and "accuracy 0.54" in iot
    assert "int8 output pitch stops at 0.815 while the model reaches 1.05" in iot
    assert "give --calib rows that cover what the device will see" in iot
    # the cards come before the details, which are folded
    assert page.index("class='cards'") < page.index("<details>") < page.index("parity per output")


def test_a_minimal_report_still_renders_its_cards():
    page = render_html({"model": "m", "targets": {"android": {"passed": False, "parity": {}}}})
    assert "android: refused" in page and "failed (no reason recorded)" in page and "see the details below" in page


# Runs in the page after it is laid out: where each card sits, and whether the details are open.
PROBE = """<script>
const cards = [...document.querySelectorAll('.card')].map(c => {
  const r = c.getBoundingClientRect();
  return {target: c.dataset.target, top: r.top, bottom: r.bottom, width: r.width};
});
document.body.setAttribute('data-probe', JSON.stringify({cards, viewport: window.innerHeight,
  details_open: document.querySelector('details').open}));
</script></body>"""


@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None, reason="no Chromium (apt-get install chromium, or set TPU_PIPELINE_CHROMIUM)")
def test_cards_are_the_first_screen_in_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(REPORT).replace("</body>", PROBE))
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,800",
                              "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120)
    found = re.search(r'data-probe="([^"]*)"', dom.stdout)
    assert found, dom.stderr[-2000:]
    probe = json.loads(found.group(1).replace("&quot;", '"'))
    assert [c["target"] for c in probe["cards"]] == ["desktop", "iot"]
    for card in probe["cards"]:
        assert 0 < card["top"] < card["bottom"] <= probe["viewport"] and card["width"] > 200, probe
    assert probe["details_open"] is False
    # the screenshot in docs/convert/verdict.md is this page: TPU_PIPELINE_REPORT_SCREENSHOT=path writes it
    if os.environ.get("TPU_PIPELINE_REPORT_SCREENSHOT"):
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium_path(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1000,420",
                            f"--screenshot={Path(os.environ['TPU_PIPELINE_REPORT_SCREENSHOT']).resolve()}",
                            (tmp_path / "report.html").as_uri()], capture_output=True, timeout=120, check=True)
