"""ConvertOptions: everything `tpu-pipeline convert` takes besides MODEL, as
one keyword-only dataclass (the CLI fills it from its flags). Some options
mean something for one model kind only; the pipeline refuses them for the
others (see ModelKind.refused_options)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence


@dataclasses.dataclass(kw_only=True)
class ConvertOptions:
    targets: str = "all"                 # all or a comma list of target names
    out: str | Path | None = None        # default dist/<model stem>/
    input_shapes: tuple[str, ...] = ()   # --input-shape, one per input
    shapes: tuple[str, ...] = ()         # --shapes NAME=SHAPE,SHAPE..: one signature (bucket) per shape (convert/shapes.py)
    dynamic: tuple[str, ...] = ()        # --dynamic NAME:AXIS=LO..HI (powers of two) or NAME:AXIS=A,B,C: the buckets
    pad: tuple[str, ...] = ()            # --pad NAME=zeros|none|length:INPUT|mask:INPUT: how a row fills its bucket
    model_class: str | None = None
    model_kwargs: str | None = None
    trust_pickle: bool = False
    calib: str | Path | Sequence | None = None  # .npz of representative inputs (static int8 calibration), or rows
                                     # (Python API: each a tuple of tensors, one per input)
    eval_data: str | Path | None = None  # .npz of parity inputs (+ a `labels` array), or a folder of samples
                                         # (one .npy/.npz each, labels in labels.csv): convert/verdict/eval_data.py
    metric: str | Callable | None = None  # task metric(outputs, labels) -> float: "module:function" or a function
                                         # (None: built-in by output kind when the eval data has labels)
    max_task_drop: float | str | dict[str, float] | None = None  # the task drop bound in the metric's own units:
                                         # a number, or per target "android=0.5,iot=1.0" (a bare number: every other
                                         # target's); None: the metric's max_drop, else each profile's max_task_drop
    samples: int | None = None           # parity rows per target (None: all of --eval-data, else at least
                                         # DEFAULT_SAMPLES drawn; LMs: PROMPTS_DEFAULT prompts)
    output_kinds: dict[str, str] | Sequence[str] = dataclasses.field(default_factory=dict)  # output name -> kind
                                         # (convert/verdict/output_kinds.py), or NAME=KIND strings (--output-kind)
    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    seed: int = 0
    latency: bool = True
    refine_rounds: int = 4               # accuracy-aware rounds for a failed quantized variant (0: off)
    profile_dir: str | Path | None = None
    prompts: str | Path | None = None    # LMs: text file, one parity prompt per line (default: random tokens)
    lm_max_len: int | None = None        # LMs: KV-cache length (default: min(max_position_embeddings, 256))
    lm_prefill_len: int | None = None    # LMs: tokens per prefill call (default: min(32, max_len))
    lm_task: Any = None                  # LMs: the task an rl policy was trained on (convert/lm/task_accuracy.LMTask;
                                         # the CLI passes the policy's recorded recipe): each bundle's accuracy on it
    # What an app hands the model (convert/app_io/spec.py, docs/convert/apps.md): a flag string or its record.
    # Each overrides the model.pt manifest's `app_io`; the artifacts become what MediaPipe Tasks loads.
    image: Any = None                    # "NAME[:mean=M:std=S]" or app_io.ImageInput: an RGB input (pixels 0..255)
    audio: Any = None                    # "NAME:rate=HZ" or app_io.AudioInput: a mono waveform in -1..1
    text: Any = None                     # "NAME:vocab=FILE" or app_io.TextInput: token ids of a regex tokenizer
    labels: Any = None                   # a file (one label per line, index = class), a list of names, or app_io.Labels
    metadata: dict[str, str] | Sequence[str] = dataclasses.field(default_factory=dict)  # TFLite metadata's
                                         # name/description/version/author/license: a dict or KEY=VALUE strings


# ConvertOptions field -> the CLI flag users know it by
FLAGS = {"input_shapes": "--input-shape", "shapes": "--shapes", "dynamic": "--dynamic", "pad": "--pad", "model_class": "--model-class", "model_kwargs": "--model-kwargs",
         "trust_pickle": "--trust-pickle", "calib": "--calib", "eval_data": "--eval-data", "prompts": "--prompts",
         "lm_max_len": "--max-len", "lm_prefill_len": "--prefill-len", "latency": "--no-latency",
         "refine_rounds": "--refine-rounds", "output_kinds": "--output-kind",
         "metric": "--metric", "max_task_drop": "--max-task-drop",
         "image": "--image", "audio": "--audio", "text": "--text", "labels": "--labels", "metadata": "--metadata"}

DEFAULT_SAMPLES = 64  # parity rows drawn when no --eval-data gives them all: a verdict that 8 rows decided
                      # flipped between redraws (issue 19)
PROMPTS_DEFAULT = 8   # LMs: greedy-generation prompts (held-out text judges quantized bundles besides)
