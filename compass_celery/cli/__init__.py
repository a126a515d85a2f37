"""``compass-celery`` and ``celery -A proj compass``: one click group, one module per command.

Under ``celery`` the app comes from ``-A``; the standalone script takes ``--app`` or a
``--redis`` URL where a command needs one.
"""

from __future__ import annotations

import click

from .autoscale import autoscale
from .bench import bench
from .demo import demo
from .device import device_check
from .regress import regress
from .sim import simulate
from .status import status


@click.group(name="compass", help="Compass scheduling for Celery: status, demo, bench, simulate.")
def compass_command() -> None:
    """The ``compass`` command group; each subcommand does its own work."""


for _command in (status, demo, bench, simulate, autoscale, device_check, regress):
    compass_command.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``compass-celery`` console script."""
    compass_command.main(args=argv, prog_name="compass-celery", standalone_mode=True)
