"""`tpu-pipeline generate ARTIFACT_DIR --prompt TEXT`: greedy text from a converted LM, no PyTorch."""

import json
from pathlib import Path

import click

from tpu_pipeline.convert.lm import litertlm_runtime
from tpu_pipeline.convert.lm.decode_ready_runtime import META_FILE, LiteRTLanguageModel, resolve_artifact_dir
from tpu_pipeline.errors import UserError
from tpu_pipeline.cli.commands import register


@register("generate")
@click.command(short_help="Generate text with an exported LiteRT language model.")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="Text to continue.")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 4096))
@click.option("--runtime", type=click.Choice(["litert-lm", "reference"]), default=None,
              help="litert-lm: the model.litertlm bundle on LiteRT-LM (what apps run; default when present). "
                   "reference: this project's numpy loop over model.tflite + lm.json (ai-edge-litert).")
@click.option("--json", "as_json", is_flag=True, help="Print prompt, runtime and text (reference: token ids too) as JSON.")
def command(artifact_dir: Path, prompt: str, max_new_tokens: int, runtime: str | None, as_json: bool) -> None:
    """Generate text with a converted language model (greedy; no PyTorch).

    ARTIFACT_DIR is a target folder written by `tpu-pipeline convert` for a
    Hugging Face causal LM (model.litertlm; for the Llama family also
    model.tflite, lm.json, tokenizer.json), or the convert output folder
    itself (its desktop artifact is used).
    """
    folder = resolve_artifact_dir(artifact_dir)
    has_bundle = (folder / litertlm_runtime.BUNDLE_FILE).is_file()
    runtime = runtime or ("litert-lm" if has_bundle else "reference")
    if runtime == "litert-lm":
        text = litertlm_runtime.generate(folder, prompt, max_new_tokens)
        result = {"prompt": prompt, "runtime": runtime, "text": text}
    else:
        if not (folder / META_FILE).is_file():
            raise UserError(f"{folder}: no {META_FILE}; the reference client runs the decode-ready export "
                            "(Llama family); use --runtime litert-lm")
        lm = LiteRTLanguageModel(folder)
        prompt_ids = lm.encode(prompt)
        ids = lm.generate_ids(prompt_ids, max_new_tokens)
        text = lm.decode(ids)
        result = {"prompt": prompt, "runtime": runtime, "prompt_ids": prompt_ids, "ids": ids, "text": text}
    click.echo(json.dumps(result) if as_json else text)
