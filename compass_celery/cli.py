"""``compass-celery`` and ``celery -A proj compass``: status, demo, bench, simulate.

One click group serves both: under ``celery`` the app comes from ``-A``; the
standalone script takes ``--app`` or a ``--redis`` URL.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from . import settings as settings_mod


def _app_from(ctx: click.Context, app_path: str | None) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app_path:
        from celery.utils.imports import instantiate, symbol_by_name

        found = symbol_by_name(app_path)
        app = found if hasattr(found, "conf") else instantiate(app_path)
        if not hasattr(app, "conf"):
            app = getattr(found, "app", None) or getattr(found, "celery", None)
    return app


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


@click.group(name="compass", help="Compass scheduling for Celery: status, demo, bench, simulate.")
def compass_command() -> None:
    pass


@compass_command.command(help="Live workers, their models and backlogs, and the settings.")
@click.option("--app", "app_path", default=None, help="Celery app, e.g. proj.celery:app")
@click.option("--redis", "redis_url", default=None, help="state Redis URL (default: the app's)")
@click.option("--prefix", default=None, help="key prefix (default: the app's compass_key_prefix)")
@click.option("--settings/--no-settings", "show_settings", default=False,
              help="also print every compass_* setting")
@click.pass_context
def status(ctx: click.Context, app_path: str | None, redis_url: str | None, prefix: str | None,
           show_settings: bool) -> None:
    from .state import RedisStateStore, StateUnavailable

    app = _app_from(ctx, app_path)
    values = app.compass.settings if app is not None and hasattr(app, "compass") else \
        settings_mod.resolve({})
    if redis_url is None and app is not None and hasattr(app, "compass"):
        redis_url = app.compass.redis_url
    if redis_url is None:
        raise click.UsageError("no state Redis: give --redis URL or --app with Compass(app)")
    store = RedisStateStore(redis_url, prefix or values["key_prefix"])
    try:
        snap = store.snapshot(time.time(), values["heartbeat_timeout_s"])
    except StateUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    rows = [[w.name, w.device, f"{w.gpu_free_mb:.0f}/{w.gpu_total_mb:.0f}",
             ",".join(sorted(w.resident)) or "-", f"{w.backlog_ms:.0f}", f"{w.pending_ms:.0f}",
             f"{time.time() - w.heartbeat:.1f}s"] for w in snap.workers]
    click.echo(f"{len(snap.workers)} live compass worker(s) at {redis_url}")
    if rows:
        click.echo(_table(rows, ["worker", "device", "free/total MB", "resident models",
                                 "backlog ms", "pending ms", "heartbeat"]))
    for why in snap.skipped:
        click.echo(f"skipped: {why}")
    if show_settings:
        click.echo(_table([list(r) for r in settings_mod.describe(values)],
                          ["setting", "value", "meaning"]))


@compass_command.command(help="Start a private Redis and emulated-GPU workers, send a burst of "
                         "tasks and show where each went and why.")
@click.option("--redis", "redis_url", default=None,
              help="use this Redis instead of starting a private redis-server")
@click.option("--workers", "n_workers", default=4, show_default=True, type=click.IntRange(2, 8))
@click.option("--tasks", "n_tasks", default=16, show_default=True, type=click.IntRange(1, 500))
def demo(redis_url: str | None, n_workers: int, n_tasks: int) -> None:
    from .demo import run_demo

    sys.exit(run_demo(redis_url, n_workers, n_tasks, echo=click.echo))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``compass-celery`` console script."""
    compass_command.main(args=argv, prog_name="compass-celery", standalone_mode=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
