"""Runs a .tflite on the TFLM interpreter in a child process.

TFLM aborts the whole process (SIGSEGV) when the arena is too small or an op
is missing, so the parent only ever sees an exit status and a message.
Usage: python _micro_worker.py MODEL.tflite INPUTS.npz OUTPUTS.npz ARENA_BYTES N_OUTPUTS
INPUTS.npz holds in_<position>_<sample> arrays; OUTPUTS.npz gets out_<position>_<sample>.
"""

import sys

import numpy as np
from tflite_micro.python.tflite_micro import runtime


def main(model_path, inputs_path, outputs_path, arena, n_out):
    data = np.load(inputs_path)
    n_in = 1 + max(int(k.split("_")[1]) for k in data.files)
    n_samples = 1 + max(int(k.split("_")[2]) for k in data.files)
    with open(model_path, "rb") as f:
        interp = runtime.Interpreter.from_bytes(f.read(), arena_size=int(arena))
    out = {}
    for s in range(n_samples):
        for i in range(n_in):
            interp.set_input(data[f"in_{i}_{s}"], i)
        interp.invoke()
        for j in range(int(n_out)):
            out[f"out_{j}_{s}"] = np.array(interp.get_output(j))
    np.savez(outputs_path, **out)


if __name__ == "__main__":
    try:
        main(*sys.argv[1:6])
    except Exception as e:  # noqa: BLE001 - one line for the parent's reason (TFLM printed its own first)
        print(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}", file=sys.stderr)
        sys.exit(1)
