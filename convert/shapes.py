"""Inputs of more than one shape: one signature per shape bucket (issue 32).

litert-torch lowers fixed shapes only, so a model whose inputs vary (audio of
any length, sentences, two camera resolutions) is converted once per bucket:
`--shapes x=1x16000,1x32000` lists them, `--dynamic x:1=16000..64000` makes
them (powers of two, the range's top last). Each bucket runs the pipeline's
per-target steps on its own (the float32 gate, candidates, parity on the
target's runtime, latency), on rows of that bucket: eval rows go to the
smallest bucket that holds them, padded by the `--pad` rule (zeros, a length
input, a mask), and PyTorch's answer on the unpadded row is the reference,
so a model whose output padding changes is refused in one line.

Per target, one precision is chosen over all buckets (the profile's most
preferred that passes in every bucket). Where the runtime loads signatures
(ai-edge-litert; LiteRT.js for web) the buckets ship as named signatures of one
.tflite, weights stored once (litert-torch shares equal constants), and each
signature of that file is run again against PyTorch on those runtimes; TFLM
(iot) gets one file per bucket. model.json's `shapes` says
which, with every bucket's shape, padding, file and arena. A failing bucket
is named; the profile's `bucket_failure` decides whether the target ships
without it ("drop") or fails ("fail").
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tpu_pipeline import files
from tpu_pipeline.convert.iot.firmware import measure_arena, suggested_arena, write_c_array
from tpu_pipeline.convert.kinds import Progress
from tpu_pipeline.convert.module import bucket_snippets
from tpu_pipeline.convert.module.buckets import (batch_resize, export_signatures, run_signature,
                                                 run_signature_litertjs, signature_calibration, signature_io)
from tpu_pipeline.convert.module.kind import ModuleKind
from tpu_pipeline.convert.module.loaders import LoadedModel, flatten_outputs
from tpu_pipeline.convert.npu.ai_pack import write_ai_pack
from tpu_pipeline.convert.npu.compile import soc_model_json
from tpu_pipeline.convert.options import DEFAULT_SAMPLES, ConvertOptions
from tpu_pipeline.convert.precision.quantize import CALIBRATED, quantize
from tpu_pipeline.convert.result import Artifact, ConvertResult, TargetResult
from tpu_pipeline.convert.runtimes.browser import browser_unavailable
from tpu_pipeline.convert.runtimes.measure import torch_threads
from tpu_pipeline.convert.targets import TargetProfile
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict import eval_data, output_kinds, parity, task_score
from tpu_pipeline.errors import ConversionError, UserError

CALIB_ROWS = 16  # random calibration rows per bucket when --calib gives none for it
MAX_BUCKETS = 8  # each bucket is a full conversion and check: more is a sign of a wrong range
PAD_RULES = ("zeros", "none", "length", "mask")
# padding-invariance in PyTorch: the padded row's output (cropped) against the unpadded row's,
# both float32 on the CPU; a model that masks or pools over the true length stays far inside
PAD_MIN_COSINE = 0.9999
PAD_MAX_REL = 1e-3  # max |padded - unpadded| / the output's RMS


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One signature: a shape per model input (batch included)."""

    name: str                           # the signature name, e.g. "x_1x16384"
    shapes: tuple[tuple[int, ...], ...]  # per input, in forward() order

    def to_json(self, names: list[str]) -> dict:
        return {"name": self.name, "inputs": {n: list(s) for n, s in zip(names, self.shapes)}}


@dataclasses.dataclass(frozen=True)
class Padding:
    """How a shorter row fills its bucket: `rule` on `input`, with `companion` the length or mask
    input the model reads (length: int, the valid count along `axis`; mask: 1 valid, 0 padded)."""

    input: str
    rule: str = "zeros"
    companion: str | None = None
    axis: int | None = None  # the padded axis (the one the buckets differ along), None: every axis

    def to_json(self) -> dict:
        return {"input": self.input, "rule": self.rule, "companion": self.companion, "axis": self.axis,
                "how": {"zeros": "zeros appended at the end of each axis the row is shorter along",
                        "none": "no padding: a row must match a bucket's shape exactly",
                        "length": f"zeros appended; input {self.companion} = the row's length along axis {self.axis}",
                        "mask": f"zeros appended; input {self.companion} = 1 over the row's length, 0 over the padding"
                        }[self.rule]}


def wanted(o: ConvertOptions) -> bool:
    return bool(o.shapes or o.dynamic)


def in_manifest(path: Path) -> bool:
    """Whether MODEL is a model.pt manifest that names shape buckets (its shape_buckets field)."""
    if not path.is_file():
        return False
    try:  # mmap: the tensors are not read, only the manifest's fields
        m = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - not a manifest (a .pt2, a pickle): the loader says what it is
        return False
    return isinstance(m, dict) and isinstance(m.get("shape_buckets"), dict) and bool(
        m["shape_buckets"].get("shapes") or m["shape_buckets"].get("dynamic"))


def _dims(text: str, flag: str, spec: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.strip().lower().split("x"))
    except ValueError:
        raise UserError(f"{flag} {spec!r}: {text.strip()!r} is not a shape; write dimensions joined by x, "
                        "like 1x16000") from None
    if any(d <= 0 for d in dims):
        raise UserError(f"{flag} {spec!r}: every dimension of {text.strip()!r} must be a positive integer")
    return dims


def _input_index(name: str, names: list[str], flag: str, spec: str) -> int:
    if name not in names:
        raise UserError(f"{flag} {spec!r}: the model has no input {name!r} (inputs: {', '.join(names)})")
    return names.index(name)


