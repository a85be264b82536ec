"""Runs a MediaPipe task module the converter wrote for the web (convert/snippets/mediapipe.js.tmpl)
in headless Chromium, as a web app would: served over HTTP beside model.tflite, MediaPipe Tasks for
the web from the installed npm packages (convert/web), the page posting each row's categories."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tpu_pipeline.convert.runtimes import browser

PAGE = """<!doctype html><meta charset=utf-8>
<script type="importmap">
{"imports": {"@mediapipe/tasks-vision": "./node_modules/@mediapipe/tasks-vision/vision_bundle.mjs",
             "@mediapipe/tasks-audio": "./node_modules/@mediapipe/tasks-audio/audio_bundle.mjs",
             "@mediapipe/tasks-text": "./node_modules/@mediapipe/tasks-text/text_bundle.mjs"}}
</script>
<script type="module">
const post = r => fetch('./result', {method: 'POST', body: JSON.stringify(r)});
try {
  const app = await import('./%(module)s');
  const job = await (await fetch('./job.json')).json();
  const classifier = await app[job.create]();
  const results = [];
  for (const row of job.rows) {
    const input = job.kind === 'image' ? new ImageData(Uint8ClampedArray.from(row.rgba), row.width, row.height)
                : job.kind === 'audio' ? Float32Array.from(row) : row;
    results.push(app.classify(classifier, input).map(c => [c.index, c.score, c.categoryName]));
  }
  await post({ok: true, results});
} catch (e) {
  await post({ok: false, error: String((e && e.stack) || e)});
}
</script>"""


def classify_in_chromium(folder: Path, module: str, task: str, kind: str, rows: list, timeout: float = 180) -> list:
    """`folder`/`module`'s create<task>() and classify() on each row (image: {"rgba", "width",
    "height"}; audio: samples; text: a sentence) -> per row its [index, score, label] categories."""
    with tempfile.TemporaryDirectory(prefix="tpp-mediapipe-web-") as tmp:
        site = Path(tmp) / "site"
        shutil.copytree(folder, site)
        (site / "node_modules").symlink_to(browser.litertjs_dir())
        (site / "index.html").write_text(PAGE % {"module": module})
        (site / "job.json").write_text(json.dumps({"create": f"create{task}", "kind": kind, "rows": rows}))
        result = browser._serve_and_wait(site, Path(tmp) / "profile", timeout)
    assert result.get("ok"), result.get("error")
    return result["results"]
