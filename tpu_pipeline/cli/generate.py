"""`tpu-pipeline generate ARTIFACT_DIR --prompt TEXT`: greedy text from a decode-ready LiteRT LM, no PyTorch."""

import json
from pathlib import Path

import click

from tpu_pipeline.convert.lm_runtime import LiteRTLanguageModel, resolve_artifact_dir


@click.command()
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="Text to continue.")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1, 4096))
@click.option("--json", "as_json", is_flag=True, help="Print prompt, token ids and text as JSON.")
def command(artifact_dir: Path, prompt: str, max_new_tokens: int, as_json: bool) -> None:
    """Generate text with an exported LiteRT language model (greedy, ai-edge-litert; no PyTorch).

    ARTIFACT_DIR is a target folder written by `tpu-pipeline convert` for a
    Hugging Face causal LM (model.tflite, lm.json, tokenizer.json), or the
    convert output folder itself (its desktop artifact is used).
    """
    lm = LiteRTLanguageModel(resolve_artifact_dir(artifact_dir))
    prompt_ids = lm.encode(prompt)
    ids = lm.generate_ids(prompt_ids, max_new_tokens)
    text = lm.decode(ids)
    if as_json:
        click.echo(json.dumps({"prompt": prompt, "prompt_ids": prompt_ids, "ids": ids, "text": text}))
    else:
        click.echo(text)
