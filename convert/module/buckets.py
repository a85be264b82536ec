"""Shape buckets on the export side (convert/shapes.py): one .tflite holding a
signature per bucket, and running one signature of it by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpu_pipeline.convert.module.global_pool import as_mean
from tpu_pipeline.convert.module.loaders import LoadedModel
from tpu_pipeline.convert.module.lstm_reset import reset_states
from tpu_pipeline.convert.module.max_pool import as_amax
from tpu_pipeline.convert.module.recurrent import as_fused, register_lowering
from tpu_pipeline.convert.tool_output import first_line, quiet_native
from tpu_pipeline.errors import ConversionError


def export_signatures(models: list[tuple[str, LoadedModel]], path: Path) -> bytes:
    """One float32 .tflite with a signature per (name, model at that bucket's sample inputs). Each
    bucket's module gets the rewrites export_float gives it (they depend on the shape: a pool that
    covers the whole map at one size does not at another); litert-torch writes constants equal in
    content once, so the weights are stored once however many signatures share them."""
    try:
        import litert_torch  # heavy: the TFLite converter stack

        register_lowering()
        chain = litert_torch
        for name, m in models:
            module, _ = as_mean(m.module, m.sample_args)
            module, _ = as_amax(module)
            module, _ = as_fused(module, m.sample_args)
            chain = chain.signature(name, module, m.sample_args)
        with quiet_native():
            chain.convert().export(str(path))
    except Exception as e:  # noqa: BLE001 - the converter raises many types; all mean "cannot convert"
        raise ConversionError(f"litert-torch could not convert the buckets as signatures: {type(e).__name__}: "
                              f"{first_line(e)}") from None
    data = reset_states(path.read_bytes())
    path.write_bytes(data)
    return data


def _runner(model: bytes, signature: str | None):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    sigs = list(it.get_signature_list())
    return it.get_signature_runner(signature if signature is not None else sigs[0])


def _ordered(details: dict) -> list[str]:
    """A signature's input (or output) keys in forward() order: args_0, args_1, ... / output_0, ..."""
    return sorted(details, key=lambda k: (len(k), k))


def _quantized(x: np.ndarray, d: dict) -> np.ndarray:
    scale, zero = d["quantization"]
    if np.dtype(d["dtype"]).kind in "iu" and scale:
        info = np.iinfo(d["dtype"])
        return np.clip(np.round(np.asarray(x, np.float32) / scale) + zero, info.min, info.max).astype(d["dtype"])
    return np.asarray(x).astype(d["dtype"])


