"""``compass-celery regress``: the regression gate against a base commit."""

from __future__ import annotations

import sys

import click


@click.command(help="The regression gate: simulate every shipped workload and a "
                         "1,000-worker cluster and time the hot path, alternating today's "
                         "tree with a base commit's; exits 1 when a timing is slower beyond "
                         "the spread of the rounds.")
@click.option("--base", "base_rev", default="HEAD", show_default=True,
              help="commit to compare the working tree with")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True)
@click.option("--chains/--no-chains", default=True, show_default=True,
              help="also time a 3-task Dag against Celery's chain on two workers")
@click.option("--tolerance", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="a timing is slower only beyond this share of the base, too")
def regress(base_rev: str, rounds: int, chains: bool, tolerance: float) -> None:
    """Run the regression gate and exit with its verdict."""
    from ..bench.regress import report, run

    verdicts = run(base_rev, rounds, chains, tolerance, echo=click.echo)
    sys.exit(0 if report(verdicts, echo=click.echo) else 1)
