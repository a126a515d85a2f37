"""``compass-celery status``: the live workers, their models and backlogs, and the settings."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from .. import settings as settings_mod
from ..state.urls import masked
from ..tables import text_table
from .common import app_from


@click.command(help="Live workers, their models and backlogs, and the settings.")
@click.option("--app", "app_path", default=None, help="Celery app, e.g. proj.celery:app")
@click.option("--redis", "redis_url", default=None, help="state Redis URL (default: the app's)")
@click.option("--prefix", default=None, help="key prefix (default: the app's compass_key_prefix)")
@click.option("--settings/--no-settings", "show_settings", default=False,
              help="also print every compass_* setting")
@click.option("--json", "as_json", is_flag=True, default=False,
              help="print one JSON object (workers, skipped records, settings) instead")
@click.pass_context
def status(ctx: click.Context, app_path: str | None, redis_url: str | None, prefix: str | None,
           show_settings: bool, as_json: bool) -> None:
    """Print the live workers the state Redis knows, and the settings when asked."""
    from ..state.connection import StateUnavailable
    from ..state.store import RedisStateStore

    app = app_from(ctx, app_path)
    values = app.compass.settings if app is not None and hasattr(app, "compass") else \
        settings_mod.resolve({})
    if redis_url is None and app is not None and hasattr(app, "compass"):
        redis_url = app.compass.redis_url
    if redis_url is None:
        raise click.UsageError("no state Redis: give --redis URL or --app with Compass(app)")
    store = RedisStateStore(redis_url, prefix or values.key_prefix)
    try:
        snap = store.snapshot(time.time(), values.heartbeat_timeout_s)
        refused = store.refusals()
    except StateUnavailable as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({**_status_json(snap, masked(redis_url), values),
                               "refusals": refused}, indent=2, default=str))
        return
    rows = [[w.name, w.device, f"{w.gpu_free_mb:.0f}/{w.gpu_total_mb:.0f}",
             _models(w), f"{w.backlog_ms:.0f}", f"{w.pending_ms:.0f}",
             f"{w.hop_ms:.1f}", f"{time.time() - w.heartbeat:.1f}s"] for w in snap.workers]
    click.echo(f"{len(snap.workers)} live compass worker(s) at {masked(redis_url)}")
    if rows:
        click.echo(text_table(rows, ["worker", "device", "free/total MB", "resident models",
                                 "backlog ms", "pending ms", "hop ms", "heartbeat"]))
    for why in snap.skipped:
        click.echo(f"skipped: {why}")
    if refused:  # admission's refusals since the counts began, per SLO class and cause
        click.echo(text_table([[slo, cause, str(n)] for slo, by in sorted(refused.items())
                               for cause, n in sorted(by.items())],
                              ["slo class", "refused for", "jobs and tasks"]))
    if show_settings:
        click.echo(text_table([list(r) for r in settings_mod.describe(values)],
                          ["setting", "value", "meaning"]))


def _models(w: Any) -> str:
    """The status table's models: the resident ones, then those being loaded."""
    text = ",".join(sorted(w.resident)) or "-"
    return f"{text} (loading {','.join(sorted(w.loading))})" if w.loading else text


def _status_json(snap: Any, redis_url: str,
                 values: settings_mod.CompassSettings) -> dict[str, Any]:
    """``compass status --json``: what the table shows, as numbers and lists."""
    workers = [{"name": w.name, "queue": w.queue, "device": w.device,
                "gpu_free_mb": w.gpu_free_mb, "gpu_total_mb": w.gpu_total_mb,
                "resident": sorted(w.resident), "host_resident": sorted(w.host_resident),
                "backlog_ms": w.backlog_ms, "pending_ms": w.pending_ms, "speed": w.speed,
                "hop_ms": w.hop_ms, "loading": sorted(w.loading),
                "heartbeat_age_s": round(time.time() - w.heartbeat, 3)}
               for w in snap.workers]
    settings = {f"compass_{name}": masked(value) if isinstance(value, str) else value
                for name, value in values.items() if name in settings_mod.OPTIONS}
    return {"redis": redis_url, "workers": workers, "skipped": list(snap.skipped),
            "settings": settings}
