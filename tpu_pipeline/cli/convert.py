"""`tpu-pipeline convert MODEL`: parse, call tpu_pipeline.convert.convert, print."""

from __future__ import annotations

from pathlib import Path

import click

from tpu_pipeline import files
from tpu_pipeline.cli.commands import EXIT_CODES_HELP, register


@register("convert")
@click.command(short_help="Convert a PyTorch model to LiteRT artifacts for each target.",
               epilog=EXIT_CODES_HELP + " With several targets the worst kind decides: 4 (an artifact computes "
               "wrong numbers) beats 3 (a target has no usable artifact: conversion, size, ops, arena); each target's "
               "line says its own. With --json the report is printed before a failing exit.")
@click.argument("model", type=click.Path())
@click.option("--targets", default="all", show_default=True, help="all, or a comma list of android,ios,desktop,web,iot,android-npu (android-npu: not in all; needs the [npu] extra).")
@click.option("--out", type=click.Path(), default=None, help="Output folder [default: dist/<model stem>/].")
@click.option("--input-shape", "input_shapes", multiple=True,
              help="1,3,224,224[:float32] per input, in forward() order (repeat for several inputs).")
@click.option("--shapes", "shapes", multiple=True, metavar="NAME=SHAPE,SHAPE",
              help="Shape buckets of input NAME, like x=1x16000,1x32000: a signature per bucket, each checked "
                   "(repeat per input; docs/convert/shapes.md).")
@click.option("--dynamic", "dynamic", multiple=True, metavar="NAME:AXIS=LO..HI",
              help="Buckets along one axis: LO..HI in powers of two (HI last), or a list A,B,C.")
@click.option("--pad", "pad", multiple=True, metavar="NAME=RULE",
              help="How a shorter row fills its bucket: zeros (default), none, length:INPUT or mask:INPUT.")
@click.option("--model-class", default=None, help="pkg.module:Class to build when MODEL is a state_dict.")
@click.option("--model-kwargs", default=None, help="JSON constructor kwargs for --model-class.")
@click.option("--trust-pickle", is_flag=True, help="Allow unpickling a whole nn.Module (runs code from the file).")
@click.option("--calib", type=click.Path(), default=None, help=".npz of representative inputs for static int8 (not for LM folders).")
@click.option("--eval-data", type=click.Path(), default=None,
              help="Parity inputs: FILE.npz (an array per input, optionally `labels`), or a folder of samples (one "
                   ".npy/.npz each, labels in labels.csv: file_name,label). With labels each target is judged by its "
                   "task score (LM folders: use --prompts). Hugging Face task folders take raw data: an image folder "
                   "(a subfolder per label), a .csv/.jsonl of text, a folder of .wav files with labels.csv "
                   "(docs/convert/hf.md).")
@click.option("--metric", default=None, metavar="MODULE:FUNCTION",
              help="Task metric(outputs, labels) -> float, higher is better (a function attribute higher_is_better = "
                   "False flips it), imported from sys.path or the current folder [default with labels: accuracy for "
                   "class outputs, R^2 for regression]. The drop is bounded by --max-task-drop, else the metric's "
                   "max_drop attribute, else each profile's max_task_drop.")
@click.option("--max-task-drop", default=None, metavar="BOUND",
              help="The largest task-score drop a target may ship with, in the metric's own units (0.5 for half a "
                   "dB): one number, or per target android=0.5,iot=1.0 (a bare number: every other target's).")
@click.option("--samples", default=None, type=int,
              help="Parity rows per target [default: all of --eval-data, else 64 drawn; LMs: 8 prompts].")
@click.option("--output-kind", "output_kinds", multiple=True, metavar="NAME=KIND",
              help="What an output is, which decides how it is judged: logits, probabilities, regression, embedding, "
                   "dense_map, token_logits, multilabel (repeat per output; default: inferred from the --eval-data "
                   "labels, then the graph, else unknown).")
@click.option("--atol", type=float, default=None, help="Override the targets' absolute tolerance.")
@click.option("--rtol", type=float, default=None, help="Override the targets' relative tolerance.")
@click.option("--min-cosine", type=float, default=None, help="Override the targets' minimum cosine similarity.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--refine-rounds", type=click.IntRange(0, 16), default=4, show_default=True,
              help="A quantized variant that misses its bound is rebuilt with its first diverging layer kept in "
                   "float32, up to this many rounds (0: off).")