def parse_buckets(shapes: tuple[str, ...], dynamic: tuple[str, ...], names: list[str],
                  sample_shapes: list[tuple[int, ...]]) -> list[Bucket]:
    """--shapes / --dynamic -> the buckets, smallest first; UserError (one line) for bad input.
    An input no flag names keeps its sample shape in every bucket."""
    if shapes and dynamic:
        raise UserError("--shapes and --dynamic both give the buckets; use one of them")
    per_input: dict[int, list[tuple[int, ...]]] = {}
    for spec in shapes:
        name, eq, rest = spec.partition("=")
        if not eq or not rest.strip():
            raise UserError(f"--shapes {spec!r}: expected NAME=SHAPE,SHAPE,... like x=1x16000,1x32000")
        i = _input_index(name.strip(), names, "--shapes", spec)
        got = [_dims(t, "--shapes", spec) for t in rest.split(",")]
        for d in got:
            if len(d) != len(sample_shapes[i]):
                raise UserError(f"--shapes {spec!r}: {'x'.join(map(str, d))} has {len(d)} dimensions; input "
                                f"{names[i]} has {len(sample_shapes[i])} ({'x'.join(map(str, sample_shapes[i]))})")
        per_input[i] = got
    for spec in dynamic:
        m = re.fullmatch(r"\s*([^:=\s]+)\s*:\s*(\d+)\s*=\s*(.+)", spec)
        if not m:
            raise UserError(f"--dynamic {spec!r}: expected NAME:AXIS=LO..HI (like x:1=16000..64000) or "
                            "NAME:AXIS=A,B,C")
        i = _input_index(m.group(1), names, "--dynamic", spec)
        axis, base = int(m.group(2)), sample_shapes[i]
        if axis >= len(base):
            raise UserError(f"--dynamic {spec!r}: input {names[i]} has {len(base)} axes (0..{len(base) - 1})")
        per_input[i] = [base[:axis] + (n,) + base[axis + 1:] for n in _lengths(m.group(3), spec)]
    counts = {len(v) for v in per_input.values()}
    if len(counts) > 1:
        raise UserError(f"--shapes/--dynamic: every input needs the same number of buckets (got "
                        f"{', '.join(f'{names[i]}: {len(v)}' for i, v in per_input.items())})")
    n = counts.pop()
    if n > MAX_BUCKETS:
        raise UserError(f"--shapes/--dynamic: {n} buckets; at most {MAX_BUCKETS} (each is a full conversion and "
                        "check: give a coarser list)")
    out, seen = [], set()
    for b in range(n):
        shp = tuple(per_input[i][b] if i in per_input else tuple(sample_shapes[i]) for i in range(len(names)))
        if shp in seen:
            raise UserError(f"--shapes/--dynamic: bucket {_label(shp, names, per_input)} is listed twice")
        seen.add(shp)
        out.append(Bucket(_label(shp, names, per_input), shp))
    return sorted(out, key=lambda b: tuple(int(np.prod(s)) for s in b.shapes))


def _label(shp, names, per_input) -> str:
    return "_".join(f"{re.sub(r'[^A-Za-z0-9]', '_', names[i])}_{'x'.join(map(str, shp[i]))}" for i in sorted(per_input))


def _lengths(text: str, spec: str) -> list[int]:
    """`16000..64000` -> [16384, 32768, 64000] (powers of two from the first that holds LO, the
    range's top last); `16000,32000` -> as given."""
    lo_s, dots, hi_s = text.partition("..")
    try:
        got = [int(t) for t in text.split(",")] if not dots else [int(lo_s), int(hi_s)]
    except ValueError:
        raise UserError(f"--dynamic {spec!r}: {text!r} is neither LO..HI nor a comma list of lengths") from None
    if dots:
        lo, hi = got
        if lo > hi:
            raise UserError(f"--dynamic {spec!r}: the range's low end {lo} is above its high end {hi}")
        got, p = [], 1 << max(lo - 1, 0).bit_length()
        while p < hi:
            got.append(p)
            p *= 2
        got.append(hi)
    if any(n <= 0 for n in got):
        raise UserError(f"--dynamic {spec!r}: lengths must be positive integers")
    return got


def parse_pad(pad: tuple[str, ...], names: list[str], buckets: list[Bucket]) -> dict[str, Padding]:
    """--pad NAME=RULE per input -> Padding per input (default zeros on every input the buckets vary)."""
    varies = {i for i in range(len(names)) if len({b.shapes[i] for b in buckets}) > 1}
    out: dict[str, Padding] = {}
    for spec in pad:
        name, eq, rule = (p.strip() for p in spec.partition("="))
        kind, _, companion = rule.partition(":")
        if not eq or kind not in PAD_RULES or (kind in ("length", "mask")) != bool(companion):
            raise UserError(f"--pad {spec!r}: expected NAME=zeros, NAME=none, NAME=length:INPUT or NAME=mask:INPUT")
        i = _input_index(name, names, "--pad", spec)
        if companion:
            j = _input_index(companion, names, "--pad", spec)
            if j == i:
                raise UserError(f"--pad {spec!r}: the {kind} input must be another input than {name}")
        out[name] = Padding(name, kind, companion or None, _axis(buckets, i))
    for i in sorted(varies):
        if names[i] not in out and not any(p.companion == names[i] for p in out.values()):
            out[names[i]] = Padding(names[i], "zeros", None, _axis(buckets, i))
    return out


def _axis(buckets: list[Bucket], i: int) -> int | None:
    axes = {a for b in buckets for a, (x, y) in enumerate(zip(b.shapes[i], buckets[0].shapes[i])) if x != y}
    return axes.pop() if len(axes) == 1 else None


