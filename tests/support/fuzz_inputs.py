"""Damaged model and data files for the never-crash fuzzing (tests/convert/test_fuzz_on_cpu.py
and bench/fuzz_convert.py share them): valid seeds of every MODEL form the loader reads, hypothesis
strategies that damage them (bytes, zip members with their checksums redone so the damage reaches
the parser behind the zip, and manifest fields), and one run of a damaged input, in process or
through the CLI, classified.

An input is cheap because only the load stage runs: the loader, the --calib/--eval-data reading
and PyTorch's reference run of the parity rows; the CLI's float export is replaced by a stop
(`load_stage_only`), which the CLI reports as exit 3. Every input runs in a sandbox folder (its
cwd and TMPDIR): a file appearing there outside --out is counted, and the malicious pickle seed
writes a marker file if it is ever unpickled (it must not be, without --trust-pickle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import sys
import tempfile
import traceback
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from hypothesis import strategies as st

from tpu_pipeline.errors import ConversionError, PipelineError
from tpu_pipeline.testing.model_files import Touch, manifest

MANIFEST_CLASS = "tpu_pipeline.testing.reference_models:DepthwiseCNN"
PWNED = "PWNED"  # the file the malicious pickle creates when unpickled
STOP = "fuzz: load stage only"


@dataclasses.dataclass(frozen=True)
class Seed:
    name: str
    data: bytes
    suffix: str
    args: tuple[str, ...] = ()    # CLI flags this form needs (--model-class for a state_dict)
    npz_flag: str | None = None    # the seed is an .npz given with this flag to the manifest seed


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def build_seeds(folder: Path) -> tuple[dict[str, Seed], Path]:
    """The valid inputs every mutation starts from, and the manifest the .npz seeds go with."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    small = _Small().eval()
    torch.export.save(torch.export.export(small, (torch.randn(1, 8),)), folder / "m.pt2")
    man = manifest("DepthwiseCNN", folder / "model.pt")
    from tpu_pipeline.testing.reference_models import DepthwiseCNN

    torch.save(DepthwiseCNN().state_dict(), folder / "state.pt")
    # the sandbox-relative marker: unpickling this file creates PWNED in the input's cwd
    torch.save({"weights": Touch(PWNED)}, folder / "evil.pt")
    # a .pt2 whose sample inputs are that pickle: torch.export.load retries a failed weights-only
    # load with a full unpickle unless told otherwise
    evil = io.BytesIO()
    torch.save((Touch(PWNED),), evil)
    with zipfile.ZipFile(folder / "m.pt2") as src, zipfile.ZipFile(folder / "evil.pt2", "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, evil.getvalue() if info.filename.endswith("sample_inputs/model.pt")
                         else src.read(info))
    np.savez(folder / "rows.npz", x=np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32))
    seeds = {
        "pt2": Seed("pt2", (folder / "m.pt2").read_bytes(), ".pt2"),
        "manifest": Seed("manifest", man.read_bytes(), ".pt"),
        "state_dict": Seed("state_dict", (folder / "state.pt").read_bytes(), ".pt", ("--model-class", MANIFEST_CLASS)),
        "pickle": Seed("pickle", (folder / "evil.pt").read_bytes(), ".pt"),
        "pickle_pt2": Seed("pickle_pt2", (folder / "evil.pt2").read_bytes(), ".pt2"),
        "calib_npz": Seed("calib_npz", (folder / "rows.npz").read_bytes(), ".npz", npz_flag="--calib"),
        "eval_npz": Seed("eval_npz", (folder / "rows.npz").read_bytes(), ".npz", npz_flag="--eval-data"),
    }
    return seeds, man


# --- mutations ------------------------------------------------------------------------------------

def _byte_op():
    pos = st.integers(0, 1 << 20)
    return st.one_of(
        st.tuples(st.just("truncate"), pos),
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("overwrite"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("delete"), pos, st.integers(1, 64)),
        st.tuples(st.just("interesting"), pos, st.sampled_from(
            [b"\x00", b"\xff", b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff\xff\xff\xff\xff", b"\x80\x02", b"(", b"}",
             b"R", b"c", b"\x8c\x05torch", b"'<c16'", b"'|O'", b"(-1,)", b"(99999999999,)", b"True"])),
    )


