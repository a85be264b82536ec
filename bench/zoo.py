"""The real-architecture zoo through `tpu-pipeline convert --targets all`.

Each member of tpu_pipeline.testing.zoo (tests/support/zoo.py: transformers configs, trained-like
random weights, nothing downloaded) is saved as a torch.export archive of
the tensor-returning wrapper a user writes, converted by the CLI exactly as
a user runs it (one child process per model), and converted once more by a
bare `litert_torch.convert(module, args).export(path)` (its own child
process), so the table shows what the tool adds. A third probe feeds the
bare Hugging Face model's own export (returning its ModelOutput) to
`convert --targets desktop` (issue 11 item 2d).

Writes OUT/zoo.json and OUT/zoo.md: per model and target pass/fail, cosine,
size, latency, the failure reason; the bare export's result and time.

CPU command (about 25 minutes for the bench size on 2 shared cores):
    nice -n 5 .venv/bin/python bench/zoo.py --out runs/bench_zoo
    .venv/bin/python bench/zoo.py --size tiny --models resnet,bert --out /tmp/zoo   # a minute
    .venv/bin/python bench/zoo.py --size tiny --models beit,roberta --out /tmp/zoo   # zoo.EXTRA, beyond make test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tpu_pipeline.testing import zoo

REPO = Path(__file__).resolve().parents[1]
TARGETS = ("android", "ios", "desktop", "web", "iot")



def cli() -> list[str]:
    exe = Path(sys.executable).with_name("tpu-pipeline")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tpu_pipeline.cli"]


def run_convert(model: Path, out: Path, targets: str, timeout: float, *extra: str) -> dict:
    """The CLI as a user runs it; -> exit code, wall seconds, the report (or the error line)."""
    cmd = [*cli(), "convert", str(model), "--targets", targets, "--out", str(out), "--json", *extra]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"exit": None, "wall_s": timeout, "error": f"timed out after {timeout:.0f} s", "report": None}
    wall = time.perf_counter() - t
    report = None
    if "{" in p.stdout:
        try:
            report = json.loads(p.stdout[p.stdout.index("{"):])
        except json.JSONDecodeError:
            pass
    if report is None and (out / "report.json").exists():
        report = json.loads((out / "report.json").read_text())
    err_lines = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(("W1", "I1", "WARNING"))]
    return {"exit": p.returncode, "wall_s": wall, "report": report,
            "error": err_lines[-1][:400] if p.returncode and err_lines else None}


def target_row(t: dict) -> dict:
    par = t.get("parity") or {}
    lat = t.get("latency_ms") or {}
    row = {"passed": bool(t.get("passed")), "failure": t.get("failure"), "quantization": t.get("quantization"),
           "size_bytes": t.get("size_bytes"), "cosine": par.get("cosine"), "cosine_mean": par.get("cosine_mean"),
           "max_abs": par.get("max_abs"), "top1": par.get("top1"), "latency_ms": lat.get("artifact"),
           "torch_ms": lat.get("torch_eager"), "diagnosis": par.get("diagnosis"),
           "first_divergence": (par.get("first_divergence") or {}).get("module"),
           "browser": None, "reason": (t.get("errors") or [None])[0], "timings_s": t.get("timings_s")}
    browser = par.get("browser")
    if isinstance(browser, dict):
        row["browser"] = "skipped" if browser.get("skipped") else {"passed": browser.get("passed"),
                                                                   "cosine": browser.get("cosine")}
    return row


def bare_child(name: str, size: str, path: Path) -> None:
    """Child process: one bare litert_torch export, then its float artifact on ai-edge-litert vs PyTorch."""
    built = zoo.build(name, size)
    res = {"ok": False}
    t = time.perf_counter()
    try:
        import litert_torch  # heavy: pulls in the TF-lite converters

        litert_torch.convert(built.module, built.sample_args).export(str(path))
        res.update(ok=True, seconds=time.perf_counter() - t, size_bytes=path.stat().st_size)
    except Exception as e:  # noqa: BLE001 - the probe records any failure
        res.update(seconds=time.perf_counter() - t, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                   if str(e) else type(e).__name__)
    if res["ok"]:
        try:
            from ai_edge_litert.interpreter import Interpreter  # heavy: native runtime

            runner = Interpreter(model_path=str(path)).get_signature_runner()
            keys = list(runner.get_input_details())
            x = built.sample_batch(1)
            got = list(runner(**{k: a.numpy().astype(np.int32 if not a.is_floating_point() else np.float32)
                                 for k, a in zip(keys, x)}).values())[0]
            with torch.no_grad():
                want = built.module(*x).numpy()
            a, b = want.ravel().astype(np.float64), np.asarray(got).ravel().astype(np.float64)
            res["cosine"] = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
            res["max_abs"] = float(np.abs(a - b).max())
        except Exception as e:  # noqa: BLE001
            res["run_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    print("BARE " + json.dumps(res))


def run_bare(name: str, size: str, path: Path, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--bare-child", name, "--size", size, "--out", str(path)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("BARE ")), None)
    if line is None:
        return {"ok": False, "error": f"child exited {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:300]}"}
    return json.loads(line[5:])


def measured_tree() -> dict:
    """Which tpu_pipeline the CLI runs (a worktree when measuring an older commit) and its commit."""
    code = "import pathlib, tpu_pipeline.convert.pipeline as p; print(pathlib.Path(p.__file__).resolve())"
    # cwd away from the repo: `python -c` puts cwd first on sys.path, the CLI's script does not
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/").stdout.strip()
    folder = Path(where).parent if where else REPO
    def git(*a):
        return subprocess.run(["git", "-C", str(folder), *a], capture_output=True, text=True).stdout.strip()
    return {"pipeline_file": where, "commit": git("rev-parse", "--short", "HEAD"),
            "convert_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "."))}


def one(name: str, size: str, out: Path, a) -> dict:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    built = zoo.build(name, size)
    st = zoo.stats(built)
    pt2 = zoo.save_pt2(built, d / "model.pt2")
    res = {"model": name, "size": size, "task": built.member.task, "stats": st,
           "params": sum(p.numel() for p in built.hf_model.parameters()),
           "inputs": [f"{list(x.shape)}:{str(x.dtype).replace('torch.', '')}" for x in built.sample_args]}
    print(f"[{name}] {res['params'] / 1e6:.2f}M params, inputs {res['inputs']}: convert --targets all", flush=True)
    c = run_convert(pt2, d / "dist", "all", a.timeout)
    rep = c["report"] or {}
    res["convert"] = {"exit": c["exit"], "wall_s": c["wall_s"], "error": c["error"],
                      "targets": {n: target_row(t) for n, t in (rep.get("targets") or {}).items()}}
    print(f"[{name}] exit {c['exit']} in {c['wall_s']:.0f} s: "
          + ", ".join(f"{n} {'ok' if t['passed'] else 'FAIL'}" for n, t in res["convert"]["targets"].items()), flush=True)
    if not a.no_bare:
        res["bare"] = run_bare(name, size, d / "bare.tflite", a.timeout)
        print(f"[{name}] bare litert_torch: {res['bare']}", flush=True)
    if not a.no_raw:
        try:
            raw = zoo.save_raw_hf_pt2(built, d / "hf_raw.pt2")
            r = run_convert(raw, d / "dist_raw", "desktop", a.timeout, "--no-latency", "--samples", "4")
            t = ((r["report"] or {}).get("targets") or {}).get("desktop")
            res["raw_hf_pt2"] = {"exit": r["exit"], "error": r["error"], "desktop": target_row(t) if t else None}
        except Exception as e:  # noqa: BLE001 - torch.export of the bare HF model itself may fail
            res["raw_hf_pt2"] = {"exit": None, "error": f"torch.export of the HF model failed: {type(e).__name__}: "
                                                        f"{str(e).splitlines()[0][:200] if str(e) else ''}"}
        print(f"[{name}] raw HF .pt2 -> desktop: exit {res['raw_hf_pt2']['exit']} {res['raw_hf_pt2']['error'] or ''}",
              flush=True)
    return res


def _mb(n):
    return f"{n / 2**20:.2f} MB" if n is not None else "-"


def _short(text: str | None, n: int = 80) -> str:
    text = re.sub(r"^(Error: )?\S+\.pt2: ", "", text or "")  # the file's path says nothing here
    return text if len(text) <= n else text[:n - 3] + "..."


def cell(t: dict | None) -> str:
    if t is None:
        return "-"
    cos = f"cos {t['cosine']:.6f}" if t.get("cosine") is not None else "no parity"
    lat = f"{t['latency_ms']:.2f} ms" if t.get("latency_ms") else ""
    if t["passed"]:
        return f"pass, {cos}, {_mb(t['size_bytes'])}, {lat}".rstrip(", ")
    return f"**FAIL** ({t.get('failure')}), {cos}, {_mb(t['size_bytes'])}"


def markdown(results: dict) -> str:
    lines = [f"Measured {results['date']} on {results['machine']['cpu']} ({results['machine']['cores']} cores), "
             f"tpu_pipeline at commit {results['tree']['commit']}"
             f"{' (convert/ modified)' if results['tree']['convert_dirty'] else ''}, size `{results['size']}`.",
             f"Command: `{results['command']}`", "",
             "| model | params | " + " | ".join(TARGETS) + " | bare litert_torch | HF ModelOutput .pt2 |",
             "|---|---|" + "---|" * len(TARGETS) + "---|---|"]
    for r in results["models"]:
        c = r.get("convert") or {}
        ts = c.get("targets") or {}
        if not ts and c:
            row = [f"**no report** (exit {c.get('exit')}): {_short(c.get('error'), 120)}"] + [""] * (len(TARGETS) - 1)
        else:
            row = [cell(ts.get(n)) for n in TARGETS]
        b = r.get("bare")
        bare = "-" if b is None else (f"ok ({b['seconds']:.0f} s, cos {b['cosine']:.6f})" if b.get("ok") and "cosine" in b
                                      else f"ok ({b['seconds']:.0f} s)" if b.get("ok") else f"**fails**: {_short(b.get('error'))}")
        raw = r.get("raw_hf_pt2")
        rawc = "-" if raw is None else ("loads, desktop " + ("pass" if (raw.get("desktop") or {}).get("passed") else "FAIL")
                                        if raw.get("desktop") else f"exit {raw.get('exit')}: {_short(raw.get('error'))}")
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f}M | " + " | ".join(row) + f" | {bare} | {rawc} |")
    passed = {n: sum(1 for r in results["models"] if ((r.get("convert") or {}).get("targets") or {}).get(n, {}).get("passed"))
              for n in TARGETS}
    lines += ["", "Passed per target: " + ", ".join(f"{n} {passed[n]}/{len(results['models'])}" for n in TARGETS), "",
              "Failure reasons (first error line per failing target):", ""]
    for r in results["models"]:
        for n, t in ((r.get("convert") or {}).get("targets") or {}).items():
            if not t["passed"]:
                extra = "; ".join(x for x in (t.get("diagnosis"), f"top1 {t['top1']}" if t.get("top1") is not None else None,
                                             f"max_abs {t['max_abs']:.3g}" if t.get("max_abs") is not None else None,
                                             f"first diverging layer {t['first_divergence']}" if t.get("first_divergence")
                                             else None) if x)
                lines.append(f"- {r['model']} / {n}: {t.get('reason')}" + (f" ({extra})" if extra else ""))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help="comma list (default: every zoo member)")
    ap.add_argument("--size", default="bench", choices=("tiny", "bench"))
    ap.add_argument("--out", default="runs/bench_zoo")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per conversion")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare litert_torch export")
    ap.add_argument("--no-raw", action="store_true", help="skip the HF ModelOutput .pt2 probe")
    ap.add_argument("--render", default=None, metavar="ZOO_JSON", help="only print the markdown table of a zoo.json")
    ap.add_argument("--bare-child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bare_child:
        return bare_child(a.bare_child, a.size, Path(a.out))
    if a.render:
        return print(markdown(json.loads(Path(a.render).read_text())), end="")
    names = a.models.split(",") if a.models else zoo.names()
    unknown = [n for n in names if n not in zoo.MEMBERS and n not in zoo.EXTRA]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join([*zoo.MEMBERS, *zoo.EXTRA])} "
                 "(zoo.EXTRA: --size tiny only)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "size": a.size,
               "command": " ".join([Path(sys.executable).name, "bench/zoo.py", *sys.argv[1:]]),
               "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "python": platform.python_version(), "torch": torch.__version__},
               "tree": measured_tree(), "models": []}
    for name in names:
        t = time.perf_counter()
        try:
            r = one(name, a.size, out, a)
        except Exception as e:  # noqa: BLE001 - a builder failing is a row, not the end of the run
            r = {"model": name, "size": a.size, "params": 0, "error": f"{type(e).__name__}: {e}"}
        r["total_s"] = time.perf_counter() - t
        results["models"].append(r)
        (out / "zoo.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "zoo.md").write_text(markdown(results))
    if a.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        print(markdown(results))


if __name__ == "__main__":
    main()