@click.option("--no-latency", is_flag=True, help="Skip the latency measurement (LMs: ms per generated token).")
@click.option("--profile-dir", type=click.Path(), default=None, help="Folder of target profile TOML files to use instead.")
@click.option("--prompts", type=click.Path(), default=None,
              help="LMs: text file with one parity prompt per line [default: random token sequences].")
@click.option("--max-len", "lm_max_len", type=click.IntRange(2, 8192), default=None,
              help="LMs: KV-cache length of the artifact [default: min(max_position_embeddings, 256)]. Hugging Face "
                   "text folders: tokens per row [default: min(max_position_embeddings, 128)]; audio folders: "
                   "samples per clip [default: the longest --eval-data clip].")
@click.option("--prefill-len", "lm_prefill_len", type=click.IntRange(1, 8192), default=None,
              help="LMs: tokens per prefill call [default: min(32, max-len)].")
@click.option("--image", default=None, metavar="NAME[:mean=M:std=S]",
              help="Input NAME is an RGB image (PyTorch NCHW or NHWC): the artifacts take NHWC [1, H, W, 3] with "
                   "TFLite metadata model input = (pixel - mean) / std, pixels 0..255 [default mean 0, std 255; one "
                   "value or R,G,B], and are checked as MediaPipe ImageClassifier models (docs/convert/apps.md).")
@click.option("--audio", default=None, metavar="NAME:rate=HZ",
              help="Input NAME is a mono waveform in -1..1 at HZ: audio metadata, checked as a MediaPipe "
                   "AudioClassifier.")
@click.option("--text", default=None, metavar="NAME:vocab=FILE[:tokenizer=bert|sentencepiece]",
              help="Input NAME is token ids: of a regex tokenizer by default (FILE: \"token id\" lines with <PAD>, "
                   "<START>, <UNKNOWN>), of BERT's WordPiece (FILE: vocab.txt or tokenizer.json) or of a SentencePiece "
                   "Unigram (FILE: tokenizer.json): tokenizer metadata with the vocab, checked as a MediaPipe "
                   "TextClassifier.")
@click.option("--labels", default=None, type=click.Path(),
              help="One label per line, index = class of the first output: written into the metadata; a logits head "
                   "gets a softmax so its scores are probabilities.")
@click.option("--metadata", "metadata", multiple=True, metavar="KEY=VALUE",
              help="TFLite metadata: name, description, version, author or license (repeat).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def command(model, targets, out, input_shapes, shapes, dynamic, pad, model_class, model_kwargs, trust_pickle, calib, eval_data, metric,
            max_task_drop, samples,
            output_kinds, atol, rtol, min_cosine, seed, refine_rounds, no_latency, profile_dir, prompts, lm_max_len, lm_prefill_len,
            image, audio, text, labels, metadata, as_json):
    """Convert MODEL to LiteRT artifacts for each target and check each on its runtime.

    MODEL: a torch.export archive (.pt2), a tpu-pipeline model.pt, a state_dict
    (with --model-class), a pickled nn.Module (with --trust-pickle) or a Hugging
    Face causal-LM folder (with tokenizer.json: a decode-ready artifact with
    prefill/decode signatures and the tokenizer, checked by greedy generations).
    Writes DIR/<target>/model.tflite + model.json, DIR/report.json and
    DIR/report.html. An option that does not apply to MODEL's kind is refused
    (exit 2).
    """
    # start-up: the pipeline imports torch and LiteRT; `tpu-pipeline convert --help` need not
    from tpu_pipeline.convert.pipeline import convert
    from tpu_pipeline.rl.task_eval import policy_task

    # an rl policy folder records its recipe: each bundle is also scored on that task (LiteRT-LM vs PyTorch)
    lm_task = policy_task(model) if Path(model).is_dir() else None
    result = convert(model, targets=targets, out=out, calibration=calib,
                     progress=lambda msg: click.echo(f"  {msg}", err=True),
                     input_shapes=tuple(input_shapes), shapes=tuple(shapes), dynamic=tuple(dynamic), pad=tuple(pad),
                     model_class=model_class, model_kwargs=model_kwargs,
                     trust_pickle=trust_pickle, eval_data=eval_data, metric=metric, max_task_drop=max_task_drop,
                     samples=samples,
                     output_kinds=tuple(output_kinds), atol=atol, rtol=rtol,
                     min_cosine=min_cosine, seed=seed, refine_rounds=refine_rounds, latency=not no_latency,
                     profile_dir=profile_dir, prompts=prompts, lm_max_len=lm_max_len, lm_prefill_len=lm_prefill_len,
                     image=image, audio=audio, text=text, labels=labels, metadata=tuple(metadata),
                     **({"lm_task": lm_task} if lm_task is not None else {}))
    if as_json:
        click.echo(files.json_text(result.report, indent=2))
    else:
        _print_table(result.report)
    result.raise_for_failures()


