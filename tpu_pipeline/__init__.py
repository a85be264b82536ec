"""tpu-pipeline: train on TPU/GPU/CPU, improve with GRPO, ship as LiteRT."""

from tpu_pipeline._tpu_guard import guard as _guard

_guard()  # before anything below can import torch

__version__ = "0.1.0"

from tpu_pipeline.device import EAGER_MODES, Platform, available_devices, compile, eager_mode, select_device  # noqa: E402
from tpu_pipeline.errors import ConversionError, DivergedError, NotBuiltError, ParityError, PipelineError, UserError  # noqa: E402

__all__ = [
    "EAGER_MODES",
    "Platform",
    "available_devices",
    "compile",
    "eager_mode",
    "select_device",
    "ConversionError",
    "DivergedError",
    "NotBuiltError",
    "ParityError",
    "PipelineError",
    "UserError",
    "__version__",
]
