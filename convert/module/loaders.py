"""MODEL argument -> a float32 nn.Module on CPU plus its sample inputs.

Accepted forms (see `load_model`): torch.export archives, tpu-pipeline
model.pt manifests, state_dicts with --model-class, whole pickled modules
(only with --trust-pickle), Hugging Face causal-LM folders. Every file is
opened with `weights_only=True` first: nothing in the file runs unless the
user passed --trust-pickle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import logging
import os
import pickle
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tpu_pipeline.convert.app_io.spec import AppIO, from_manifest
from tpu_pipeline.convert.module.embedding_rows import embedding_rows
from tpu_pipeline.convert.tool_output import first_line
from tpu_pipeline.errors import PipelineError, UserError

MANIFEST_FORMAT = "tpu-pipeline/model@1"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


@dataclasses.dataclass(kw_only=True)
class LoadedModel:
    module: nn.Module
    sample_args: tuple[torch.Tensor, ...]
    source_format: str                       # how MODEL was read
    input_names: list[str]
    output_names: list[str] | None = None
    task: str | None = None                  # classification | causal-lm | None (unknown)
    output_kinds: dict[str, str] | None = None  # manifest's output_kinds: output name -> kind (convert/verdict/output_kinds.py)
    notes: list[str] = dataclasses.field(default_factory=list)  # what was changed on the way (bf16 cast, ...)
    int_high: list[int | None] = dataclasses.field(default_factory=list)  # per input: exclusive upper bound for int samples
    calibration: list[torch.Tensor] | None = None  # manifest's calibration_inputs: real rows, (N, *shape[1:]) per input
    shape_buckets: dict[str, list[str]] | None = None  # manifest's shape_buckets: shapes/dynamic/pad as the flags take
                                                       # them (convert/shapes.py)
    app_io: AppIO | None = None  # what an app hands the model (convert/app_io): the manifest's app_io, or a loader's
    exported_dims: list[list[tuple[int, int | None]]] | None = None  # a torch.export program's input shapes, per
    # input and axis (lowest, highest or None: unbounded); lowest == highest: the graph was specialised to that size,
    # so shape buckets must stay inside (convert/shapes.py)


def parse_input_shape(spec: str) -> tuple[tuple[int, ...], torch.dtype]:
    """`1,3,224,224[:float32]` -> ((1, 3, 224, 224), torch.float32)."""
    shape_s, _, dtype_s = spec.partition(":")
    dtype_s = dtype_s or "float32"
    if dtype_s not in _DTYPES:
        raise UserError(f"--input-shape {spec!r}: dtype {dtype_s!r} is not one of {', '.join(_DTYPES)}")
    try:
        shape = tuple(int(s) for s in shape_s.split(","))
    except ValueError:
        raise UserError(f"--input-shape {spec!r}: expected comma-separated integers like 1,3,224,224[:float32]") from None
    if not shape or any(d <= 0 for d in shape):
        raise UserError(f"--input-shape {spec!r}: every dimension must be a positive integer")
    return shape, _DTYPES[dtype_s]


def _random_input(shape, dtype, high: int = 16) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    return torch.randint(0, high, shape, dtype=dtype)


def load_model(path: str | Path, *, input_shapes: list[str] = (), model_class: str | None = None,
               model_kwargs: str | None = None, trust_pickle: bool = False, seq_len: int = 16) -> LoadedModel:
    """MODEL -> LoadedModel; raises only UserError (tpu_pipeline.errors): a file this loader fails
    on in a way no branch below names is still a file it cannot read, said in one line with the
    original exception chained (--debug shows it)."""
    path = Path(path)
    try:
        return _load_model(path, input_shapes, model_class, model_kwargs, trust_pickle, seq_len)
    except PipelineError:
        raise
    except Exception as e:  # noqa: BLE001 - the backstop behind the named cases
        raise UserError(f"{path}: cannot load it ({type(e).__name__}: {first_line(e)})") from e


def _load_model(path: Path, input_shapes, model_class, model_kwargs, trust_pickle, seq_len) -> LoadedModel:
    if not path.exists():
        raise UserError(f"model not found: {path}")
    if path.is_dir():
        loaded = _load_hf_folder(path, input_shapes, seq_len)
    else:
        if path.stat().st_size == 0:
            raise UserError(f"{path} is empty (0 bytes): not a PyTorch model file")
        kind = _sniff(path)
        if kind == "torchscript":
            raise UserError(
                f"{path} is a TorchScript archive, which LiteRT cannot convert. Re-export it from the Python "
                "model: torch.export.save(torch.export.export(model, example_args), 'model.pt2'), then "
                "`tpu-pipeline convert model.pt2`")
        if kind == "export":
            loaded = _load_export_archive(path, input_shapes, trust_pickle)
        else:
            loaded = _load_torch_save(path, input_shapes, model_class, model_kwargs, trust_pickle)
    return _finish(loaded)


def load_object(model: nn.Module | torch.export.ExportedProgram, sample_args: Any = None) -> LoadedModel:
    """An in-memory model (the Python API): an nn.Module with its sample inputs (a tensor or a
    tuple of tensors; `example_inputs()` if the module has it), or an ExportedProgram (its own
    example inputs unless given)."""
    args = (sample_args,) if isinstance(sample_args, torch.Tensor) else sample_args
    if args is not None and not isinstance(args, (tuple, list)):
        raise UserError(f"sample_args must be a tensor or a tuple of tensors, not {type(args).__name__}")
    if isinstance(model, torch.export.ExportedProgram):
        if args is None:
            if not (model.example_inputs and model.example_inputs[0]):
                raise UserError("the ExportedProgram holds no example inputs; pass sample_args")
            args = model.example_inputs[0]
        names = [s.arg.name for s in model.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
        loaded = LoadedModel(module=model.module(), sample_args=tuple(args), source_format="torch.export program",
                             input_names=names, exported_dims=exported_dims(model))
    elif isinstance(model, nn.Module):
        if args is None:
            if not hasattr(model, "example_inputs"):
                raise UserError(f"{type(model).__name__}: pass sample_args (the inputs forward() takes)")
            args = model.example_inputs()
        loaded = LoadedModel(module=model, sample_args=tuple(args), source_format="nn.Module",
                             input_names=_forward_names(model, len(args)))
    else:
        raise UserError(f"model must be an nn.Module, a torch.export.ExportedProgram or a path, "
                        f"not {type(model).__name__}")
    return _finish(loaded)


def _forward_names(model: nn.Module, n: int) -> list[str]:
    """An in-memory module's input names: forward()'s positional parameters (what --image NAME and
    the eval .npz keys name), else input_0.. when they do not say (*args)."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return [p.name for p in params[:n]] if len(params) >= n else [f"input_{i}" for i in range(n)]


