"""report.json is written by the pipeline; this renders report.html for people.

It leads with the answer: one card per target (ships or refused, precision, bytes, latency
against PyTorch, the task score with its interval, one line of why and one of what to do).
The details fold below: a table per target (with the candidates measured and the layers kept
in float32) and a plot of the parity error per target and output."""

from __future__ import annotations

import html
import math


def _svg_bars(labels: list[str], values: list[float], passed: list[bool], title: str) -> str:
    """A log-scale bar chart as inline SVG (no plotting library: it took seconds to import and lay out)."""
    w, h, pad, bw = max(360, 70 * len(values) + 60), 240, 50, 40
    # NaN/inf (an artifact that computes NaN) draws as a full-height bar; its value stays in the tooltip
    finite = [math.log10(max(v, 1e-12)) for v in values if math.isfinite(v)]
    lo, hi = math.floor(min(finite + [-8])), math.ceil(max(finite + [0]))
    logs = [math.log10(max(v, 1e-12)) if math.isfinite(v) else hi for v in values]
    span = max(hi - lo, 1)

    def y(v):
        return pad + (h - 2 * pad) * (hi - v) / span

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-size='10' font-family='sans-serif'>",
             f"<text x='{w / 2}' y='16' text-anchor='middle' font-size='12'>{html.escape(title)}</text>"]
    for k in range(lo, hi + 1):
        parts.append(f"<line x1='{pad}' x2='{w - 10}' y1='{y(k):.1f}' y2='{y(k):.1f}' stroke='#eee'/>"
                     f"<text x='{pad - 4}' y='{y(k) + 3:.1f}' text-anchor='end'>1e{k}</text>")
    for i, (lab, v, raw, ok) in enumerate(zip(labels, logs, values, passed)):
        x = pad + 10 + i * 70
        top = y(v)
        parts.append(f"<rect x='{x}' y='{top:.1f}' width='{bw}' height='{max(h - pad - top, 1):.1f}' "
                     f"fill='{'#2a9d8f' if ok else '#e76f51'}'><title>{html.escape(lab)}: {raw:.3g}</title></rect>")
        for j, line in enumerate(lab.split("/")):
            parts.append(f"<text x='{x + bw / 2}' y='{h - pad + 12 + 11 * j}' text-anchor='middle'>{html.escape(line)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _plot(report: dict) -> str | None:
    labels, rmse, one_minus_cos, passed = [], [], [], []
    for tname, t in report["targets"].items():
        for oname, m in (t.get("parity") or {}).get("outputs", {}).items():
            labels.append(f"{tname}/{oname}")
            rmse.append(m["rmse"])
            one_minus_cos.append(1 - m["cosine"])
            passed.append(t["passed"])
    if not labels:
        return None
    return (_svg_bars(labels, rmse, passed, "RMSE vs PyTorch (log scale)") +
            _svg_bars(labels, one_minus_cos, passed, "1 - cosine vs PyTorch (log scale)"))


def _cell(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "; ".join(map(str, v))
    if isinstance(v, dict):  # {op: count}: the ops a candidate leaves outside XNNPACK
        return ", ".join(f"{k} x{n}" for k, n in v.items()) or "none"
    return "-" if v is None else str(v)


def _interval(m: dict, key: str) -> str:
    ci = m.get(key + "_interval")
    return f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""


def _kind_figures(m: dict) -> str:
    """The output's kind and the figures it is judged by (convert/verdict/output_kinds.py)."""
    kind = m.get("kind", "unknown")
    parts = [f"<br><b>kind: {html.escape(kind if kind != 'unknown' else 'kind unknown (judged numerically)')}</b>"]
    if "top1_judged" in m:
        parts.append(f"top-1 agreement {m['top1_judged']:.3f}{_interval(m, 'top1_judged')}, flips {m['flip_rate']:.1%} "
                     f"({m['top1_near_ties']} near-ties) of {m['top1_rows']} rows")
    if "prob_max_abs" in m:
        parts.append(f"probability error {m['prob_error']:.3g} (largest per row, mean over rows), worst {m['prob_max_abs']:.3g}, mean {m['prob_mean_abs']:.3g}")
    if "rel_err" in m:
        parts.append(f"error / reference spread: {m['rel_err']:.3g} (largest per row, mean over rows), worst {m['rel_err_max']:.3g}, mean {m['rel_err_mean']:.3g}")
    if "nn_agreement" in m:
        parts.append(f"nearest-neighbour agreement {m['nn_agreement']:.3f}{_interval(m, 'nn_agreement')}")
    if "pixel_agreement" in m:
        parts.append(f"per-pixel argmax agreement {m['pixel_agreement']:.4f}")
    if "psnr_db" in m:
        parts.append(f"PSNR {m['psnr_db']:.1f} dB")
    return parts[0] + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")


def _choice(t: dict) -> str:
    """What convert measured to pick this target's artifact: every candidate side by side
    (columns are whatever the model kind measured: size, latency, cosine, token agreement ...),
    why the winner won, and the layers kept in float32 by the accuracy-aware rounds."""
    e, parts = html.escape, []
    cands = t.get("candidates") or []
    if cands:
        cols = list(dict.fromkeys(k for c in cands for k in c if k != "chosen"))
        head = "".join(f"<th>{e(k)}</th>" for k in cols)
        body = "".join("<tr" + (" class='chosen'" if c.get("chosen") else "") + ">" + "".join(
            f"<td>{e(_cell(c.get(k)))}</td>" for k in cols) + "</tr>" for c in cands)
        parts.append(f"<table class='cands'><tr>{head}</tr>{body}</table>")
    if t.get("chosen_because"):
        parts.append(f"<p>chosen: {e(t['chosen_because'])}</p>")
    plan = t.get("xnnpack") or {}
    if "partitions" in plan:  # the shipped variant's CPU plan (runtimes/delegation.py)
        left = ", ".join(f"{op} x{n}" for op, n in plan["left"].items()) or "none"
        parts.append(f"<p>XNNPACK: {plan['partitions']} partition(s), {plan['delegated']} of {plan['ops']} ops; "
                     f"left to other kernels: {e(left)}</p>")
    repairs = _int8_repairs(t.get("int8_repairs"))
    if repairs:
        parts.append(repairs)
    kept = t.get("kept_float")
    if kept:
        rounds = "".join(f"<li>kept {e(str(r.get('kept')))}: {'pass' if r.get('passed') else 'fail'}, "
                         f"cosine {_cell(r.get('cosine'))}, {_cell(r.get('size_bytes'))} bytes</li>"
                         for r in kept.get("rounds", []))
        parts.append(f"<p>layers kept in float32: {e(', '.join(kept.get('layers', [])))} "
                     f"({'passes' if kept.get('passed') else 'still fails'}; +{kept.get('bytes_added', 0)} bytes)</p>"
                     f"<ol>{rounds}</ol>")
    return "".join(parts)


def _int8_ranges(r: dict | None) -> str:
    """The static-int8 range check (int8_ranges.py): each clipped tensor with its float and int8
    ranges and the share of values outside (outputs first), or that none clips."""
    if not r:
        return ""
    e = html.escape
    if "skipped" in r:
        return f"<b>int8 range check: not done</b> ({e(r['skipped'])})"
    if not r.get("clipped") and not r.get("outputs_capped"):
        return f"int8 ranges: none clips the float model over {r['rows']} rows ({r['checked']} tensors)"
    rows = "".join(
        f"<li>{'<b>' if c['role'] == 'output' else ''}{e(c['module'] or c['tensor'])}{'</b>' if c['role'] == 'output' else ''}"
        f" ({e(c['role'])}, {e(c['op'])}): float [{c['float_range'][0]:.4g}, {c['float_range'][1]:.4g}], int8 holds "
        f"[{c['representable'][0]:.4g}, {c['representable'][1]:.4g}], reached [{c['int8_reached'][0]:.4g}, "
        f"{c['int8_reached'][1]:.4g}]; {c['outside_share']:.2%} of values outside</li>" for c in r["clipped"][:6])
    capped = "".join(f"<li><b>output {e(c['tensor'])} reaches [{c['int8_reached'][0]:.4g}, {c['int8_reached'][1]:.4g}] "
                     f"in int8</b> (float [{c['float_range'][0]:.4g}, {c['float_range'][1]:.4g}])</li>"
                     for c in r.get("outputs_capped", []))
    more = len(r["clipped"]) - 6
    return (f"int8 ranges clip the float model on {len(r['clipped'])} of {r['checked']} tensors over {r['rows']} rows:"
            f"<ul>{capped}{rows}{f'<li>{more} more</li>' if more > 0 else ''}</ul>")


def _int8_repairs(rep: dict | None) -> str:
    """The accuracy-aware rounds for clipped int8 ranges: each repair, tried or why not, with its cost."""
    if not rep:
        return ""
    e, items = html.escape, []
    for x in rep["repairs"]:
        if not x.get("tried"):
            items.append(f"<li>{e(x['repair'])}: not tried ({e(x['why'])})</li>")
            continue
        lat = (f", latency {_cell(x.get('latency_ms_before'))} -> {_cell(x.get('latency_ms'))} ms"
               if x.get("latency_ms") is not None else ", latency not measured")
        items.append(f"<li>{e(x['repair'])}: {'pass' if x['passed'] else 'fail'}, {x['bytes_added']:+d} bytes{lat}, "
                     f"cosine {_cell(x.get('cosine_mean'))}, {x['clipped_after']} tensors still clip"
                     + (f" ({e(x['errors'][0])})" if x.get("errors") and not x["passed"] else "") + "</li>")
    chosen = f"chosen: {e(rep['chosen'])}" if rep.get("chosen") else "<b>no repair passes</b>"
    return f"<p>int8 range repairs ({chosen}):</p><ul>{''.join(items)}</ul>"


def _accelerators(p: dict) -> str:
    """One line per accelerator check (GPU accelerator, WebGPU) and the float16 emulation, each
    saying which check it is: an accelerator run on SwiftShader proves kernels and coverage in
    float32; the emulation judges a phone GPU's float16 precision."""
    e, lines = html.escape, []
    for key, label in (("gpu_accelerator", "GPU accelerator run"), ("webgpu", "WebGPU run (LiteRT.js)")):
        a = p.get(key)
        if not a:
            continue
        if not a.get("done"):
            lines.append(f"<b>{label}: not done</b> ({e(str(a.get('reason')))})")
            continue
        cover = ("fully accelerated" if a.get("fully_accelerated") else
                 "partly accelerated: " + (", ".join(a.get("fallback_ops") or []) or "unnamed ops") + " on the CPU")
        dev = a.get("adapter") or "unknown device"
        dev = " ".join(filter(None, (dev.get("vendor"), dev.get("architecture")))) if isinstance(dev, dict) else dev
        lines.append(f"{label} ({e(str(dev))}): "
                     f"{'pass' if a.get('passed') else '<b>FAIL</b>'}, {cover}, max_abs {a['max_abs']:.3g}, "
                     f"cos {a['cosine']:.6f}, vs the CPU run {a['max_abs_vs_cpu']:.3g}")
    f16 = p.get("float16_activations")
    if f16 and f16.get("measured"):
        worst = f16.get("first_nonfinite") or f16.get("first_lossy")
        lines.append("float16 emulation (phone precision, PyTorch): "
                     + (f"first {'inf/NaN' if f16.get('first_nonfinite') else 'lossy'} layer {e(str(worst))}"
                        if worst else "no layer loses precision"))
    judged = p.get("judged")  # which check is task-scored and which numeric (task_score.checks_judged)
    if judged:
        lines.append("judged: " + "; ".join(f"{JUDGED_LABELS.get(k, k)}: {e(v)}" for k, v in judged.items()))
    return "<br>".join(lines)


JUDGED_LABELS = {"cpu": "CPU run", "browser": "browser (wasm)", "gpu_accelerator": "GPU accelerator",
                 "webgpu": "WebGPU", "float16_activations": "float16 emulation"}


def _ci(ci) -> str:
    return f" (95% CI {ci[0]:.4g} to {ci[1]:.4g})" if ci else ""


def _kinds(report: dict) -> str:
    """Each output's kind and what it was inferred from (report.json's output_kinds)."""
    kinds = report.get("output_kinds") or {}
    items = "".join(f"<li>{html.escape(n)}: <b>{html.escape(k.get('kind', 'unknown'))}</b> "
                    f"({html.escape(k.get('source', ''))})</li>" for n, k in kinds.items())
    return f"<p>Output kinds:</p><ul>{items}</ul>" if items else ""


def _task(t: dict | None, where: str = "") -> str:
    """The task score over the labelled eval set (task_score.py): the artifact's with its interval,
    PyTorch's, the drop with its paired interval, the profile's bound and the verdict."""
    if not t:
        return ""
    e = html.escape
    head = f"<b>task {e(t['metric'])}{e(where)}</b> over {t['rows']} labelled rows on {e(t['runtime'])}: "
    if "score" not in t:
        return head + f"<b>FAIL</b>: {e(t.get('reason', ''))}"
    return (head + f"{t['score']:.4g}{_ci(t['interval'])} vs PyTorch {t['torch_score']:.4g}{_ci(t['torch_interval'])}; "
            f"drop {t['drop']:.4g}{_ci(t['drop_interval'])}{' ' + e(t['unit']) if t.get('unit') else ''}, bound "
            f"{t['max_drop']:g}{' (' + e(t['max_drop_from']) + ')' if t.get('max_drop_from') else ''}: "
            + ("pass" if t["passed"] else "<b>FAIL</b>"))


def _task_parity(p: dict) -> str:
    """The task line(s) of a target, and the numeric verdict it overrode, if any."""
    lines = [_task(p.get("task_score")), _task((p.get("browser") or {}).get("task_score"), " in the browser")]
    nv = p.get("numeric_verdict")
    if nv and p.get("task_score"):
        lines.append("numeric parity (reported; with labels the task decides): "
                     + ("pass" if nv["passed"] else "would fail: " + html.escape("; ".join(nv["reasons"][:2]))))
    return "<br>".join(x for x in lines if x)


def _why(t: dict) -> str:
    """One line: why this target ships or is refused."""
    p = t.get("parity") or {}
    if t.get("passed"):
        if t.get("chosen_because"):
            return str(t["chosen_because"])
        cos = [m.get("cosine") for m in (p.get("outputs") or {}).values() if m.get("cosine") is not None]
        return f"matches PyTorch on its runtime (worst cosine {min(cos):.6f})" if cos else "passed every check"
    capped = [c for c in (p.get("int8_ranges") or {}).get("outputs_capped", [])]
    if capped:
        c = capped[0]
        return (f"int8 output {c['tensor']} stops at {c['int8_reached'][1]:.4g} while the model reaches "
                f"{c['float_range'][1]:.4g}")
    clipped = [c for c in (p.get("int8_ranges") or {}).get("clipped", []) if c.get("role") == "output"]
    if clipped:
        c = clipped[0]
        return (f"int8 output {c['module'] or c['tensor']} clips: it holds [{c['representable'][0]:.4g}, "
                f"{c['representable'][1]:.4g}], the model reaches [{c['float_range'][0]:.4g}, {c['float_range'][1]:.4g}]")
    errors = t.get("errors") or []
    return str(errors[0]) if errors else "failed (no reason recorded)"


def _todo(name: str, t: dict) -> str:
    """One line: what the user does next."""
    p = t.get("parity") or {}
    if t.get("passed"):
        where = t.get("artifact") or f"{name}/model.tflite"
        return f"ship {where}" + ("; read the warnings below" if t.get("warnings") else "")
    ranges = p.get("int8_ranges") or {}
    if ranges.get("outputs_capped") or any(c.get("role") == "output" for c in ranges.get("clipped", [])):
        other = ("ship float on this target (list a float precision in its profile)" if name != "iot"
                 else "ship a float model on another target (iot is full-integer)")
        return f"give --calib rows that cover what the device will see, or {other}"
    if (p.get("task_score") or {}).get("passed") is False:
        return "the task score drops beyond the profile's max_task_drop: try more --calib rows or the next precision"
    diagnosis = str(p.get("diagnosis", ""))
    if diagnosis.startswith("precision loss"):
        return ("the float32 export is right and this precision is not: allow a float precision in the target's "
                "profile, or give --calib rows like the real inputs")
    loc = p.get("first_divergence")
    if loc:
        return f"the export itself departs from PyTorch at {loc['module']}: rewrite that layer or report it (a conversion error)"
    if any(w in str(x) for x in t.get("errors", []) for w in ("compatib", "budget", "delegate", "not supported")):
        return "the target's checks refused it: if its limit is wrong for your device, edit the profile (--profile-dir)"
    return "see the details below"


def npu_per_soc(npu: dict | None) -> list[tuple[str, dict]]:
    """report.json's android-npu figures as (label, one compile's figures): per SoC, or with shape
    buckets per bucket and SoC ("SM8650, bucket x_1x3x32x32")."""
    if not npu:
        return []
    if "buckets" in npu:
        return [(f"{soc}, bucket {name}", f) for name, b in npu["buckets"].items() for soc, f in b.get("socs", {}).items()]
    return list(npu.get("socs", {}).items())


def _npu(t: dict) -> str:
    """android-npu, per SoC: what the NPU took (first), then what the HTP simulator said and which QNN ran it."""
    npu, e, lines = t.get("npu"), html.escape, []
    if not npu:
        return ""
    for soc, f in npu_per_soc(npu):
        if "ops_total" not in f:
            lines.append(f"{e(soc)}: <b>not compiled</b> ({e('; '.join(f.get('reasons') or []))})")
            continue
        cpu = f.get("cpu_ops", {}).get("by_op") or {}
        line = (f"{e(soc)}: {f['ops_on_npu']}/{f['ops_total']} ops on the NPU, {f['partitions']} partition(s), "
                f"{f['size_bytes']:,} bytes" + (f"; on the CPU: {e(', '.join(f'{k} x{n}' for k, n in cpu.items()))}"
                                                 if cpu else ""))
        sim = f.get("simulator")
        if not sim or not sim.get("ran"):
            line += f"; HTP simulator: <b>not run</b> ({e('; '.join(f.get('reasons') or ['refused before it']))})"
        else:
            cos = [m.get("cosine_mean", m.get("cosine")) for m in sim["vs_pytorch"].values()]
            lsb = [v["max_lsb"] for v in sim["vs_xnnpack"].values() if "max_lsb" in v]
            line += (f"; HTP simulator: {'pass' if sim['passed'] else '<b>FAIL</b>'} on {sim['rows']} rows"
                     + (" (stitched with the CPU ops)" if sim.get("stitched") else "")
                     + (f", cosine vs PyTorch {min(cos):.6f}" if cos and None not in cos else "")
                     + (f", vs XNNPACK {max(lsb):.3g} LSB" if lsb else
                        f", vs XNNPACK max_abs {max(v['max_abs'] for v in sim['vs_xnnpack'].values()):.3g}"))
        lines.append(line)
    return f"NPU (Qualcomm QNN {e(str(npu.get('qnn_version')))}):<br>" + "<br>".join(lines)


def _buckets(t: dict) -> str:
    """Shape buckets (convert/shapes.py): each bucket's verdict, and how the shipped file was checked."""
    e, rows = html.escape, []
    for b in t.get("buckets") or []:
        p, lat = b.get("parity") or {}, b.get("latency_ms") or {}
        why = "" if b.get("passed") else ": " + ((b.get("errors") or ["failed"])[0])
        rows.append(f"bucket {e(b['name'])} {'passes' if b.get('passed') else 'FAILS'} ({e(str(b.get('quantization')))}, "
                    f"cosine {_cell(p.get('cosine'))}"
                    + (f", {lat['artifact']:.3g} ms" if lat.get("artifact") is not None else "") + f"){e(why)}")
    sig = (t.get("parity") or {}).get("signature_file")
    if sig:
        rows.append(f"one file, a signature per bucket, rerun by name on {e(sig['runtime'].split(':')[0])}: "
                    f"{'matches' if sig.get('passed') else 'FAILS'}")
    return "<br>".join(rows)


def _cards(report: dict) -> str:
    """The answer first: a card per target."""
    e, cards = html.escape, []
    for name, t in report["targets"].items():
        p = t.get("parity") or {}
        ok = bool(t.get("passed"))
        lat = t.get("latency_ms") or {}
        if lat.get("artifact") is not None and lat.get("torch_eager"):
            speed = lat["torch_eager"] / lat["artifact"] if lat["artifact"] else float("inf")
            per = " per token" if "unit" in lat else ""
            ratio = f"{speed:.1f}x faster" if speed >= 1 else f"{1 / speed:.1f}x slower"
            lat_s = f"{lat['artifact']:.3g} ms{per} vs PyTorch {lat['torch_eager']:.3g} ms ({ratio})"
            if lat.get("slower_than_torch"):
                lat_s += f"; {lat['slower_than_torch']}"
        else:
            lat_s = "latency not measured"
        task = p.get("task_score") or {}
        lm = p.get("lm_task") or {}
        if "score" in task:
            task_s = (f"task {e(task['metric'])} {task['score']:.4g}{_ci(task.get('interval'))}, "
                      f"PyTorch {task['torch_score']:.4g}")
        elif "accuracy" in lm:
            task_s = (f"task {e(lm['task'])} {lm['accuracy']:.3f}{_ci(lm.get('interval'))}, "
                      f"PyTorch {lm['torch_accuracy']:.3f}")
        else:
            task_s = "no task score (no labels given)"
        size = t.get("size_bytes")
        cards.append(
            f"<div class='card {'ship' if ok else 'refuse'}' data-target='{e(name)}'>"
            f"<h3>{e(name)}: {'ships' if ok else 'refused'}</h3>"
            f"<p class='facts'>{e(t.get('quantization') or '-')} &middot; "
            f"{f'{size:,} bytes' if isinstance(size, int) else 'no artifact'} &middot; {e(lat_s)}<br>{task_s}</p>"
            + (f"<p class='npu'>{npu}</p>" if (npu := _npu(t)) else "")
            + (f"<p class='buckets'>{bk}</p>" if (bk := _buckets(t)) else "") +
            f"<p class='why'><b>why:</b> {e(_why(t))}</p>"
            f"<p class='todo'><b>what to do:</b> {e(_todo(name, t))}</p></div>")
    return f"<div class='cards'>{''.join(cards)}</div>"


def render_html(report: dict) -> str:
    e = html.escape
    rows = []
    for name, t in report["targets"].items():
        p = t.get("parity") or {}
        outs = p.get("outputs", {})
        figs = "<br>".join(
            f"{e(o)}: max_abs {m['max_abs']:.3g}, rmse {m['rmse']:.3g}, cos {m['cosine']:.6f} (worst) / {m.get('cosine_mean', m['cosine']):.6f} (mean), SNR {m['snr_db']:.1f} dB"
            + (f", top-1 {m['top1']:.3f}" if "top1" in m else "") + _kind_figures(m) for o, m in outs.items())
        if "generation_agreement" in p:  # decode-ready LMs
            b = p.get("browser") or {}
            figs = (f"greedy generations identical to PyTorch on {p['generation_agreement']:.0%} of {p['prompts']} prompts"
                    + (f"; in the browser {b['generation_agreement']:.0%}" if "generation_agreement" in b else "")
                    + (f"<br>model.litertlm on LiteRT-LM: {lm['generation_agreement']:.0%} identical, "
                       f"{lm['near_ties']} near-ties" if (lm := p.get("litert_lm")) else "")
                    + (f"<br>task {e(tk['task'])} on LiteRT-LM: {tk['accuracy']:.3f} (95% CI {tk['interval'][0]:.3f}-"
                       f"{tk['interval'][1]:.3f}) vs PyTorch {tk['torch_accuracy']:.3f} on {tk['n']} held-out problems, "
                       f"{tk['answers_differ']} answers differ (bound: {100 * tk['max_task_drop']:.1f} points)"
                       if (tk := p.get("lm_task")) else "")
                    + ("<br>prefill " + figs if figs else ""))
        acc = "<br>".join(x for x in (_accelerators(p), _int8_ranges(p.get("int8_ranges"))) if x)
        figs = f"{figs}<br>{acc}" if acc and figs else figs or acc
        task = _task_parity(p)
        figs = f"{task}<br>{figs}" if task and figs else figs or task
        lat = t.get("latency_ms") or {}
        per = " per token" if "unit" in lat else ""  # decode-ready LMs: per generated token
        lat_s = (f"{lat['artifact']:.3f} ms{per} vs torch {lat['torch_eager']:.3f} ms" if lat.get("artifact") is not None
                 else "-")
        problems = "<br>".join(e(x) for x in t.get("errors", []) + t.get("warnings", []))
        if p.get("calibration_overlap"):
            problems += f"<br><b>{e(p['calibration_overlap']['why'])}</b>"
        loc = p.get("first_divergence")
        if loc:
            problems += f"<br><b>first diverging layer: {e(loc['module'])}</b> ({e(loc['op'])}, rel. error {loc['rel_err']:.3g})"
        if t.get("layer_errors"):  # the same per-layer error, drawn on the graph (verdict/layer_errors.py)
            problems += f"<br>every layer's error in Model Explorer: <code>{e(t['layer_errors']['view'])}</code>"
        status = "pass" if t["passed"] else "FAIL"
        rows.append(f"<tr class='{status.lower()}'><td>{e(name)}</td><td>{status}</td><td>{e(t.get('quantization', ''))}</td>"
                    f"<td>{t.get('size_bytes') or '-'}</td><td>{e(t.get('runtime', ''))}</td><td>{figs}</td>"
                    f"<td>{lat_s}</td><td>{problems}</td></tr>")
        if t.get("npu"):
            rows.append(f"<tr><td></td><td colspan='7'>{_npu(t)}</td></tr>")
        choice = _choice(t)
        if choice:
            rows.append(f"<tr><td></td><td colspan='7'>{choice}</td></tr>")
    img = _plot(report)
    plot = f"<h2>Parity error per target and output</h2><div>{img}</div>" if img else "<p>(no parity figures)</p>"
    skipped = [f"{n}: skipped ({why})" for n, why in report.get("skipped_targets", {}).items()]
    notes = "".join(f"<li>{e(n)}</li>" for n in report.get("notes", []) + report.get("warnings", []) + skipped)
    if report.get("task_score"):  # report["task"] is the model's task ("classification", "causal-lm")
        tk = report["task_score"]
        notes = (f"<li>task metric {e(tk['metric'])} ({e(tk['chosen'])}) on {tk['rows']} labelled rows from "
                 f"{e(tk['labels_from'])}: PyTorch {tk['torch_score']:.4g}{_ci(tk['torch_interval'])}</li>" + notes)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>convert: {e(report['model'])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:13px}}
tr.pass td:nth-child(2){{color:#1b7f4c;font-weight:bold}}tr.chosen td{{font-weight:bold}}tr.fail td:nth-child(2){{color:#c0392b;font-weight:bold}}
.cards{{display:flex;flex-wrap:wrap;gap:12px;margin:1em 0}}.card{{border:2px solid;border-radius:8px;padding:8px 14px;width:330px;font-size:14px}}
.card h3{{margin:4px 0}}.card p{{margin:6px 0}}.ship{{border-color:#2a9d8f}}.ship h3{{color:#1b7f4c}}.refuse{{border-color:#e76f51}}.refuse h3{{color:#c0392b}}
details{{margin:1em 0}}summary{{cursor:pointer;font-weight:bold}}</style></head>
<body><h1>{e(report['model'])}</h1>{_cards(report)}
<details><summary>Details: every target's parity, candidates, checks and problems</summary>
<p>{e(report.get('source_format', ''))}; {report.get('samples', 0)} parity samples
({e(report.get('sample_source', ''))}); wall time {report.get('wall_s', 0):.1f} s</p>{_kinds(report)}<ul>{notes}</ul>
<table><tr><th>target</th><th>status</th><th>quantization</th><th>bytes</th><th>runtime</th><th>parity per output</th>
<th>median latency</th><th>problems</th></tr>{''.join(rows)}</table>{plot}</details></body></html>
"""
