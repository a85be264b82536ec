"""Image task families: classification (ViT, DeiT, ConvNeXt, ResNet, ...), semantic
segmentation (Segformer, ...) and DETR-style object detection. Pixels go through the folder's
own image processor, its Pillow backend: Transformers 5.10's AutoImageProcessor and its default
backend need torchvision, which does not run beside the CPU torch here (docs/DESIGN.md)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tpu_pipeline.convert.app_io import ImageInput
from tpu_pipeline.convert.hf import raw_data
from tpu_pipeline.convert.hf.families import PREPROCESSOR, Rows, TaskFamily, preprocessor_config, register_family
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.convert.verdict import task_score
from tpu_pipeline.errors import UserError

def image_processor(folder):
    """The folder's image processor, Pillow backend (`<type>Pil`), read from preprocessor_config.json."""
    import transformers  # heavy; only HF folders need it

    cfg = preprocessor_config(folder, "image processor")
    try:
        kind = json.loads(cfg.read_text(encoding="utf-8")).get("image_processor_type") or ""
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise UserError(f"{cfg}: cannot read it as JSON ({type(e).__name__})") from None
    base = kind.removesuffix("Pil").removesuffix("Fast")
    if not base.endswith("ImageProcessor"):
        raise UserError(f"{cfg}: image_processor_type {kind!r} is not a Transformers image processor")
    cls = _pil_class(transformers, base, folder.config.get("model_type", ""))
    if cls is None:
        raise UserError(f"{cfg}: Transformers {transformers.__version__} has no Pillow backend for {base} "
                        "(its other backend needs torchvision)")
    try:
        return cls.from_pretrained(folder.path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a malformed config fails in many ways
        raise UserError(f"{cfg}: {base} cannot read it ({type(e).__name__}: {first_line(e)})") from None


def _pil_class(transformers, base: str, model_type: str):
    cls = getattr(transformers, base + "Pil", None)
    try:
        if cls is not None:
            cls()  # a placeholder class (a backend missing) raises here
            return cls
    except ImportError:
        pass
    # Some Pil classes are marked as needing torchvision though their image path does not
    # (SegformerImageProcessorPil in 5.10): its own module still imports without it.
    try:
        mod = importlib.import_module(f"transformers.models.{model_type}.image_processing_pil_{model_type}")
    except ImportError:
        return None
    return getattr(mod, base + "Pil", None)


class _ImageFamily(TaskFamily):
    def __init__(self, folder, model, max_len):
        super().__init__(folder, model, max_len)
        self.processor = image_processor(folder)
        size = self.processor.size
        h, w = (size.get("height"), size.get("width")) if "height" in size else (None, None)
        if h is None:
            edge = size.get("shortest_edge") or size.get("longest_edge")
            h = w = int(edge) if edge else None
        if h is None:
            raise UserError(f"{folder.path / PREPROCESSOR}: size {size} gives no fixed image size")
        self.height, self.width = int(h), int(w)
        if "height" not in size:
            # a fixed-shape artifact takes one size: every image is resized to it (the processor would keep
            # the aspect ratio and crop, or vary the size per image)
            self.processor.size = {"height": self.height, "width": self.width}
            self.notes.append(f"images resized to {self.height}x{self.width} (the processor's size {size}, fixed "
                              "for the artifact)")

    @property
    def input_names(self) -> list[str]:
        return ["pixel_values"]

    @property
    def sample_args(self) -> tuple[torch.Tensor, ...]:
        grey = np.full((self.height, self.width, 3), 128, np.uint8)
        return (torch.from_numpy(self._pixels([grey])[0]),)

    def _pixels(self, images: list[np.ndarray]) -> list[np.ndarray]:
        out = self.processor(images=images, return_tensors="np")["pixel_values"].astype(np.float32)
        return [out[i:i + 1] for i in range(len(out))]

    def _decoded(self, items, flag: str) -> list[list[np.ndarray]]:
        return [[p] for p in self._pixels([raw_data.decode_image(it.value, flag) for it in items])]

    def image_input(self) -> ImageInput:
        """HF normalises pixel * rescale_factor; MediaPipe's NormalizationOptions take 0..255 pixels:
        (p * r - m) / s = (p - m / r) / (s / r)."""
        p = self.processor
        r = float(p.rescale_factor) if p.do_rescale else 1.0
        mean = p.image_mean if p.do_normalize else [0.0] * 3
        std = p.image_std if p.do_normalize else [1.0] * 3
        return ImageInput(name="pixel_values", mean=tuple(float(m) / r for m in mean),
                          std=tuple(float(s) / r for s in std), layout="NCHW")

    def describe(self) -> dict:
        p = self.processor
        return {"processor": type(p).__name__, "size": [self.height, self.width], "rescale_factor": p.rescale_factor,
                "image_mean": p.image_mean, "image_std": p.image_std, "decoder": raw_data.IMAGE_DECODER}


@register_family("image-classification")
class ImageClassification(_ImageFamily):
    """Image classifiers (ViTForImageClassification, ...): pixel_values -> logits; images by label folder."""

    auto_class, mapping = "AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"

    def app_io(self) -> dict:
        return {"image": self.image_input(), "labels": self.labels()}

    def rows(self, path: Path, flag: str) -> Rows:
        items = raw_data.images(path, flag)
        labels = self.label_ids(items, lambda it: f"{flag} {it.where}")
        how = f"{raw_data.IMAGE_DECODER} + {type(self.processor).__name__}"
        return Rows(self._decoded(items, flag), labels, f"{flag} {path.name}/ ({len(items)} images, {how})")


@register_family("semantic-segmentation")
class SemanticSegmentation(_ImageFamily):
    """Semantic segmentation (SegformerForSemanticSegmentation, ...): pixel_values -> per-pixel logits;
    labels are mask PNGs, scored by mean IoU."""

    auto_class, mapping = "AutoModelForSemanticSegmentation", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES"
    output_kinds = {"logits": "dense_map"}

    def rows(self, path: Path, flag: str) -> Rows:
        items = raw_data.image_masks(path, flag)
        rows = self._decoded(items, flag)
        if items[0].label is None:
            return Rows(rows, None, f"{flag} {path.name}/images ({len(items)} images, no masks)")
        with torch.no_grad():
            h, w = self.model(pixel_values=torch.from_numpy(rows[0][0])).logits.shape[-2:]
        labels = np.stack([self._mask(it.label, (int(w), int(h)), flag) for it in items])
        return Rows(rows, labels, f"{flag} {path.name}/ ({len(items)} images and masks, {raw_data.IMAGE_DECODER} + "
                                  f"{type(self.processor).__name__}; masks resized to the logits' {h}x{w}, nearest)")

    def _mask(self, path: Path, size: tuple[int, int], flag: str) -> np.ndarray:
        m = raw_data.decode_mask(path, flag)
        classes = len(self.folder.labels)
        bad = m[(m >= classes) & (m != 255)]  # 255: HF's ignore index
        if bad.size:
            raise UserError(f"{flag} {path}: class {int(bad[0])} is not in the model's {classes} labels")
        # the model's logits are coarser than its input (Segformer: 1/4): the mask is scored at their size
        return np.asarray(Image.fromarray(m.astype(np.uint8)).resize(size, Image.NEAREST), np.int64)


@register_family("object-detection")
class ObjectDetection(_ImageFamily):
    """DETR-style detectors (DetrForObjectDetection, ...): pixel_values -> class logits per query (the last
    class: no object) and boxes (cx, cy, w, h in 0..1); images with boxes.csv, scored by mAP@0.5."""

    auto_class, mapping = "AutoModelForObjectDetection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES"
    output_names = ("logits", "pred_boxes")
    output_kinds = {"logits": "logits", "pred_boxes": "regression"}

    def rows(self, path: Path, flag: str) -> Rows:
        items = raw_data.image_boxes(path, flag)
        images = [raw_data.decode_image(it.value, flag) for it in items]
        rows = [[p] for p in self._pixels(images)]
        if all(it.label is None for it in items):
            return Rows(rows, None, f"{flag} {path.name}/ ({len(items)} images, no boxes)")
        labels = np.empty(len(items), object)
        for i, (it, img) in enumerate(zip(items, images)):
            h, w = img.shape[:2]
            labels[i] = np.array([[raw_data.label_index(name, self.folder.label2id, where), x0 / w, y0 / h, x1 / w,
                                   y1 / h] for name, x0, y0, x1, y1, where in it.label], np.float64).reshape(-1, 5)
        n = sum(len(b) for b in labels)
        return Rows(rows, labels, f"{flag} {path.name}/ ({len(items)} images, {n} boxes from {raw_data.BOXES_FILE}; "
                                  f"{raw_data.IMAGE_DECODER} + {type(self.processor).__name__})")

    def metric(self) -> task_score.Metric:
        return task_score.map50(len(self.folder.labels))

    def describe(self) -> dict:
        return {**super().describe(), "boxes": "cx, cy, w, h in 0..1 of the image (pred_boxes)"}