def _sniff(path: Path) -> str:
    """export | torchscript | torch-save, from the zip listing (no unpickling)."""
    try:
        is_zip = zipfile.is_zipfile(path)
    except Exception as e:  # noqa: BLE001 - is_zipfile itself raises on some end records ("span multiple disks")
        raise UserError(f"{path} is a damaged zip archive ({first_line(e)}); the file may be truncated") from None
    if not is_zip:
        # Legacy (non-zip) torch.save files start with a pickle protocol byte.
        with open(path, "rb") as f:
            head = f.read(2)
        if head[:1] == b"\x80":
            return "torch-save"
        if head == b"PK":  # a zip's directory sits at its end: a cut-off zip loses it
            raise UserError(f"{path} is a damaged zip archive (no central directory); the file is probably truncated")
        raise UserError(f"{path} is not a PyTorch model file (not a torch.save/torch.export zip archive)")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - BadZipFile, zlib.error, NotImplementedError (compression), ...
        raise UserError(f"{path} is a damaged zip archive ({first_line(e)}); the file may be truncated") from None
    if bad is not None:
        raise UserError(f"{path} is damaged: member {bad!r} fails its checksum; the file may be truncated")
    if any(n.endswith("archive_format") for n in names) or any("serialized_exported_program" in n or
                                                                 n.endswith(".json") and "/models/" in n for n in names):
        return "export"
    if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
        return "torchscript"
    return "torch-save"


# The pytree node types an archive names (`"transformers.modeling_outputs.BaseModelOutput"`):
# transformers registers its ModelOutput classes with torch's pytree when their module is
# imported, and torch.export.load cannot rebuild an output spec whose type is unregistered.
_HF_TYPE = re.compile(rb"(transformers(?:\.[A-Za-z_][A-Za-z0-9_]*)+)\.[A-Z][A-Za-z0-9_]*")