def fit(row: list[np.ndarray], bucket: Bucket, names: list[str], pads: dict[str, Padding]) -> list[np.ndarray]:
    """`row` padded into `bucket` by the rules (companion length/mask inputs set from the row)."""
    out = list(row)
    for i, (x, shp) in enumerate(zip(row, bucket.shapes)):
        p = pads.get(names[i])
        if tuple(np.shape(x)) == shp or (p is None and any(q.companion == names[i] for q in pads.values())):
            continue
        if p is None or p.rule == "none":
            raise ValueError(f"{names[i]} of shape {list(np.shape(x))} is not bucket {bucket.name}")
        out[i] = np.pad(x, [(0, b - a) for a, b in zip(np.shape(x), shp)])
    for p in pads.values():
        if p.companion is None:
            continue
        i, j = names.index(p.input), names.index(p.companion)
        n = np.shape(row[i])[p.axis if p.axis is not None else -1]
        if p.rule == "length":
            out[j] = np.full(bucket.shapes[j], n, dtype=np.asarray(row[j]).dtype)
        else:
            m = np.zeros(bucket.shapes[j], dtype=np.asarray(row[j]).dtype)
            m[..., :n] = 1
            out[j] = m
    return out


def smallest(row: list[np.ndarray], buckets: list[Bucket], pads: dict[str, Padding], names: list[str]) -> Bucket | None:
    """The smallest bucket that holds `row`: along padded inputs at most its shape, elsewhere exactly."""
    free = {names.index(p.companion) for p in pads.values() if p.companion}
    loose = {names.index(n) for n, p in pads.items() if p.rule != "none"}
    for b in buckets:
        if all(i in free or _holds(x, b.shapes[i], i not in loose) for i, x in enumerate(row)):
            return b
    return None


def _holds(x, shp, exact: bool) -> bool:
    s = tuple(np.shape(x))
    return s == tuple(shp) if exact else len(s) == len(shp) and all(a <= b for a, b in zip(s, shp))


@dataclasses.dataclass
class _BucketRows:
    rows: list[list[np.ndarray]] = dataclasses.field(default_factory=list)     # padded, as the artifact gets them
    unpadded: list[list[np.ndarray]] = dataclasses.field(default_factory=list)
    labels: list = dataclasses.field(default_factory=list)


