"""``compass-celery device-check``: the model cache and real compute on one device."""

from __future__ import annotations

from typing import Any

import click

from ..tables import result_table
from .common import load


@click.command(name="device-check",
                         help="The real model cache (loads, evictions, prefetch, refusals, "
                         "CUDA out-of-memory) and real forward passes on one device, then "
                         "the real-compute benchmark on it; runs unchanged on cpu.")
@click.option("--device", default="cuda", show_default=True, help="cuda, cuda:N or cpu")
@click.option("--jobs", "n_jobs", type=click.IntRange(min=0), default=120, show_default=True,
              help="jobs of the real-compute benchmark (0: no benchmark)")
@click.option("--workload", "workload_path", default="voice-real", show_default=True,
              help="the benchmark's workload (a shipped name or a file)")
@click.option("--json", "json_out", default=None, help="write the figures here")
def device_check(device: str, n_jobs: int, workload_path: str, json_out: str | None) -> None:
    """Run the device check; print Markdown tables; write the JSON."""
    import json

    from ..bench.device_check import markdown, run_device_check
    from ..bench.runner import BenchOptions
    from ..bench.suite import run_suite

    def bench(dev: str) -> dict[str, Any]:
        opts = BenchOptions(policies=["celery-default", "compass"], jobs=n_jobs, real=True,
                            device=dev, time_scale=1.0, progress=False)
        return run_suite(load(workload_path), opts, echo=click.echo)

    result = run_device_check(device, bench if n_jobs else None, echo=click.echo)
    click.echo(markdown(result))
    if "bench" in result:
        click.echo(result_table(result["bench"]))
    if json_out:
        with open(json_out, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
        click.echo(f"wrote {json_out}")
