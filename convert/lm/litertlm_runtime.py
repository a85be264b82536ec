"""Running a LiteRT-LM bundle (model.litertlm) the way an app does: LiteRT-LM's
Engine and Session (package litert-lm-api, module litert_lm), CPU backend,
greedy sampling, no prompt template. No PyTorch here: `tpu-pipeline generate
--runtime litert-lm` uses this module alone."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Iterator

import litert_lm

from tpu_pipeline.errors import ConversionError, UserError

BUNDLE_FILE = "model.litertlm"
RUNTIME = "LiteRT-LM (litert_lm, CPU)"


class BundleRunner:
    """A .litertlm on LiteRT-LM's CPU engine, greedy (top_k=1), no prompt template:
    what an app gets from Engine + Session."""

    def __init__(self, path: Path, *, max_num_tokens: int | None = None, threads: int | None = None,
                 benchmark: bool = False):
        """max_num_tokens None: the bundle's own (its LLM metadata's max_num_tokens)."""
        backend = litert_lm.Backend.CPU(thread_count=threads) if threads else litert_lm.Backend.CPU()
        try:
            self.engine = litert_lm.Engine(str(path), backend=backend, max_num_tokens=max_num_tokens,
                                           enable_benchmark=benchmark)
        except Exception as e:  # noqa: BLE001 - the runtime's own load failures
            raise ConversionError(f"litert_lm could not load {path.name}: {str(e).splitlines()[0][:300]}") from None

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> BundleRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prompt_ids(self, text: str) -> list[int]:
        """The token ids the engine feeds for `text` (the start token, when the bundle has one, first)."""
        bos = self.engine.bos_token_id
        return ([bos] if bos is not None else []) + list(self.engine.tokenize(text))

    @contextlib.contextmanager
    def _session(self, max_new_tokens: int) -> Iterator:
        session = self.engine.create_session(apply_prompt_template=False, max_output_tokens=max_new_tokens,
                                             sampler_config=litert_lm.SamplerConfig(top_k=1))
        try:
            yield session
        finally:
            session.close()

    def generate_pieces(self, text: str, max_new_tokens: int) -> list[str]:
        """Greedy continuation of `text`, one text piece per decode step as the engine streams
        them (special tokens appear as their text; the stop token is not shown)."""
        with self._session(max_new_tokens) as session:
            session.run_prefill([text])
            return [r.texts[0] for r in session.run_decode_async() if r.texts]

    def generate(self, text: str, max_new_tokens: int) -> str:
        return "".join(self.generate_pieces(text, max_new_tokens))

    def benchmark(self, text: str, max_new_tokens: int) -> dict:
        """Prefill and decode tokens/s of one greedy generation, as the engine measures them
        (needs BundleRunner(..., benchmark=True))."""
        with self._session(max_new_tokens) as session:
            session.run_prefill([text])
            session.run_decode()
            info = session.get_benchmark_info()
        return {"prefill_tokens": info.last_prefill_token_count,
                "prefill_tokens_per_s": info.last_prefill_tokens_per_second,
                "decode_tokens": info.last_decode_token_count,
                "decode_tokens_per_s": info.last_decode_tokens_per_second}


def bundles_in(path: str | Path) -> list[tuple[str, Path]] | None:
    """The .litertlm bundles `path` names, as (label, file): the file itself, a target folder
    holding model.litertlm, or a convert output folder (each target's bundle; byte-identical
    files once, labelled by all their targets). None for a Hugging Face folder (config.json and
    no bundle: PyTorch's to run). Anything else is a UserError saying what is accepted."""
    path = Path(path)
    if path.is_file():
        if path.suffix != ".litertlm":
            raise UserError(f"policy {path}: not a .litertlm bundle; pass a model.litertlm, a convert output folder "
                            "or a Hugging Face policy folder")
        return [(path.parent.name, path)]
    if not path.is_dir():
        raise UserError(f"policy {path}: no such file or folder")
    if (path / BUNDLE_FILE).is_file():
        return [(path.name, path / BUNDLE_FILE)]
    if (path / "config.json").is_file():
        return None
    by_content: dict[str, tuple[list[str], Path]] = {}
    for bundle in sorted(path.glob(f"*/{BUNDLE_FILE}")):
        digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
        by_content.setdefault(digest, ([], bundle))[0].append(bundle.parent.name)
    if not by_content:
        raise UserError(f"policy {path}: neither a Hugging Face policy folder (config.json) nor a bundle folder "
                        f"({BUNDLE_FILE} in it or in its target folders)")
    return [(",".join(names), bundle) for names, bundle in by_content.values()]


def generate(folder: Path, prompt: str, max_new_tokens: int, *, threads: int | None = None) -> str:
    """Greedy text from the bundle in `folder` (special tokens appear as their text, as litert_lm prints them)."""
    path = Path(folder) / BUNDLE_FILE
    if not path.is_file():
        raise UserError(f"{folder}: no {BUNDLE_FILE} (convert the Hugging Face folder again, or use "
                        f"--runtime reference)")
    if not prompt:
        raise UserError("empty prompt")
    with BundleRunner(path, threads=threads) as runner:
        return runner.generate(prompt, max_new_tokens)
