"""PyTorch -> one float32 .tflite with litert-torch. Every target variant is
derived from this one artifact (quantize.py): the model is traced once."""

from __future__ import annotations

from pathlib import Path

from tpu_pipeline.convert.module.loaders import LoadedModel
from tpu_pipeline.convert.module.lstm_reset import reset_states
from tpu_pipeline.convert.module.recurrent import register_lowering
from tpu_pipeline.convert.tool_output import first_line, quiet_native
from tpu_pipeline.errors import ConversionError


def export_float(model: LoadedModel, path: Path) -> bytes:
    """Converts `model` at its sample inputs; returns the .tflite bytes (also written to `path`)."""
    try:
        import litert_torch  # heavy: ~8 s to import (the TFLite converter stack); only exports need it

        register_lowering()  # recurrent.FusedLSTM's op -> UNIDIRECTIONAL_SEQUENCE_LSTM
        with quiet_native():
            edge = litert_torch.convert(model.module, model.sample_args)
            edge.export(str(path))
    except Exception as e:  # noqa: BLE001 - the converter raises many types; all mean "cannot convert"
        raise ConversionError(f"litert-torch could not convert the model: {type(e).__name__}: {first_line(e)}") from None
    model_bytes = reset_states(path.read_bytes())  # fused LSTMs start every invoke from a zero state
    path.write_bytes(model_bytes)
    return model_bytes