def run_signature(model: bytes, signature: str | None, rows: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """`rows` through one signature of `model` on ai-edge-litert (XNNPACK; None: its first signature),
    quantized inputs and outputs converted with the signature's own scales -> float32 outputs per row."""
    run = _runner(model, signature)
    ins, outs = run.get_input_details(), run.get_output_details()
    got = []
    for row in rows:
        res = run(**{k: _quantized(x, ins[k]) for k, x in zip(_ordered(ins), row)})
        row_out = []
        for k in _ordered(outs):
            y, (scale, zero) = np.asarray(res[k]), outs[k]["quantization"]
            row_out.append(((y.astype(np.float32) - zero) * scale) if y.dtype.kind in "iu" and scale
                           else y.astype(np.float32))
        got.append(row_out)
    return got


def signature_calibration(model: bytes, rows: dict[str, list[dict[str, np.ndarray]]]) -> dict[str, list[dict]]:
    """Per signature, calibration rows keyed by the float export's tensor names (in input order)
    -> keyed by that signature's input names, as ai-edge-quantizer calibrates a multi-signature model."""
    out = {}
    for name, sig_rows in rows.items():
        keys = _ordered(_runner(model, name).get_input_details())
        out[name] = [{k: v for k, v in zip(keys, r.values())} for r in sig_rows or []]
    return out




def signature_io(model: bytes, signature: str | None) -> dict:
    """One signature's inputs and outputs as an app feeds them (model.json): key, shape, dtype and
    the int8 scale/zero point when quantized (a bucket's own: static int8 calibrates each)."""
    run = _runner(model, signature)

    def one(details: dict) -> list[dict]:
        out = []
        for k in _ordered(details):
            d = details[k]
            scale, zero = d["quantization"]
            out.append({"key": k, "shape": [int(n) for n in d["shape"]], "dtype": np.dtype(d["dtype"]).name,
                        "quantization": {"scale": float(scale), "zero_point": int(zero)} if scale else None})
        return out

    return {"inputs": one(run.get_input_details()), "outputs": one(run.get_output_details())}


RESIZE_BATCH = 4  # the batch a bucket's file is resized to when its batch axis is checked


def batch_resize(model: bytes, rows: list[list[np.ndarray]], batch: int = RESIZE_BATCH) -> dict:
    """Whether ai-edge-litert (XNNPACK) runs `model` with its batch axis resized
    (resize_tensor_input) to `batch`, and gives each row the answer it gives that row alone.
    litert-torch bakes shapes into the graph: a conv net's ops follow a new batch (the
    two-resolution CNN: exact), a RESHAPE to a constant shape fails to prepare (the text CNN).
    -> {"works", "batch", "max_abs"} or {"works": False, "why"}."""
    from ai_edge_litert.interpreter import Interpreter

    rows = (list(rows) * batch)[:batch]
    try:
        alone = run_signature(model, None, rows)
        it = Interpreter(model_content=model)
        ins, outs = it.get_input_details(), it.get_output_details()
        for d in ins:
            it.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
        it.allocate_tensors()
        run = _runner(model, None)
        keys = _ordered(run.get_input_details())
        details = run.get_input_details()
        for d, k in zip(ins, keys):
            it.set_tensor(d["index"], np.concatenate([_quantized(r[keys.index(k)], details[k]) for r in rows]))
        it.invoke()
        worst = 0.0
        for k, d in enumerate(outs):
            y = np.asarray(it.get_tensor(d["index"]))
            scale, zero = d["quantization"]
            y = ((y.astype(np.float32) - zero) * scale) if y.dtype.kind in "iu" and scale else y.astype(np.float32)
            want = np.concatenate([a[k] for a in alone])
            if y.shape != want.shape:
                return {"works": False, "batch": batch, "why": f"output {k} has shape {list(y.shape)} at batch {batch}, "
                                                                 f"not {list(want.shape)}"}
            worst = max(worst, float(np.abs(y - want).max(initial=0)))
    except Exception as e:  # noqa: BLE001 - the interpreter refusing the resize is the finding
        return {"works": False, "batch": batch, "why": f"{type(e).__name__}: {first_line(e)}"}
    scale = max(float(np.abs(np.concatenate([np.ravel(x) for a in alone for x in a])).max(initial=0)), 1e-30)
    return {"works": worst <= 1e-5 * scale, "batch": batch, "max_abs": worst,
            **({} if worst <= 1e-5 * scale else {"why": f"rows differ batched and alone (max_abs {worst:.3g})"})}


def run_signature_litertjs(model: bytes, signature: str, rows: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """`rows` through one signature of `model` in headless Chromium (LiteRT.js, wasm), fed and read
    like run_signature (the signature's own keys, dtypes and int8 scales) -> float32 outputs per row."""
    from tpu_pipeline.convert.runtimes.browser import run_litertjs

    run = _runner(model, signature)
    ins, outs = run.get_input_details(), run.get_output_details()
    in_keys, out_keys = _ordered(ins), _ordered(outs)
    fed = [[_quantized(x, ins[k]) for k, x in zip(in_keys, row)] for row in rows]
    got = run_litertjs(model, fed, input_names=in_keys, output_names=out_keys, signature=signature)
    out = []
    for row in got:
        vals = []
        for k, y in zip(out_keys, row):
            y, (scale, zero) = np.asarray(y), outs[k]["quantization"]
            vals.append(((y.astype(np.float32) - zero) * scale) if y.dtype.kind in "iu" and scale
                        else y.astype(np.float32))
        out.append(vals)
    return out
