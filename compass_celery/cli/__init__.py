"""``compass-celery`` and ``celery -A proj compass``: one click group, one module per
command group.

Under ``celery`` the app comes from ``-A``; the standalone script takes ``--app`` or a
``--redis`` URL where a command needs one. Every benchmark and tool is a subcommand:
``status``, ``demo``, ``bench`` (``cluster``, ``overhead``, ``plan-timing``,
``producers``, ``flood``, ``soak``, ``batching``, ``fault-table``, ``slo-table``),
``sim`` (``run``, ``batching``, ``generate``), ``cache hitrate``, ``models measure``,
``device-check`` and ``regress``.
"""

from __future__ import annotations

import click

from .autoscale import autoscale, autoscale_real
from .bench import bench
from .cache import cache
from .demo import demo
from .device import device_check
from .models import models
from .regress import regress
from .sim import sim, simulate
from .status import status


@click.group(name="compass",
             help="Compass scheduling for Celery: the cluster's status, a demo, the "
             "benchmarks and the simulator, the model cache and the packaged models, and "
             "the regression gate.")
def compass_command() -> None:
    """The ``compass`` command group; each subcommand does its own work."""


for _command in (status, demo, bench, sim, simulate, autoscale, autoscale_real, cache, models,
                 device_check,
                 regress):
    compass_command.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``compass-celery`` console script."""
    compass_command.main(args=argv, prog_name="compass-celery", standalone_mode=True)