def _register_output_types(path: Path) -> None:
    """Imports the transformers modules whose output classes the archive references. Only
    modules inside the `transformers` package are imported (nothing the file names elsewhere)."""
    try:
        with zipfile.ZipFile(path) as z:
            modules = {m.decode("ascii", "replace") for n in z.namelist() if n.endswith(".json")
                       for m in _HF_TYPE.findall(z.read(n))}
    except Exception as e:  # noqa: BLE001 - _sniff read it whole; a member that still fails is damage
        raise UserError(f"{path}: cannot read the torch.export archive ({first_line(e)})") from None
    for mod in sorted(modules):
        try:
            importlib.import_module(mod)  # heavy: transformers, only for archives that reference it
        except ImportError:
            pass  # torch.export.load below names what is still missing


@contextlib.contextmanager
def _export_load_guard(trust_pickle: bool):
    """torch.export.load retries a member that fails its weights-only load with a full unpickle
    (torch/_export/serde/serialize.py: deserialize_torch_artifact), so a .pt2 can run code from
    the file. Without --trust-pickle, TORCH_FORCE_WEIGHTS_ONLY_LOAD makes that retry weights-only
    too. torch.export also logs each failed decode with its traceback: silenced, the one-line
    UserError says it."""
    old = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    if not trust_pickle:
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    loggers = [logging.getLogger(n) for n in ("torch.export", "torch._export.serde.serialize")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)
        if old is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = old


def _load_export_archive(path: Path, input_shapes, trust_pickle: bool = False) -> LoadedModel:
    _register_output_types(path)
    try:
        with _export_load_guard(trust_pickle):
            ep = torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001 - any decode failure is bad input
        hint = "" if trust_pickle else "; a member that holds pickled objects beyond tensors needs --trust-pickle"
        why = re.sub(r"\x1b\[[0-9;]*m", "", first_line(e))  # torch's message carries terminal bold codes
        raise UserError(f"{path}: cannot read the torch.export archive ({why}{hint})") from None
    if input_shapes:
        args = tuple(_random_input(*parse_input_shape(s)) for s in input_shapes)
    elif ep.example_inputs is not None and ep.example_inputs[0]:
        args = tuple(ep.example_inputs[0])
    else:
        raise UserError(f"{path}: the archive holds no example inputs; pass --input-shape for each input")
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    try:
        module = ep.module()
    except Exception as e:  # noqa: BLE001 - a graph that decoded but cannot be rebuilt is a damaged archive
        raise UserError(f"{path}: cannot rebuild the torch.export program ({first_line(e)})") from None
    return LoadedModel(module=module, sample_args=args, source_format="torch.export archive",
                       input_names=names or [f"input_{i}" for i in range(len(args))], exported_dims=exported_dims(ep))


def _torch_load(path: Path, trust_pickle: bool):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not trust_pickle:
            raise UserError(
                f"{path} holds pickled Python objects beyond tensors (a whole nn.Module or custom classes). "
                "Unpickling them runs code from the file, so it is refused by default. Save a state_dict and "
                "pass --model-class pkg.module:Class, or, if you trust the file, pass --trust-pickle "
                f"(weights-only load said: {first_line(e)})") from None
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways (RuntimeError, EOFError, struct.error, ...)
        raise UserError(f"{path}: cannot read it as a PyTorch file ({type(e).__name__}: {first_line(e)}); "
                        "it may be truncated or not a model") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path}: unpickling failed ({first_line(e)})") from None


def _load_torch_save(path: Path, input_shapes, model_class, model_kwargs, trust_pickle) -> LoadedModel:
    obj = _torch_load(path, trust_pickle)
    if isinstance(obj, torch.export.ExportedProgram):
        return _from_exported(obj, input_shapes)
    if isinstance(obj, nn.Module):
        args = _shapes_or_example(obj, input_shapes, path)
        return LoadedModel(module=obj, sample_args=args, source_format="pickled nn.Module (--trust-pickle)",
                           input_names=[f"input_{i}" for i in range(len(args))])
    if isinstance(obj, dict) and obj.get("format") == MANIFEST_FORMAT:
        return _from_manifest(obj, path, input_shapes, model_class, model_kwargs)
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        if not model_class:
            raise UserError(f"{path} is a state_dict (weights only): pass --model-class pkg.module:Class "
                            "[--model-kwargs JSON] so convert can build the model")
        module = _build(model_class, _kwargs(model_kwargs), path)
        notes = _load_state(module, obj, path)
        args = _shapes_or_example(module, input_shapes, path)
        return LoadedModel(module=module, sample_args=args, source_format="state_dict + --model-class",
                           input_names=[f"input_{i}" for i in range(len(args))], notes=notes)
    raise UserError(f"{path}: holds a {type(obj).__name__}, not a model, state_dict or tpu-pipeline manifest")