def _print_table(report: dict) -> None:
    from tpu_pipeline.convert.report import npu_per_soc  # the CLI's start-up stays light (convert/__init__.py)

    if report.get("kind") == "causal-lm":
        _print_lm_table(report)
        return
    click.echo(f"{'target':<11} {'status':<6} {'quantization':<13} {'bytes':>9} {'cos(min)':>10} {'cos(mean)':>10} "
               f"{'max_abs':>9} {'top1':>5} {'ms':>7} {'torch ms':>8}")
    for name, t in report["targets"].items():
        p = t.get("parity") or {}
        lat = t.get("latency_ms") or {}
        top1 = f"{p['top1']:.2f}" if "top1" in p else "-"
        click.echo(f"{name:<11} {_status(t):<6} {t['quantization']:<13} {t['size_bytes'] or 0:>9} "
                   f"{p.get('cosine', float('nan')):>10.6f} {p.get('cosine_mean', float('nan')):>10.6f} "
                   f"{p.get('max_abs', float('nan')):>9.3g} {top1:>5} "
                   f"{lat.get('artifact') or float('nan'):>7.3f} {lat.get('torch_eager') or float('nan'):>8.3f}")
    for name, t in report["targets"].items():
        for b in t.get("buckets") or []:  # shape buckets (--shapes/--dynamic): each bucket's own verdict
            p = b.get("parity") or {}
            click.echo(f"{name}: bucket {b['name']}: {'ok' if b['passed'] else 'FAIL'} {b['quantization']} "
                       f"cos(min) {p.get('cosine', float('nan')):.6f} max_abs {p.get('max_abs', float('nan')):.3g}"
                       + (f" ms {b['latency_ms']['artifact']:.3f}" if (b.get("latency_ms") or {}).get("artifact")
                          else ""))
    for name, t in report["targets"].items():
        for soc, f in npu_per_soc(t.get("npu")):  # android-npu: what the NPU took, first
            if "ops_total" not in f:
                click.echo(f"{name}: {soc}: not compiled ({'; '.join(f.get('reasons') or [])})")
                continue
            cpu = ", ".join(f"{op} x{n}" for op, n in f["cpu_ops"]["by_op"].items())
            sim = f.get("simulator") or {}
            verdict = (f"HTP simulator {'pass' if sim['passed'] else 'FAIL'} on {sim['rows']} rows" if sim.get("ran")
                       else "HTP simulator not run")
            click.echo(f"{name}: {soc}: {f['ops_on_npu']}/{f['ops_total']} ops on the NPU, {f['partitions']} "
                       f"partition(s){f'; on the CPU: {cpu}' if cpu else ''}; {verdict}")
    for out, k in (report.get("output_kinds") or {}).items():
        click.echo(f"{out}: kind {k['kind']} ({k['source']})")
    for name, t in report["targets"].items():
        task = (t.get("parity") or {}).get("task_score")
        if task:
            click.echo(f"{name}: {_task_line(task)}")
    for name, t in report["targets"].items():
        client = ((t.get("parity") or {}).get("app") or {}).get("client")
        if client:  # the artifact as apps load it (convert/app_io/client.py)
            task = client.get("task_score")
            click.echo(f"{name}: through MediaPipe {client['task']}: " + (_task_line(task) if task else
                       f"top-1 agreement with ai-edge-litert {client['vs_runtime_same_raw']['top1_agreement']:.3f}"))
    for name, t in report["targets"].items():
        if t.get("chosen_because"):
            click.echo(f"{name}: {t['quantization']}: {t['chosen_because']}")
        if not t["passed"]:
            click.echo(f"{name}: {_status(t)} ({t.get('failure')}): " + " | ".join(t["errors"][:3]))
    for w in report.get("warnings", []):
        click.echo(w, err=True)
    click.echo(f"wrote {report['out']}/ (report.html, report.json)")


