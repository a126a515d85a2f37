"""A command group with a default subcommand: ``bench --workload X`` runs ``bench cluster``."""

from __future__ import annotations

from typing import Any

import click


class DefaultGroup(click.Group):
    """A group whose arguments, when they start with an option other than ``--help``, go to
    its ``default`` subcommand: ``compass-celery bench --workload W`` is
    ``compass-celery bench cluster --workload W``, as it was before ``bench`` had others."""

    def __init__(self, *args: Any, default: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default = default

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Put the default subcommand's name first when an option comes first."""
        if args and args[0].startswith("-") and args[0] not in self.get_help_option_names(ctx):
            args = [self.default, *args]
        return super().parse_args(ctx, args)
