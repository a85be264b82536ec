"""Runs TFLite's post-training calibrator and quantizer on a .tflite in a child process.

A native tool that may crash (SIGSEGV) on a graph it does not expect: in a child, the parent
only sees an exit status and a message. The wrapper keeps a pointer to the model bytes it is
given without owning them: they are held in a variable for its lifetime (a temporary crashed
or made an empty model at random).
Usage: python _lstm_calibrator.py FLOAT.tflite CALIB.npz OUT.tflite
CALIB.npz holds in_<position>_<row> arrays; OUT.tflite gets int8 in, int8 out, every op integer.
"""

import sys

import numpy as np
from ai_edge_litert import _pywrap_tensorflow_lite_calibration_wrapper as calibrator


def main(model_path, calib_path, out_path):
    data = np.load(calib_path)
    n_in = 1 + max(int(k.split("_")[1]) for k in data.files)
    n_rows = 1 + max(int(k.split("_")[2]) for k in data.files)
    rows = [[data[f"in_{i}_{r}"] for i in range(n_in)] for r in range(n_rows)]
    with open(model_path, "rb") as f:
        with_intermediates = calibrator.AddIntermediateTensors(f.read())  # must outlive `c`
    c = calibrator.CalibrationWrapper(with_intermediates, [], [])
    c.Prepare([list(x.shape) for x in rows[0]])
    for row in rows:
        c.FeedTensor(row)
    int8, int32 = np.dtype(np.int8).num, np.dtype(np.int32).num
    # input, output, allow_float=False, activations, biases, per-channel on, dense per-channel on
    model = bytes(c.QuantizeModel(int8, int8, False, int8, int32, False, False))
    if len(model) < 64:  # the quantizer returns an empty flatbuffer on failure, its reason on stderr
        sys.exit("TFLite's quantizer returned an empty model")
    with open(out_path, "wb") as f:
        f.write(model)


if __name__ == "__main__":
    main(*sys.argv[1:4])
