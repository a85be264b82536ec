"""ExecuTorch's side of bench/vs_executorch.py: runs in .venv-executorch (`make .venv-executorch/.installed`),
never imports tpu_pipeline. One JSON command per stdin line, one JSON answer per stdout line:

    {"cmd": "lower", "pt2": P, "calib": NPZ, "out": DIR}  -> fp32 and PT2E int8 .pte files, seconds, partitions
    {"cmd": "run", "pte": P, "rows": NPZ, "out": NPZ}      -> the program's first output on every row
    {"cmd": "time", "pte": P, "rows": NPZ, "threads": N, "runs": R}  -> median ms of R calls on row 0

fp32: `to_edge_transform_and_lower(..., partitioner=[XnnpackPartitioner()])`; int8: PT2E with
XNNPACKQuantizer's symmetric per-channel config, calibrated on the rows given, as ExecuTorch's
XNNPACK tutorial does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
from executorch.devtools.backend_debug import get_delegation_info
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

_methods: dict[str, object] = {}


def _rows(path: str) -> list[tuple[torch.Tensor, ...]]:
    z = np.load(path)
    n = len([k for k in z.files if k.startswith("in")])
    return [tuple(torch.from_numpy(z[f"in{i}"][r:r + 1]) for i in range(n)) for r in range(len(z["in0"]))]


def _lower(ep: torch.export.ExportedProgram, path: Path) -> dict:
    t = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    info = get_delegation_info(edge.exported_program().graph_module)
    path.write_bytes(edge.to_executorch().buffer)
    return {"pte": str(path), "lower_s": time.perf_counter() - t, "bytes": path.stat().st_size,
            "partitions": info.num_delegated_subgraphs, "delegated_nodes": info.num_delegated_nodes,
            "other_nodes": info.num_non_delegated_nodes}


def lower(pt2: str, calib: str, out: str) -> dict:
    out_dir = Path(out)
    ep = torch.export.load(pt2)
    rows = _rows(calib)
    fp32 = _lower(ep, out_dir / "et_fp32.pte")
    t = time.perf_counter()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    m = prepare_pt2e(ep.module(), quantizer)
    for row in rows:
        m(*row)
    m = convert_pt2e(m)
    qep = torch.export.export(m, rows[0])
    quant_s = time.perf_counter() - t
    int8 = _lower(qep, out_dir / "et_int8.pte")
    int8["lower_s"] += quant_s
    return {"fp32": fp32, "int8": int8}


def _method(pte: str):
    if pte not in _methods:
        _methods[pte] = Runtime.get().load_program(Path(pte)).load_method("forward")
    return _methods[pte]


def run(pte: str, rows: str, out: str) -> dict:
    m = _method(pte)
    ys = [m.execute(list(row))[0].numpy().copy() for row in _rows(rows)]
    np.save(out, np.concatenate(ys))
    return {"out": out}


def timed(pte: str, rows: str, threads: int, runs: int) -> dict:
    portable_lib._unsafe_reset_threadpool(threads)  # XNNPACK's thread pool, as an app sets it
    m, row = _method(pte), list(_rows(rows)[0])
    m.execute(row)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        m.execute(row)
        times.append(time.perf_counter() - t)
    return {"ms": float(np.median(times) * 1e3)}


def main() -> None:
    torch.set_num_threads(1)
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req.pop("cmd")
        try:
            ans = {"lower": lower, "run": run, "time": timed}[cmd](**req)
        except Exception as e:  # noqa: BLE001 - the bench records ExecuTorch's failure and goes on
            ans = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
