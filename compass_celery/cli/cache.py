"""``compass-celery cache``: the model cache's eviction policies, measured on a workload."""

from __future__ import annotations

import click

from .common import load


@click.group(help="The model cache: eviction policies replayed on a workload's tasks.")
def cache() -> None:
    """The ``cache`` group."""


@cache.command(help="Replay a workload's seeded task stream through the cache's decisions "
               "(no planner, no timing): hit rate, loads and tasks per eviction policy "
               "(lookahead, lru, fifo, lookahead with prefetch), with jobs sent round-robin "
               "and with each model hashed to a worker; with --models, the real CPU load "
               "time per MB of the torch models a function registers.")
@click.option("--workload", "workload_path", default="edge-vision", show_default=True,
              help="workload file or shipped name")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="default: the workload's worker count")
@click.option("--gpu-mb", type=click.FloatRange(min=0, min_open=True), default=None,
              help="default: the workload's smallest GPU")
@click.option("--window", type=click.IntRange(min=1), default=6, show_default=True,
              help="queued tasks each worker sees")
@click.option("--models", "models_spec", metavar="MODULE:FUNCTION", default=None,
              help="register torch models with this function and time their CPU loads "
              "(workers.models:register_example_models for the repository's examples)")
def hitrate(workload_path: str, workers: int | None, gpu_mb: float | None, window: int,
            models_spec: str | None) -> None:
    """Print the hit-rate table, and the load times with ``--models``."""
    from ..cache.hitrate import report, report_load_times

    report(load(workload_path), workers, gpu_mb, window, echo=click.echo)
    if models_spec:
        try:
            report_load_times(models_spec, echo=click.echo)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--models") from None
