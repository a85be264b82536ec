"""App-facing I/O (docs/convert/apps.md): the input description (spec.py), the app graph
(NHWC, softmax head), TFLite metadata, and the MediaPipe Tasks check apps' clients judge by."""

from tpu_pipeline.convert.app_io.spec import AppIO, AudioInput, ImageInput, Labels, TextInput, describe

__all__ = ["AppIO", "AudioInput", "ImageInput", "Labels", "TextInput", "describe"]