def _from_exported(ep, input_shapes) -> LoadedModel:
    if not input_shapes and not (ep.example_inputs and ep.example_inputs[0]):
        raise UserError("the torch.export program holds no example inputs; pass --input-shape for each input")
    args = (tuple(_random_input(*parse_input_shape(s)) for s in input_shapes) if input_shapes
            else tuple(ep.example_inputs[0]))
    return LoadedModel(module=ep.module(), sample_args=args, source_format="torch.export program",
                       input_names=[f"input_{i}" for i in range(len(args))], exported_dims=exported_dims(ep))


def exported_dims(ep: torch.export.ExportedProgram) -> list[list[tuple[int, int | None]]]:
    """Per user input and axis, the sizes the exported graph was traced for: (n, n) for an axis
    torch.export specialised (every axis of a program exported without dynamic_shapes), (lo, hi) for
    a torch.export.Dim (hi None: unbounded), from the program's range_constraints."""
    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    shapes = {n.name: n.meta["val"].shape for n in ep.graph.nodes if n.op == "placeholder" and "val" in n.meta}
    out = []
    for name in users:
        dims = []
        for d in shapes.get(name, ()):
            if isinstance(d, torch.SymInt):
                r = ep.range_constraints.get(d.node.expr)
                lo = int(r.lower) if r is not None else 0
                try:
                    hi = int(r.upper) if r is not None else None
                except (TypeError, ValueError, OverflowError):  # sympy's infinity: no upper bound
                    hi = None
                dims.append((lo, hi))
            else:
                dims.append((int(d), int(d)))
        out.append(dims)
    return out


# Modules a manifest may name without --model-class: the project's own model classes. Any other
# tpu_pipeline module could run code when imported (tpu_pipeline.__main__ starts the CLI) or name
# a function that writes files; the class must also be an nn.Module (checked in _build).
MANIFEST_MODULES = ("tpu_pipeline.train.models.", "tpu_pipeline.testing.")
SHAPE_BUCKET_KEYS = ("shapes", "dynamic", "pad")  # a manifest's shape_buckets: what --shapes/--dynamic/--pad take


def _field(m: dict, key: str, types: tuple[type, ...], path: Path, what: str):
    """A manifest field, None when absent, else of one of `types` (UserError naming it otherwise)."""
    v = m.get(key)
    if v is not None and not isinstance(v, types):
        raise UserError(f"{path}: manifest field {key!r} must be {what}, not {type(v).__name__}")
    return v