def apply_ops(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for op in ops:
        if not b:
            break
        p = op[1] % len(b)
        if op[0] == "truncate":
            del b[p:]
        elif op[0] == "flip":
            b[p] ^= 1 << op[2]
        elif op[0] in ("overwrite", "interesting"):
            b[p:p + len(op[2])] = op[2]
        elif op[0] == "insert":
            b[p:p] = op[2]
        elif op[0] == "delete":
            del b[p:p + op[2]]
    return bytes(b)


def mutate_member(data: bytes, index: int, ops) -> bytes:
    """The zip rewritten with one member damaged and its CRC redone: the damage gets past
    the zip layer to the unpickler, the .npy header or torch.export's JSON."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = [(i, z.read(i)) for i in z.infolist()]
    except (zipfile.BadZipFile, ValueError, OSError, EOFError):
        return apply_ops(data, ops)
    if not members:
        return data
    k = index % len(members)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for i, (info, body) in enumerate(members):
            z.writestr(info.filename, apply_ops(body, ops) if i == k else body)
    return out.getvalue()


_WEIRD = st.deferred(lambda: st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10 ** 12), st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from(["tpu_pipeline.__main__:main", "tpu_pipeline.files:atomic_write_text", "tpu_pipeline.cli:cli",
                     "os:system", "tpu_pipeline.testing.model_files:Touch", MANIFEST_CLASS,
                     "tpu_pipeline.testing.reference_models:Nope", "tpu_pipeline.train.models.digits_cnn:DigitsCNN",
                     ":", "a:b:c"]),
    st.builds(lambda shape, dt: torch.zeros(shape, dtype=dt), st.lists(st.integers(0, 4), max_size=4),
              st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16,
                               torch.complex64, torch.uint8])),
    st.lists(_WEIRD, max_size=3), st.dictionaries(st.text(max_size=6), _WEIRD, max_size=3)))

MANIFEST_FIELDS = ["format", "model_class", "model_kwargs", "state_dict", "example_inputs", "input_names",
                   "output_names", "task", "calibration_inputs", "output_kinds"]


def mutate_manifest(data: bytes, field: str, value, drop_state_key: bool) -> bytes:
    """The manifest with one field replaced (or a state_dict entry dropped), saved as torch.save does."""
    m = torch.load(io.BytesIO(data), weights_only=True)
    if drop_state_key and m["state_dict"]:
        m["state_dict"] = dict(list(m["state_dict"].items())[1:])
    m[field] = value
    out = io.BytesIO()
    torch.save(m, out)
    return out.getvalue()


@st.composite
def damaged(draw, seeds: dict[str, Seed]) -> tuple[Seed, bytes, str]:
    """(seed, damaged bytes, how): a seed damaged at the byte level, inside one zip member, or
    (manifests) in one field."""
    seed = seeds[draw(st.sampled_from(sorted(seeds)))]
    how = draw(st.sampled_from(["bytes", "member", "field"] if seed.name == "manifest" else ["bytes", "member"]))
    if how == "field":
        field = draw(st.sampled_from(MANIFEST_FIELDS))
        return seed, mutate_manifest(seed.data, field, draw(_WEIRD), draw(st.booleans())), f"field {field}"
    ops = draw(st.lists(_byte_op(), min_size=1, max_size=4))
    if how == "member":
        return seed, mutate_member(seed.data, draw(st.integers(0, 64)), ops), "member"
    return seed, apply_ops(seed.data, ops), "bytes"


# --- one run -----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    exit_code: int            # the CLI's, or in process: 0 loaded, else the typed error's exit code (1: untyped)
    traceback: str | None     # an untyped exception's traceback or one printed on the CLI
    outside: list[str]        # files left in the sandbox outside --out
    pickle_ran: bool          # the malicious pickle's marker appeared
    backstop: bool = False    # typed only by a catch-all (load_model's "cannot load it", convert's "internal error"):
                              # a case no branch names, which the fuzz counts as a finding too


BACKSTOPS = ("cannot load it (", "internal error:")


@contextlib.contextmanager
def sandbox(root: Path) -> Iterator[Path]:
    """A fresh cwd and TMPDIR for one input, and its file descriptor 2 captured in root/stderr
    (what a library logs to the real stderr, which CliRunner does not see); restored afterwards."""
    box = Path(tempfile.mkdtemp(prefix="in-", dir=root))
    (box / "tmp").mkdir()
    old_cwd, old_tmp, old_env = Path.cwd(), tempfile.tempdir, os.environ.get("TMPDIR")
    os.chdir(box)
    tempfile.tempdir, os.environ["TMPDIR"] = str(box / "tmp"), str(box / "tmp")
    sys.stderr.flush()
    saved_fd2 = os.dup(2)
    err = open(root / "stderr", "w+b")
    os.dup2(err.fileno(), 2)
    try:
        yield box
    finally:
        sys.stderr.flush()
        os.dup2(saved_fd2, 2)
        os.close(saved_fd2)
        err.close()
        os.chdir(old_cwd)
        tempfile.tempdir = old_tmp
        if old_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_env
        shutil.rmtree(box, ignore_errors=True)


def _left(box: Path, keep: set[str]) -> list[str]:
    return sorted(str(p.relative_to(box)) for p in box.rglob("*")
                  if not any(str(p.relative_to(box)).split(os.sep)[0] == k for k in keep) and p.name != "tmp")


@contextlib.contextmanager
def load_stage_only():
    """The CLI with everything after the load stage replaced by a stop (ConversionError: exit 3)."""
    from tpu_pipeline.convert.module.kind import ModuleKind

    def stop(self, *a, **kw):
        raise ConversionError(STOP)

    real = ModuleKind.export_float
    ModuleKind.export_float = stop
    try:
        yield
    finally:
        ModuleKind.export_float = real


def run_cli(seed: Seed, data: bytes, root: Path, manifest_path: Path) -> Outcome:
    """`tpu-pipeline convert` on the damaged input through click's CliRunner (within load_stage_only)."""
    from click.testing import CliRunner

    from tpu_pipeline.cli import cli

    with sandbox(root) as box:
        inp = box / f"input{seed.suffix}"
        inp.write_bytes(data)
        if seed.npz_flag:
            args = [str(manifest_path), seed.npz_flag, str(inp)]
        else:
            args = [str(inp), *seed.args]
        res = CliRunner().invoke(cli, ["convert", *args, "--out", str(box / "out"), "--targets", "desktop",
                                       "--no-latency", "--samples", "2"])
        tb = None
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            tb = "".join(traceback.format_exception(res.exception))
        elif "Traceback" in res.output:
            tb = res.output
        return _stderr_traceback(root, Outcome(res.exit_code, tb, _left(box, {inp.name, "out"}),
                                               (box / PWNED).exists(), any(b in res.output for b in BACKSTOPS)))


def run_loader(seed: Seed, data: bytes, root: Path, manifest_path: Path) -> Outcome:
    """The loader (and for .npz seeds the --calib/--eval-data reading) in process: faster than the CLI."""
    import numpy as _np

    from tpu_pipeline.convert.module.kind import ModuleKind
    from tpu_pipeline.convert.module.loaders import load_model
    from tpu_pipeline.convert.options import ConvertOptions

    with sandbox(root) as box:
        inp = box / f"input{seed.suffix}"
        inp.write_bytes(data)
        code, tb, msg = 0, None, ""
        try:
            if seed.npz_flag:
                flag = {"--calib": "calib", "--eval-data": "eval_data"}[seed.npz_flag]
                ModuleKind.from_loaded(load_model(manifest_path), ConvertOptions(**{flag: str(inp), "samples": 2}),
                                       _np.random.default_rng(0))
            else:
                load_model(inp, model_class=MANIFEST_CLASS if seed.args else None)
        except PipelineError as e:
            code, msg = e.exit_code, str(e)
        except Exception as e:  # noqa: BLE001 - what the fuzzer looks for
            code, tb = 1, "".join(traceback.format_exception(e))
        return _stderr_traceback(root, Outcome(code, tb, _left(box, {inp.name}), (box / PWNED).exists(),
                                               any(b in msg for b in BACKSTOPS)))


def _stderr_traceback(root: Path, o: Outcome) -> Outcome:
    """A traceback a library printed to the real stderr (torch.export logs failed decodes with one)."""
    text = (root / "stderr").read_text(errors="replace")
    if o.traceback is None and "Traceback" in text:
        o.traceback = "on stderr:\n" + text[-3000:]
    return o