def _random_rows(m: LoadedModel, bucket: Bucket, below: Bucket | None, pads: dict[str, Padding], n: int,
                 rng: np.random.Generator) -> list[list[np.ndarray]]:
    """n unpadded rows for `bucket`: half at its full shape, half shorter (longer than the bucket
    below) along a padded axis, so the padding rule is checked without eval data."""
    names = m.input_names
    rows = []
    for k in range(n):
        row = []
        for i, (a, high) in enumerate(zip(m.sample_args, m.int_high or [None] * len(names))):
            shp = list(bucket.shapes[i])
            p = pads.get(names[i])
            if k % 2 and p is not None and p.rule != "none" and p.axis is not None:
                lo = below.shapes[i][p.axis] + 1 if below is not None else max(1, shp[p.axis] // 2)
                shp[p.axis] = int(rng.integers(lo, shp[p.axis])) if lo < shp[p.axis] else shp[p.axis]
            if a.is_floating_point():
                row.append(rng.standard_normal(shp).astype(np.float32))
            elif a.dtype == torch.bool:
                row.append(rng.random(shp) > 0.5)
            else:
                row.append(rng.integers(0, max(high or 2, 1), shp).astype(str(a.dtype).replace("torch.", "")))
        rows.append(row)
    # companions: the row's own length/mask is set by fit(); give them their unpadded form here
    for row in rows:
        for p in pads.values():
            if p.companion:
                i, j = names.index(p.input), names.index(p.companion)
                nlen = np.shape(row[i])[p.axis if p.axis is not None else -1]
                c = np.zeros(bucket.shapes[j], dtype=np.asarray(row[j]).dtype)
                if p.rule == "length":
                    c[...] = nlen
                else:
                    c = c[..., :nlen] + 1
                row[j] = c
    return rows


def _torch(module, rows) -> list[list[np.ndarray]]:
    with torch.no_grad(), torch_threads():
        return [[t.float().numpy() for t in flatten_outputs(module(*[torch.from_numpy(np.asarray(x)) for x in r]))]
                for r in rows]


def padding_check(padded_out, unpadded_out, names: list[str], bucket: Bucket) -> tuple[dict, str | None]:
    """PyTorch on the padded rows against PyTorch on the same rows unpadded (outputs of another shape
    cropped to it) -> (figures, the one-line refusal or None)."""
    worst = {"rows": len(padded_out), "cosine_min": 1.0, "max_rel": 0.0}
    for po, uo in zip(padded_out, unpadded_out):
        for k, (p, u) in enumerate(zip(po, uo)):
            p = p[tuple(slice(0, n) for n in u.shape)] if p.shape != u.shape and p.ndim == u.ndim else p
            if p.shape != u.shape:
                continue
            pf, uf = p.astype(np.float64).ravel(), u.astype(np.float64).ravel()
            rms = float(np.sqrt((uf ** 2).mean())) if uf.size else 0.0
            rel = float(np.abs(pf - uf).max() / rms) if rms > 0 else float(np.abs(pf - uf).max(initial=0))
            nrm = np.linalg.norm(pf) * np.linalg.norm(uf)
            cos = float(pf @ uf / nrm) if nrm > 0 else (1.0 if rel == 0 else 0.0)
            if rel > worst["max_rel"]:
                worst.update(max_rel=rel, output=names[k] if k < len(names) else f"output_{k}")
            worst["cosine_min"] = min(worst["cosine_min"], cos)
    if worst["cosine_min"] >= PAD_MIN_COSINE and worst["max_rel"] <= PAD_MAX_REL:
        return worst, None
    return worst, (f"padding changes the output: in bucket {bucket.name}, PyTorch on {worst['rows']} padded rows "
                   f"departs from PyTorch on the same rows unpadded (cosine {worst['cosine_min']:.4f}, largest error "
                   f"{worst['max_rel']:.3g} x the output's RMS, output {worst.get('output')}); give the model a length "
                   "or mask input (--pad NAME=length:INPUT or NAME=mask:INPUT) or --pad NAME=none with rows of each "
                   "bucket's exact shape")


@dataclasses.dataclass
class _Bucketed:
    bucket: Bucket
    kind: ModuleKind
    results: dict[str, TargetResult]
    again: Callable[[list[TargetProfile]], list[TargetResult]] | None  # None: refused before any export
    pad_figures: dict
    pad_error: str | None
    export_s: float
    float_export: dict | None  # the float32 gate's figures on this bucket (pipeline.py's report["float_export"])


# pipeline.py's per-target steps for one bucket's model kind, in a work folder ->
# (results, a rerun for other profiles on the same variants, export seconds, warnings, float32 gate)
RunBucket = Callable[[ModuleKind, list[TargetProfile], Path],
                     tuple[list[TargetResult], Callable, float, list[str], dict | None]]


def convert_buckets(m: LoadedModel, o: ConvertOptions, label: str, out_dir: Path, wanted: list[TargetProfile],
                    skipped: dict, rng: np.random.Generator, say: Progress, t0: float, *, run_bucket: RunBucket,
                    html: Callable[[dict], str], versions: Callable[[], dict]) -> ConvertResult:
    """Every bucket through the per-target steps (run_bucket: pipeline.py's), one precision per target,
    the shipped artifact (signatures or files) checked, everything written in one staged folder."""
    m = _named(m)
    listed = m.shape_buckets or {}
    if not (o.shapes or o.dynamic):  # the manifest's buckets; flags replace them (--pad only the padding)
        o = dataclasses.replace(o, shapes=tuple(listed.get("shapes", ())), dynamic=tuple(listed.get("dynamic", ())))
    if not o.pad and listed.get("pad"):
        o = dataclasses.replace(o, pad=tuple(listed["pad"]))
    names = m.input_names
    buckets = parse_buckets(o.shapes, o.dynamic, names, [tuple(a.shape) for a in m.sample_args])
    if m.exported_dims is not None:
        inside_export(buckets, names, m.exported_dims, label)
    pads = parse_pad(o.pad, names, buckets)
    given = _given_rows(m, o.eval_data, "--eval-data", buckets, pads)
    calib = _given_rows(m, o.calib, "--calib", buckets, pads) if isinstance(o.calib, (str, Path)) else None
    if o.calib is not None and calib is None:
        raise UserError("calibration= rows with shape buckets: give a samples folder path (rows of any length) "
                        "or leave it out (each bucket then calibrates on random rows)")
    per_bucket: list[_Bucketed] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tpu-pipeline-shapes-") as work:
        work = Path(work)
        for bi, b in enumerate(buckets):
            say(f"bucket {b.name} ({bi + 1} of {len(buckets)})")
            kind, pad_fig, pad_err = _bucket_kind(m, o, b, buckets[bi - 1] if bi else None, pads, given, calib, rng)
            if pad_err:  # refused in PyTorch already: no artifact of this bucket can be right
                say(f"bucket {b.name}: {pad_err.split(':')[0]}")
                results = [TargetResult(target=p.name, quantization=(list(p.precisions) or [p.precision])[0],
                                        runtime=p.runtime_note).fail("parity", pad_err) for p in wanted]
                again, export_s, gate = None, 0.0, None
            else:
                results, again, export_s, warned, gate = run_bucket(kind, wanted, work / b.name)
                warnings += [w for w in warned if w not in warnings]
            per_bucket.append(_Bucketed(b, kind, {r.target: r for r in results}, again, pad_fig, pad_err, export_s,
                                        gate))
        t_ship = time.perf_counter()
        made: dict = {}  # signature files by (precision, buckets): targets that share one make it once
        shipped = {p.name: _ship(p, per_bucket, names, work, made, say) for p in wanted}
        ship_s = time.perf_counter() - t_ship
        last = per_bucket[-1].kind
        shapes_json = {"buckets": [b.to_json(names) for b in buckets], "padding": {n: p.to_json() for n, p in pads.items()},
                       "rows_from": given["source"]}
        report = {"model": label, "kind": "module", **last.report_fields(), "warnings": warnings,
                  "export_s": sum(x.export_s for x in per_bucket), "versions": versions(),
                  "float_export": _float_export(per_bucket),
                  "shapes": {**shapes_json, "padding_check": {x.bucket.name: x.pad_figures for x in per_bucket},
                             "ship_s": ship_s}, "targets": {}, "skipped_targets": skipped}
        by_name = {p.name: p for p in wanted}
        with files.staged_dir(out_dir) as stage:
            say("write: artifacts, model.json, report.json, report.html")
            for name, (r, layout, arts) in shipped.items():
                _write(by_name[name], r, layout, arts, per_bucket, shapes_json, stage, out_dir)
                report["targets"][name] = r.to_json()
            result = ConvertResult(model=label, kind="module", out=out_dir,
                                   targets={n: r for n, (r, _, _) in shipped.items()}, report=report)
            report["wall_s"] = time.perf_counter() - t0
            report["passed"], report["exit_code"] = result.passed, result.exit_code
            page = html(report)
            files.atomic_write_json(stage / "report.json", report)
            files.atomic_write_text(stage / "report.html", page)
    report["out"] = str(out_dir)
    return result


def _float_export(per_bucket: list[_Bucketed]) -> dict | None:
    """report.json's float_export over the buckets: passed only if every bucket's float32 export did,
    each bucket's figures under `buckets` (a bucket refused in PyTorch, or whose float export did not
    run, has none)."""
    gates = {x.bucket.name: x.float_export for x in per_bucket if x.float_export is not None}
    if not gates:
        return None
    first = next(iter(gates.values()))
    return {"judged_as": first["judged_as"], "passed": all(g["passed"] for g in gates.values()), "buckets": gates}


def inside_export(buckets: list[Bucket], names: list[str], dims: list[list[tuple[int, int | None]]],
                  label: str) -> None:
    """Refuses (UserError) a bucket a torch.export program cannot take: an axis torch.export
    specialised to one size, or a size outside a torch.export.Dim's range. Not re-exported per bucket
    and compared instead: the graph is all there is, and a size it baked in as a constant (a mean's
    divisor, a reshape) is wrong the same way in the re-export and in the graph run at that size."""
    fixed_everywhere = all(lo == hi for axes in dims for lo, hi in axes)
    for b in buckets:
        for name, shape, axes in zip(names, b.shapes, dims):
            for axis, (n, (lo, hi)) in enumerate(zip(shape, axes)):
                if lo <= n and (hi is None or n <= hi):
                    continue
                if fixed_everywhere:
                    at = ", ".join(f"{k} {'x'.join(str(a) for a, _ in ax)}" for k, ax in zip(names, dims))
                    raise UserError(
                        f"{label} was exported at one shape ({at}), so its graph runs at that shape only and cannot "
                        f"take bucket {b.name}: export it with dynamic_shapes (a torch.export.Dim on the axes that "
                        "vary), or convert the module itself (the Python API with the nn.Module, a model.pt "
                        "manifest, or a state_dict with --model-class)")
                if lo == hi:
                    raise UserError(f"bucket {b.name}: input {name} axis {axis} is {n}, but {label} was exported "
                                    f"with that axis fixed at {lo}; give it a torch.export.Dim in dynamic_shapes "
                                    "to vary it")
                raise UserError(f"bucket {b.name}: input {name} axis {axis} is {n}, outside the range "
                                f"{lo}..{hi if hi is not None else 'unbounded'} that {label} was exported with "
                                "(its torch.export.Dim); export with a range that holds every bucket, or pick "
                                "buckets inside it")


def _named(m: LoadedModel) -> LoadedModel:
    """An in-memory module's inputs take forward()'s parameter names (input_0.. otherwise), which
    --shapes/--dynamic/--pad name."""
    if not all(re.fullmatch(r"input_\d+", n) for n in m.input_names):
        return m
    try:
        params = [p.name for p in inspect.signature(m.module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return m
    return dataclasses.replace(m, input_names=params[:len(m.input_names)]) if len(params) >= len(m.input_names) else m


def _given_rows(m: LoadedModel, path, flag: str, buckets: list[Bucket], pads: dict[str, Padding]) -> dict:
    """--eval-data (or --calib) rows of any length (a samples folder of .npy/.npz) sorted into buckets;
    each row goes to the smallest bucket that holds it. A row no bucket holds is bad input."""
    out = {"source": "random rows per bucket (half at the bucket's shape, half shorter and padded)", "rows": {},
           "labels": None}
    if not path:
        return out
    names = m.input_names
    varying = {i for i in range(len(names)) if len({b.shapes[i] for b in buckets}) > 1}
    specs = [eval_data.InputSpec(n, tuple(-1 if i in varying else d for d in buckets[-1].shapes[i]),
                                 str(a.dtype).replace("torch.", "")) for i, (n, a) in enumerate(zip(names, m.sample_args))]
    ev = eval_data.read(path, specs, flag)
    rows: dict[str, _BucketRows] = {b.name: _BucketRows() for b in buckets}
    for k, row in enumerate(ev.rows):
        b = smallest(row, buckets, pads, names)
        if b is None:
            shp = ", ".join("x".join(map(str, np.shape(x))) for x in row)
            raise UserError(f"{flag} row {k} ({shp}) fits no bucket (largest: "
                            f"{', '.join('x'.join(map(str, s)) for s in buckets[-1].shapes)}); add a bucket that "
                            "holds it or leave the row out")
        rows[b.name].rows.append(fit(row, b, names, pads))
        rows[b.name].unpadded.append(row)
        if ev.labels is not None:
            rows[b.name].labels.append(ev.labels[k])
    out.update(source=ev.source + " (each row in the smallest bucket that holds it)", rows=rows,
               labels=ev.labels is not None)
    return out


def _bucket_kind(m: LoadedModel, o: ConvertOptions, b: Bucket, below: Bucket | None, pads: dict[str, Padding],
                 given: dict, calib: dict | None, rng: np.random.Generator) -> tuple[ModuleKind, dict, str | None]:
    """The module kind for one bucket: sample inputs at its shape, parity rows padded into it, and
    PyTorch's outputs on the unpadded rows as the reference (the same shape: else the padded ones)."""
    names = m.input_names
    br = given["rows"].get(b.name)
    if given["rows"] and (br is None or not br.rows):
        raise UserError(f"--eval-data holds no row for bucket {b.name}: every bucket is checked on rows of its "
                        "shape; add rows of that length or drop the bucket")
    if br is None:
        n = o.samples or DEFAULT_SAMPLES
        unpadded = _random_rows(m, b, below, pads, n, rng)
        br = _BucketRows(rows=[fit(r, b, names, pads) for r in unpadded], unpadded=unpadded)
    try:
        ref_padded = _torch(m.module, br.rows)
        ref_unpadded = _torch(m.module, br.unpadded)
    except Exception as e:  # noqa: BLE001 - rows the model cannot run are bad input
        raise UserError(f"the model does not run on the rows of bucket {b.name} ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    # the export traces the first row: a length or mask input then holds a value valid at this shape
    mb = dataclasses.replace(m, sample_args=tuple(torch.from_numpy(np.array(x)) for x in br.rows[0]),
                             calibration=None, notes=list(m.notes))
    padded = [i for i, (r, u) in enumerate(zip(br.rows, br.unpadded))
              if any(np.shape(x) != np.shape(y) for x, y in zip(r, u))]
    out_names = m.output_names or [f"output_{k}" for k in range(len(ref_padded[0]))]
    fig, err = padding_check([ref_padded[i] for i in padded], [ref_unpadded[i] for i in padded], out_names, b)
    fig["padded_rows"], fig["rows"] = len(padded), len(br.rows)
    # the reference is PyTorch on the unpadded row wherever the output's shape does not depend on the padding
    ref = [[u if u.shape == p.shape else p for p, u in zip(po, uo)] for po, uo in zip(ref_padded, ref_unpadded)]
    given_kinds = {**output_kinds.parse(m.output_kinds or {}), **output_kinds.parse(o.output_kinds)}
    ev = eval_ref = None
    if br.labels:
        ev = eval_data.EvalData(br.rows, np.asarray(br.labels), f"{given['source']}: bucket {b.name}")
        eval_ref = ref
    kind = ModuleKind(mb, br.rows, f"{given['source']}: {len(br.rows)} rows, {len(padded)} padded", None, ref,
                      given_kinds, eval_set=ev, eval_ref=eval_ref, metric=o.metric, seed=o.seed)
    kind.max_drop_given = o.max_task_drop if isinstance(o.max_task_drop, dict) else task_score.parse_max_drop(
        o.max_task_drop, [])
    # static int8 calibrates on rows padded like the parity rows (a mask of random floats would set
    # ranges no real row reaches), never on the parity rows themselves
    if calib is not None and calib["rows"].get(b.name) and calib["rows"][b.name].rows:
        kind.calib_data = calib["rows"][b.name].rows
    else:
        kind.calib_data = [fit(r, b, names, pads) for r in _random_rows(m, b, below, pads, CALIB_ROWS, rng)]
    return kind, fig, err


def _layout(prof: TargetProfile) -> str:
    """signatures: one .tflite, a signature per bucket (ai-edge-litert and LiteRT.js load it and run
    each by name); files: one .tflite per bucket (TFLM runs a model's first subgraph only; an NPU compile
    takes one fixed-shape signature, so android-npu has a compiled file per bucket and SoC)."""
    return "signatures" if prof.runtime == "ai-edge-litert" and not prof.npu_socs else "files"


def _ship(prof: TargetProfile, per_bucket: list[_Bucketed], names: list[str], work: Path, made: dict,
          say: Progress) -> tuple[TargetResult, str, dict[str, Artifact]]:
    """One precision over all buckets, the buckets that ship (the profile's bucket_failure), and the
    shipped artifact(s) -> (the target's result, layout, {file name: artifact})."""
    rs = [x.results[prof.name] for x in per_bucket]
    precision = _one_precision(prof, rs)
    for x in per_bucket:
        if x.results[prof.name].quantization != precision and x.again is not None:
            say(f"{prof.name}: bucket {x.bucket.name} again at {precision} (one precision over all buckets)")
            only = dataclasses.replace(prof, precision=precision, precisions=[precision])
            x.results[prof.name] = x.again([only])[0]
    rs = [x.results[prof.name] for x in per_bucket]
    ok = [x for x, r in zip(per_bucket, rs) if r.passed]
    bad = [(x, r) for x, r in zip(per_bucket, rs) if not r.passed]
    layout = _layout(prof)
    out = TargetResult(target=prof.name, quantization=precision, runtime=rs[-1].runtime)
    out.buckets = []
    for x, r in zip(per_bucket, rs):
        out.buckets.append({"name": x.bucket.name, "inputs": x.bucket.to_json(names)["inputs"], "passed": r.passed,
                            "quantization": r.quantization, "size_bytes": r.size_bytes, "parity": r.parity,
                            "latency_ms": r.latency_ms, "errors": r.errors, "failure": r.failure,
                            "chosen_because": r.chosen_because, "timings_s": r.timings_s})
        out.warnings += [f"bucket {x.bucket.name}: {w}" for w in r.warnings]
    for k in ("export", "quantize", "checks", "parity", "latency"):
        out.timings_s[k] = sum(r.timings_s.get(k, 0.0) for r in rs)
    out.latency_ms = rs[-1].latency_ms if ok else None
    out.parity = _merged_parity(rs)
    if prof.npu_socs:  # android-npu: each bucket compiled per SoC and run on the HTP simulator (pipeline's _npu)
        out.npu = {"qnn_version": next((r.npu["qnn_version"] for r in rs if r.npu), None),
                   "buckets": {x.bucket.name: r.npu for x, r in zip(per_bucket, rs) if r.npu}}
    named = [f"bucket {x.bucket.name} failed: {r.errors[0] if r.errors else r.failure}" for x, r in bad]
    if bad and (prof.bucket_failure != "drop" or not ok):
        out.passed = False
        out.failure = "parity" if any(r.failure == "parity" for _, r in bad) else bad[0][1].failure
        out.errors = named + [e for _, r in bad for e in r.errors[1:2]]
        arts = {f"model_{x.bucket.name}.tflite": r.artifact for x, r in zip(per_bucket, rs) if r.artifact}
        return out, "files", arts
    if bad:
        out.warnings += [f"{n} (shipped without it: the profile's bucket_failure is drop)" for n in named]
    out.passed = True
    if layout == "files":
        arts = {f"model_{x.bucket.name}.tflite": x.results[prof.name].artifact for x in ok}
        out.size_bytes = sum(len(a.model) for a in arts.values())
        return out, layout, arts
    try:
        art, check = _signature_artifact(prof, precision, ok, work, made, say)
    except Exception as e:  # noqa: BLE001 - the export, the quantizer or a runtime: this target fails, the others ship
        why = str(e) if isinstance(e, ConversionError) else f"{type(e).__name__}: {first_line(e)}"
        out.passed, out.failure = False, "conversion"
        out.errors.append(f"the buckets pass one by one, but the file with a signature per bucket could not be made "
                          f"or checked: {why}")
        return out, "files", {f"model_{x.bucket.name}.tflite": x.results[prof.name].artifact for x in ok}
    out.parity["signature_file"] = check
    for x, b in zip(per_bucket, out.buckets):  # batch through resize_tensor_input, where the graph allows it
        if b["passed"]:
            b["batch_resize"] = batch_resize(x.results[prof.name].artifact.model, x.kind.samples)
    out.size_bytes = len(art.model)
    if not check["passed"]:
        out.passed, out.failure = False, "parity"
        out.errors.append(check["reason"])
    return out, layout, {"model.tflite": art}


def _one_precision(prof: TargetProfile, rs: list[TargetResult]) -> str:
    """The profile's most preferred precision that passed in every bucket; else the largest bucket's."""
    if len({r.quantization for r in rs}) == 1:
        return rs[0].quantization
    passed: list[set[str]] = []
    for r in rs:
        got = {c["precision"].split("+")[0] for c in (r.candidates or []) if c["passed"]}
        passed.append(got | ({r.quantization} if r.passed else set()))
    for p in list(prof.precisions) or [prof.precision]:
        if all(p in s for s in passed):
            return p
    return rs[-1].quantization


def _merged_parity(rs: list[TargetResult]) -> dict:
    ps = [r.parity or {} for r in rs]

    def agg(key, fn):
        vals = [p[key] for p in ps if isinstance(p.get(key), (int, float))]
        return fn(vals) if vals else None

    merged = {"passed": all(r.passed for r in rs), "cosine": agg("cosine", min), "cosine_mean": agg("cosine_mean", min),
              "max_abs": agg("max_abs", max), "top1": agg("top1", min), "decided_by": "every bucket (buckets[])"}
    return {k: v for k, v in merged.items() if v is not None}


def _signature_artifact(prof: TargetProfile, precision: str, ok: list[_Bucketed], work: Path, cache: dict,
                        say: Progress) -> tuple[Artifact, dict]:
    """The buckets as signatures of one .tflite at `precision` (weights once: litert-torch stores equal
    constants once), each signature run on ai-edge-litert against PyTorch and the bucket's own checked file."""
    key = (precision, tuple(x.bucket.name for x in ok))
    if key not in cache:
        fkey = key[1]
        if fkey not in cache:
            say(f"export: one .tflite with {len(ok)} signatures (litert-torch)")
            cache[fkey] = export_signatures([(x.bucket.name, x.kind.m) for x in ok], work / "signatures.tflite")
        float_model = cache[fkey]
        calib = None
        if precision in CALIBRATED:
            # each bucket's calibration rows, under its signature's input names
            calib = signature_calibration(float_model, {x.bucket.name: x.kind.calib for x in ok})
        cache[key] = quantize(float_model, precision, calib)
    model = cache[key]
    runners, skipped = {"ai-edge-litert": run_signature}, {}
    if prof.browser_parity and (why := browser_unavailable()):
        skipped["litert.js"] = why  # as each bucket's own browser run says: not run, never passed
    elif prof.browser_parity:  # the page loads the one file and runs each signature by name
        say(f"{prof.name}: each signature of the shipped file in LiteRT.js (headless Chromium)")
        runners["litert.js"] = run_signature_litertjs
    figures, worst = {}, None
    for x in ok:
        r = x.results[prof.name]
        own = _outputs_of(r, x.kind.samples)
        per = {}
        for where, runner in runners.items():
            got = runner(model, x.bucket.name, x.kind.samples)
            for k in range(len(x.kind.ref[0])):
                c = parity.compare([row[k] for row in x.kind.ref], [row[k] for row in got], kind=x.kind.output_kind(k))
                same = max(float(np.abs(np.asarray(g[k], np.float64) - np.asarray(o_[k], np.float64)).max(initial=0))
                           for g, o_ in zip(got, own)) if own else None
                per.setdefault(x.kind.output_names[k], {})[where] = {
                    "cosine": c["cosine"], "cosine_mean": c.get("cosine_mean"), "max_abs": c["max_abs"],
                    "max_abs_vs_bucket_file": same}
                cos = c.get("cosine_mean", c["cosine"]) if not prof.check_abs else c["cosine"]
                if cos < prof.min_cosine and (worst is None or cos < worst[0]):
                    worst = (cos, x.bucket.name, x.kind.output_names[k], where)
        figures[x.bucket.name] = per
    check = {"runtime": ", ".join(runners) + ": each signature by name (max_abs_vs_bucket_file: against the "
             "bucket's own checked file on ai-edge-litert)", "signatures": figures, "bytes": len(model),
             "passed": worst is None, **({"skipped": skipped} if skipped else {})}
    if worst is not None:
        check["reason"] = (f"signature {worst[1]} of the shipped file on {worst[3]}: output {worst[2]} cosine "
                           f"{worst[0]:.6f} against PyTorch, under the profile's {prof.min_cosine}")
    return Artifact(model=model, precision=precision), check


def _outputs_of(r: TargetResult, rows) -> list | None:
    """The bucket's own checked file on the same rows (its one signature), for the shipped file to match."""
    if r.artifact is None:
        return None
    try:
        return run_signature(r.artifact.model, None, rows)
    except Exception:  # noqa: BLE001 - the comparison is a figure, not a verdict
        return None


def _write(prof: TargetProfile, r: TargetResult, layout: str, arts: dict[str, Artifact], per_bucket: list[_Bucketed],
           shapes_json: dict, stage: Path, out: Path) -> None:
    rel = Path(prof.name) / ("" if r.passed else "failed")
    sub = stage / rel
    sub.mkdir(parents=True, exist_ok=True)
    for fname, a in arts.items():
        (sub / fname).write_bytes(a.model)
    first = next(iter(arts), None)
    r.artifact_path = str(out / rel / first) if first else None
    r.sha256 = files.sha256_file(sub / first) if first else None
    entries = []
    for b in r.buckets:
        e = {"name": b["name"], "inputs": b["inputs"], "passed": b["passed"]}
        fname = f"model_{b['name']}.tflite"
        if layout == "files" and fname in arts:
            e["file"] = fname
            e["sha256"] = files.sha256_file(sub / fname)
            e["io"] = signature_io(arts[fname].model, None)
            if r.passed and prof.firmware:
                e["firmware"] = _bucket_firmware(prof, arts[fname].model, b["name"], sub, e["sha256"], r)
        elif layout == "signatures" and b["passed"]:
            e["file"], e["signature"], e["batch_resize"] = "model.tflite", b["name"], b.get("batch_resize")
            e["io"] = signature_io(arts["model.tflite"].model, b["name"])
        entries.append(e)
    r.firmware = {"buckets": {e["name"]: e["firmware"] for e in entries if e.get("firmware")}} if prof.firmware and r.passed else None
    # inputs and outputs as the largest bucket that was exported describes them; the figures are the target's
    x = next((x for x in reversed(per_bucket) if x.results[prof.name].info is not None), per_bucket[-1])
    kind = x.kind
    base = kind.model_json(x.results[prof.name]) if x.results[prof.name].info is not None else {
        "format": "tpu-pipeline/litert-artifact@1", "task": kind.m.task, "notes": kind.notes}
    base.update({"target": r.target, "passed": r.passed, "quantization": r.quantization, "runtime": r.runtime,
                 "size_bytes": r.size_bytes, "sha256": r.sha256, "parity": r.parity, "latency_ms": r.latency_ms,
                 "errors": r.errors, "warnings": r.warnings, "firmware": r.firmware})
    for o_ in base.get("outputs", []):
        o_.pop("shape", None)  # per bucket: each signature's own
    base.pop("signature", None)
    for i_ in base.get("inputs", []):
        i_.pop("shape", None)  # per bucket: shapes.signatures[].inputs
    base["shapes"] = {"layout": layout, "signatures": entries, "padding": shapes_json["padding"],
                      "choose": "the smallest bucket whose shape holds the input on every axis; pad by `padding`, "
                                "run that signature (or file), crop outputs that grew with the padding"}
    language = ("js" if prof.browser_parity else {"kotlin": "kotlin", "swift": "swift"}.get(prof.app_snippet)
                ) if layout == "signatures" else ("cpp" if prof.firmware else
                                                  "kotlin-npu" if prof.app_snippet == "kotlin-npu" else None)
    if r.passed and language:
        written = bucket_snippets.write(language, base, sub, out.name)
        if written is not None:
            r.app_snippet = base["app_snippet"] = str(out / rel / written.name)
    files.atomic_write_json(sub / "model.json", base)
    if r.npu:
        _write_npu(r, per_bucket, entries, base, sub, out / rel, out.name)


def _write_npu(r: TargetResult, per_bucket: list[_Bucketed], entries: list[dict], base: dict, sub: Path,
               where: Path, model_name: str) -> None:
    """android-npu: DIR/android-npu/<SoC>/model_<bucket>.tflite, each bucket's compile for that SoC,
    and <SoC>/model.json listing them with their partition stats and simulator figures."""
    written = {e["name"]: e["inputs"] for e in entries if e.get("file")}
    compiled_buckets = [(x.bucket.name, x.results[r.target]) for x in per_bucket
                        if x.bucket.name in written and x.results[r.target].npu_models]
    per_soc: dict[str, list[dict]] = {}
    for name, b in compiled_buckets:
        for soc, compiled in b.npu_models.items():
            (sub / soc).mkdir(exist_ok=True)
            fname = f"model_{name}.tflite"
            (sub / soc / fname).write_bytes(compiled)
            stats = b.npu["socs"][soc]
            stats["artifact"] = str(where / soc / fname)
            per_soc.setdefault(soc, []).append({
                "name": name, "inputs": written[name], "file": fname,
                "sha256": files.sha256_file(sub / soc / fname), "size_bytes": len(compiled),
                "npu": {k: v for k, v in stats.items() if k != "soc"}})
    for soc, signatures in per_soc.items():  # sha256 and size_bytes as the files layout's: the first file, all files
        files.atomic_write_json(sub / soc / "model.json", soc_model_json(
            base, soc, r.npu["qnn_version"], sha256=signatures[0]["sha256"],
            size_bytes=sum(e["size_bytes"] for e in signatures), shapes={**base["shapes"], "signatures": signatures}))
    if not r.passed or not compiled_buckets:
        return
    try:  # Play's AI pack (LiteRT's exporter): each group holds a model_<bucket>.tflite per bucket
        for name, b in compiled_buckets:
            pack = write_ai_pack(b.artifact.model, b.npu_models, sub / "ai_pack", model_name, file_name=f"model_{name}")
        r.npu["ai_pack"] = {"dir": str(where / "ai_pack"), "files": pack}
    except Exception as e:  # noqa: BLE001 - an app file: the artifacts passed either way
        r.warnings.append(f"no AI pack: LiteRT's exporter failed ({type(e).__name__}: {first_line(e)})")


def _bucket_firmware(prof: TargetProfile, model: bytes, name: str, sub: Path, sha: str, r: TargetResult) -> dict | None:
    """model_data_<bucket>.h/.cc (symbol g_model_<bucket>) and that bucket's measured TFLM arena."""
    try:
        used = measure_arena(model, max_arena=prof.max_arena_bytes or 64 * 1024 * 1024)
    except Exception as e:  # noqa: BLE001 - the artifact passed; only its firmware files are missing
        r.warnings.append(f"bucket {name}: no firmware files: {e}")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_c_array(model, tmp, arena_used=used, sha256=sha, symbol=f"g_model_{name}")
        written = []
        for p in paths:
            dest = sub / p.name.replace("model_data", f"model_data_{name}")
            dest.write_text(p.read_text().replace('"model_data.h"', f'"model_data_{name}.h"'))
            written.append(dest.name)
    return {"files": written, "arena_used_bytes": used, "tensor_arena_size": suggested_arena(used),
            "measured_on": "tflite-micro interpreter"}

