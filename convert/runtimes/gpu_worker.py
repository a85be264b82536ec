"""Runs a .tflite on LiteRT's GPU accelerator in a child process.

The accelerator (libLiteRtWebGpuAccelerator.so: ML Drift over WebGPU/Dawn) is
native code that talks to a Vulkan driver: a driver that hangs or aborts must
cost the parent a timeout or an exit status, never the conversion itself.
Usage: python gpu_worker.py MODEL.tflite JOB.json INPUTS.npz OUTPUTS.npz STATUS.json, or with no
arguments: the five paths as one JSON list on stdin (a worker started ahead of its job, whose
imports are done by the time the job is known).
JOB.json: {"signature": key, "inputs": [signature input keys], "outputs": [output keys]}.
INPUTS.npz holds in_<input>_<sample> arrays (already in the artifact's dtypes);
OUTPUTS.npz gets out_<output>_<sample>. STATUS.json: {"started": bool,
"fully_accelerated": bool, "error": str} ("error" when the accelerator or a run failed).
Imports only ai-edge-litert and numpy: the parent runs it by file.
"""

import json
import sys

import numpy as np
from ai_edge_litert.compiled_model import CompiledModel, HardwareAccelerator


def _write(path, status):
    with open(path, "w") as f:
        json.dump(status, f)


def main(model_path, job_path, inputs_path, outputs_path, status_path):
    with open(job_path) as f:
        job = json.load(f)
    sig = job["signature"]
    try:
        # GPU with the CPU as fallback, as apps compile: ops the GPU cannot run go to the CPU
        # (LiteRT logs which) instead of failing the whole model
        model = CompiledModel.from_file(model_path, hardware_accel=HardwareAccelerator.GPU | HardwareAccelerator.CPU)
    except Exception as e:  # noqa: BLE001 - the reason is in LiteRT's log on stderr; the parent reads it
        _write(status_path, {"started": False, "error": f"{type(e).__name__}: {str(e).strip()[:300]}"})
        return
    status = {"started": True, "fully_accelerated": bool(model.is_fully_accelerated())}
    _write(status_path, status)  # written before running: a crash during a run still says it started
    data = np.load(inputs_path)
    n_samples = 1 + max(int(k.rsplit("_", 1)[1]) for k in data.files)
    details = model.get_output_tensor_details(sig)
    out = {}
    try:
        for s in range(n_samples):
            ins = {}
            for i, name in enumerate(job["inputs"]):
                buf = model.create_input_buffer_by_name(sig, name)
                buf.write(np.ascontiguousarray(data[f"in_{i}_{s}"]))
                ins[name] = buf
            outs = {name: model.create_output_buffer_by_name(sig, name) for name in job["outputs"]}
            model.run_by_name(sig, ins, outs)
            for j, name in enumerate(job["outputs"]):
                d = details[name]
                n = int(np.prod(d["shape"], dtype=np.int64))
                out[f"out_{j}_{s}"] = np.asarray(outs[name].read(n, np.dtype(d["dtype"]))).reshape(d["shape"])
    except Exception as e:  # noqa: BLE001 - a run that fails on the accelerator: reported, not raised
        _write(status_path, {**status, "error": f"{type(e).__name__}: {str(e).strip()[:300]}"})
        return
    np.savez(outputs_path, **out)


def _run(paths):
    """main(), whose errors end this process with one line and status.json's "error", never a
    traceback: the parent turns them into the run's reason."""
    if not paths:  # a worker started ahead whose job never came (the parent closed its stdin)
        return 0
    try:
        main(*paths)
    except Exception as e:  # noqa: BLE001 - anything main() does not report itself: a bad job or input file
        error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        try:
            with open(paths[4]) as f:
                status = json.load(f)
        except (IndexError, OSError, ValueError):
            status = {"started": False}
        try:
            _write(paths[4], {**status, "error": error})
        except (IndexError, OSError):
            pass
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_run(sys.argv[1:6] if len(sys.argv) > 1 else json.loads(sys.stdin.readline() or "[]")[:5]))
