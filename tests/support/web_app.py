"""Runs an app file the converter wrote for the web (a JavaScript module that imports
@litertjs/core) in headless Chromium, the way a web app would: served over HTTP beside the
model, LiteRT.js from the installed npm package, the page posting what the module returned."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tpu_pipeline.convert.runtimes import browser

PAGE = """<!doctype html><meta charset=utf-8>
<script type="importmap">
{"imports": {"@litertjs/core": "./node_modules/@litertjs/core/dist/index.js",
             "@litertjs/wasm-utils": "./node_modules/@litertjs/wasm-utils/dist/index.js"}}
</script>
<script type="module">
import {loadLiteRt} from '@litertjs/core';
const post = r => fetch('./result', {method: 'POST', body: JSON.stringify(r)});
try {
  await loadLiteRt('./node_modules/@litertjs/core/wasm/');
  const app = await import('./%(module)s');
  const calls = await (await fetch('./calls.json')).json();
  const results = [];
  for (const [fn, args] of calls) {
    try {
      const outs = await app[fn](...args.map(([type, values]) => type ? globalThis[type].from(values) : values));
      const row = {};
      for (const [name, t] of Object.entries(outs)) {
        const host = await t.moveTo('wasm');
        row[name] = Array.from(host.toTypedArray());
        host.delete();
      }
      results.push({ok: true, outputs: row});
    } catch (e) {
      results.push({ok: false, error: String(e && e.message || e)});
    }
  }
  await post({ok: true, results});
} catch (e) {
  await post({ok: false, error: String((e && e.stack) || e)});
}
</script>"""


def run_app_module(folder: Path, module: str, calls: list[tuple[str, list]], timeout: float = 120) -> list[dict]:
    """Each (exported function, [(typed array type or None, values), ...]) of `folder`/`module`,
    called in turn in Chromium with `folder`'s files beside it; per call its outputs by name
    (float lists) or its error."""
    with tempfile.TemporaryDirectory(prefix="tpp-webapp-") as tmp:
        site = Path(tmp) / "site"
        shutil.copytree(folder, site)
        (site / "node_modules").symlink_to(browser.litertjs_dir())
        (site / "index.html").write_text(PAGE % {"module": module})
        (site / "calls.json").write_text(json.dumps(calls))
        result = browser._serve_and_wait(site, Path(tmp) / "profile", timeout)
    assert result.get("ok"), result.get("error")
    return result["results"]