def _from_manifest(m: dict, path: Path, input_shapes, model_class, model_kwargs) -> LoadedModel:
    cls_path = model_class or _field(m, "model_class", (str,), path, "a string pkg.module:Class") or ""
    if not model_class and not cls_path.startswith(MANIFEST_MODULES):
        raise UserError(f"{path}: manifest names model_class {cls_path!r} outside tpu_pipeline's model modules "
                        f"({', '.join(p + '*' for p in MANIFEST_MODULES)}); importing it runs its code, so pass it "
                        "explicitly with --model-class if you trust it")
    kwargs = _kwargs(model_kwargs) if model_kwargs else dict(_field(m, "model_kwargs", (dict,), path, "an object") or {})
    if not all(isinstance(k, str) for k in kwargs):
        raise UserError(f"{path}: manifest field 'model_kwargs' must have string keys")
    module = _build(cls_path, kwargs, path)
    notes = _load_state(module, _field(m, "state_dict", (dict,), path, "a dict of tensors") or {}, path)
    if input_shapes:
        args = tuple(_random_input(*parse_input_shape(s)) for s in input_shapes)
    else:
        examples = _field(m, "example_inputs", (list, tuple), path, "a list of tensors") or ()
        if not all(isinstance(t, torch.Tensor) for t in examples):
            raise UserError(f"{path}: manifest field 'example_inputs' must hold tensors only")
        args = tuple(t.cpu() for t in examples)
        if not args:
            args = _shapes_or_example(module, input_shapes, path)
    for key in ("input_names", "output_names"):
        if not all(isinstance(n, str) for n in _field(m, key, (list, tuple), path, "a list of strings") or ()):
            raise UserError(f"{path}: manifest field {key!r} must be a list of strings")
    _field(m, "task", (str,), path, "a string")
    names = list(m.get("input_names") or [f"input_{i}" for i in range(len(args))])
    calib = m.get("calibration_inputs")
    if calib is not None and (not isinstance(calib, (list, tuple)) or len(calib) != len(args) or not all(
            isinstance(c, torch.Tensor) and tuple(c.shape[1:]) == tuple(a.shape[1:]) for c, a in zip(calib, args))):
        raise UserError(f"{path}: calibration_inputs must hold one (N, *input_shape[1:]) tensor per input")
    buckets = _field(m, "shape_buckets", (dict,), path, "an object")
    if buckets is not None and (set(buckets) - set(SHAPE_BUCKET_KEYS) or not all(
            isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v) for v in buckets.values())):
        raise UserError(f"{path}: manifest field 'shape_buckets' takes {', '.join(SHAPE_BUCKET_KEYS)}, each a list of "
                        "strings as the flags take them (shapes: ['x=1x16000,1x32000'])")
    return LoadedModel(module=module, sample_args=args, source_format="tpu-pipeline model.pt manifest",
                       input_names=names, output_names=m.get("output_names"), task=m.get("task"), notes=notes,
                       output_kinds=m.get("output_kinds") if isinstance(m.get("output_kinds"), dict) else None,
                       calibration=[c.cpu() for c in calib] if calib is not None and not input_shapes else None,
                       shape_buckets={k: list(v) for k, v in buckets.items()} if buckets else None,
                       app_io=from_manifest(m["app_io"], path.parent, str(path)) if m.get("app_io") else None)


def _load_hf_folder(path: Path, input_shapes, seq_len) -> LoadedModel:
    cfg_path = path / "config.json"
    if not cfg_path.is_file() or not list(path.glob("*.safetensors")):
        raise UserError(f"{path} is a folder but not a Hugging Face model (needs config.json and *.safetensors)")
    try:
        import transformers  # heavy: ~2 s to import; only HF folders need it

        cfg = json.loads(cfg_path.read_text())
        # trust_remote_code stays False: a folder's custom modeling code never runs.
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, trust_remote_code=False, dtype=torch.float32, local_files_only=True)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path}: cannot load it as a Hugging Face causal LM ({first_line(e)})") from None
    model.config.use_cache = False
    vocab = int((cfg.get("vocab_size") if isinstance(cfg, dict) else None) or model.config.vocab_size)
    shape = parse_input_shape(input_shapes[0])[0] if input_shapes else (1, seq_len)
    ids = torch.randint(0, vocab, shape, dtype=torch.int64)
    return LoadedModel(module=_LogitsOnly(model), sample_args=(ids,), source_format="Hugging Face causal-LM folder",
                       input_names=["input_ids"], output_names=["logits"], task="causal-lm",
                       notes=[f"fixed-length forward: input_ids {list(shape)} -> logits (no KV cache; with tokenizer.json in "
                              "the folder, convert builds a decode-ready prefill/decode artifact instead)"],
                       int_high=[vocab])


