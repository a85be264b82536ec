import json

import click

from tpu_pipeline.doctor import diagnose
from tpu_pipeline.cli.commands import register


@register("doctor")
@click.command()
@click.option("--device", default="auto", show_default=True, help="auto, tpu, cuda or cpu.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(device: str, as_json: bool) -> None:
    """Check the installation and the device this machine offers."""
    report = diagnose(device)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name, version in report["versions"].items():
        click.echo(f"{name:>18}  {version or '-'}")
    d = report["device"]
    click.echo(f"{'device':>18}  {d['device']} x{d['count']}: {d['name']} ({d['reason']})")
    c = report["cpu"]
    isas = ", ".join(f"{name} {'yes' if c[key] else 'no' if c[key] is not None else '?'}"
                     for key, name in (("amx", "AMX"), ("avx512", "AVX-512"), ("avx2", "AVX2")))
    click.echo(f"{'CPU':>18}  {c['model'] or '?'} ({c['vendor'] or '?'}): {isas}")
    click.echo(f"{'rl --engine verl':>18}  vLLM's CPU rollout GEMM: {c['vllm_gemm_path']}")
    click.echo(f"{'bf16':>18}  {d['bf16']}")
    click.echo(f"{'compile backend':>18}  {d['compile_backend']}")
    click.echo(f"{'TPU':>18}  hardware={report['tpu']['hardware_present']} torch-tpu={report['tpu']['torch_tpu_installed']}")
    click.echo(f"{'CUDA':>18}  {report['gpu']['count']} GPU(s)")
    click.echo(f"{'Pallas':>18}  {report['pallas']['mode']} (jax backend: {report['pallas']['jax_backend']})")
    click.echo(report["verdict"])