def _task_line(t: dict) -> str:
    """The task score with its interval against PyTorch's, the drop and its bound."""
    torch_ci = t["torch_interval"]
    base = (f"task {t['metric']} over {t['rows']} labelled rows: PyTorch {t['torch_score']:.4f} "
            f"(95% CI {torch_ci[0]:.4f}-{torch_ci[1]:.4f})")
    if "score" not in t:
        return f"{base}; artifact: {t['reason']}"
    ci, dci = t["interval"], t["drop_interval"]
    return (f"{base}, artifact {t['score']:.4f} (95% CI {ci[0]:.4f}-{ci[1]:.4f}); drop {t['drop']:.4f} "
            f"(95% CI {dci[0]:.4f} to {dci[1]:.4f}){' ' + t['unit'] if t.get('unit') else ''}, bound "
            f"{t['max_drop']:g}{' (' + t['max_drop_from'] + ')' if t.get('max_drop_from') else ''}: "
            f"{'ok' if t['passed'] else 'FAIL'}")


def _status(t: dict) -> str:
    """ok, or FAIL and the target's own exit code (4: wrong numbers, 3: no usable artifact)."""
    return "ok" if t["passed"] else f"FAIL {4 if t.get('failure') == 'parity' else 3}"


def _print_lm_table(report: dict) -> None:
    click.echo(f"{'target':<8} {'status':<6} {'quantization':<13} {'bytes':>9} {'greedy agree':>12} {'litert-lm':>9} "
               f"{'browser':>8} "
               f"{'cos(min)':>10} {'max_abs':>9} {'ms/token':>8} {'torch':>7}")
    for name, t in report["targets"].items():
        p = t.get("parity") or {}
        b = p.get("browser") or {}
        browser = f"{b['generation_agreement']:.2f}" if "generation_agreement" in b else ("skipped" if b else "-")
        agree = f"{p['generation_agreement']:.2f}" if "generation_agreement" in p else "-"
        bundle = p.get("litert_lm") or {}
        on_lm = f"{bundle['agreement_with_near_ties']:.2f}" if "agreement_with_near_ties" in bundle else "-"
        lat = t.get("latency_ms") or {}
        click.echo(f"{name:<8} {_status(t):<6} {t['quantization']:<13} {t['size_bytes'] or 0:>9} "
                   f"{agree:>12} {on_lm:>9} {browser:>8} {p.get('cosine', float('nan')):>10.6f} {p.get('max_abs', float('nan')):>9.3g} "
                   f"{lat.get('artifact') or float('nan'):>8.3f} {lat.get('torch_eager') or float('nan'):>7.3f}")
    for name, why in report.get("skipped_targets", {}).items():
        click.echo(f"{name:<8} skipped: {why}")
    task = report.get("lm_task")
    if task:
        lo, hi = task["torch"]["interval"]
        click.echo(f"task {task['recipe']} ({task['problems']} held-out problems, greedy, verifier {task['verifier']}): "
                   f"PyTorch {task['torch']['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f})")
        for name, t in report["targets"].items():
            lt = (t.get("parity") or {}).get("lm_task")
            if lt:
                lo, hi = lt["interval"]
                click.echo(f"  {name:<8} bundle on LiteRT-LM {lt['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}), "
                           f"{lt['drop_points']:+.1f} points below PyTorch (bound {100 * lt['max_task_drop']:.1f}), "
                           f"{lt['answers_differ']} answers differ: {'ok' if lt['passed'] else 'FAIL'}")
    for w in report.get("warnings", []):
        click.echo(w, err=True)
    click.echo(f"wrote {report['out']}/ (report.html, report.json); run it: tpu-pipeline generate {report['out']}/desktop "
               "--prompt TEXT")