class _LogitsOnly(nn.Module):
    """A causal LM's forward reduced to input_ids -> logits, without cache or dict outputs."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _kwargs(text: str | None) -> dict:
    if not text:
        return {}
    try:
        kw = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--model-kwargs is not valid JSON ({e})") from None
    if not isinstance(kw, dict):
        raise UserError("--model-kwargs must be a JSON object, e.g. '{\"width\": 16}'")
    return kw


def _build(spec: str, kwargs: dict, path: Path) -> nn.Module:
    mod_name, _, cls_name = str(spec).partition(":")
    if not mod_name or not cls_name:
        raise UserError(f"model class {spec!r}: expected pkg.module:Class")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))  # classes next to the user's files import like scripts do
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except Exception as e:  # noqa: BLE001 - ImportError, AttributeError, or the module failing as it loads
        raise UserError(f"cannot import model class {spec!r} ({type(e).__name__}: {first_line(e)})") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(f"model class {spec!r} is not an nn.Module subclass")
    try:
        module = cls(**kwargs)
    except Exception as e:  # noqa: BLE001 - the class's own constructor refusing its kwargs (TypeError, ValueError, ...)
        raise UserError(f"{spec}({', '.join(kwargs)}): {type(e).__name__}: {first_line(e)}") from None
    return module


def _load_state(module: nn.Module, state: dict, path: Path) -> list[str]:
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise UserError(f"{path}: the state_dict must map parameter names to tensors")
    saved = sorted({str(v.dtype).replace("torch.", "") for v in state.values()
                    if isinstance(v, torch.Tensor) and v.is_floating_point()} - {"float32"})
    devices = sorted({str(v.device) for v in state.values() if isinstance(v, torch.Tensor)} - {"cpu"})
    state = {k: (v.float() if v.is_floating_point() else v).cpu() for k, v in state.items()}
    try:
        module.load_state_dict(state, strict=True)
    except Exception as e:  # noqa: BLE001 - RuntimeError (names, shapes), or a tensor that cannot be copied in
        raise UserError(f"{path}: weights do not fit {type(module).__name__}: {first_line(e)}") from None
    notes = [f"weights were saved as {', '.join(saved)}; cast to float32 before export"] if saved else []
    return notes + ([f"weights were on {', '.join(devices)}; loaded on cpu"] if devices else [])


def _shapes_or_example(module, input_shapes, path) -> tuple:
    if input_shapes:
        return tuple(_random_input(*parse_input_shape(s)) for s in input_shapes)
    if hasattr(module, "example_inputs"):
        return tuple(module.example_inputs())
    raise UserError(f"{path}: no example inputs known for {type(module).__name__}; pass --input-shape for each input")


def _finish(m: LoadedModel) -> LoadedModel:
    """float32, CPU, eval mode; checks that PyTorch itself runs the sample inputs."""
    dtypes = {p.dtype for p in list(m.module.parameters()) + list(m.module.buffers()) if p.is_floating_point()}
    if dtypes - {torch.float32}:
        m.notes.append(f"weights were {', '.join(sorted(str(d).replace('torch.', '') for d in dtypes - {torch.float32}))};"
                       " cast to float32 before export")
    m.module = m.module.float().cpu()
    if hasattr(m.module, "eval") and isinstance(m.module, nn.Module):
        try:
            m.module.eval()
        except NotImplementedError:  # exported GraphModules refuse .eval(); they are already in eval form
            pass
    args = []
    for a in m.sample_args:
        if not isinstance(a, torch.Tensor):
            raise UserError("only tensor inputs are supported; got " + type(a).__name__)
        a = a.detach().cpu()
        args.append(a.float() if a.is_floating_point() else a)
    m.sample_args = tuple(args)
    if len(m.input_names) != len(m.sample_args):
        m.input_names = [f"input_{i}" for i in range(len(m.sample_args))]
    try:
        with torch.no_grad(), embedding_rows(m.module, m.sample_args) as rows:
            out = m.module(*m.sample_args)
    except Exception as e:  # noqa: BLE001 - a model that cannot run its own inputs is bad input
        shapes = ", ".join(f"{list(a.shape)}:{str(a.dtype).replace('torch.', '')}" for a in m.sample_args)
        raise UserError(f"the model does not run on inputs {shapes} ({first_line(e)}); check --input-shape") from None
    if not m.int_high:
        # token ids that index an embedding: random ones anywhere in its table, else up to the example's max
        m.int_high = [(n or int(a.max()) + 1) if not a.is_floating_point() and a.numel() and a.dtype != torch.bool
                      else None for a, n in zip(m.sample_args, rows)]
    outs = flatten_outputs(out)
    if not m.output_names or len(m.output_names) != len(outs):
        m.output_names = [f"output_{i}" for i in range(len(outs))]
    return m


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flatten_outputs(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in flatten_outputs(o)]
    if hasattr(out, "to_tuple"):
        return flatten_outputs(out.to_tuple())
    raise UserError(f"model output of type {type(out).__name__} is not a tensor or a tuple of tensors")
