"""What the ``compass-celery`` commands share: the app, workloads, policy lists, outputs."""

from __future__ import annotations

import json
import os
from typing import Any

import click


def app_from(ctx: click.Context, app_path: str | None) -> Any:
    """The Celery app: ``--app``'s when given, else the one ``celery -A`` handed over."""
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app_path:
        from celery.utils.imports import instantiate, symbol_by_name

        found = symbol_by_name(app_path)
        app = found if hasattr(found, "conf") else instantiate(app_path)
        if not hasattr(app, "conf"):
            app = getattr(found, "app", None) or getattr(found, "celery", None)
    return app


def load(path: str, seed: int | None = None) -> Any:
    """A workload file, or a shipped workload by name (``voice-real``); ``seed``, when
    given, replaces its arrival seed (``Workload.reseeded``)."""
    from ..workload import WorkloadError, load_workload
    from ..workloads import path as shipped

    if not os.path.exists(path) and os.sep not in path:
        name = path if path.endswith((".json", ".yaml", ".yml")) else f"{path}.json"
        if shipped(name).exists():
            path = str(shipped(name))
    try:
        workload = load_workload(path)
    except WorkloadError as exc:
        raise click.ClickException(f"bad workload {path}: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot read workload {path}: {exc}") from None
    return workload if seed is None else workload.reseeded(seed)


def names(text: str | None, default: list[str] | tuple[str, ...], known: tuple[str, ...],
          what: str = "policy", hint: str = "--policies") -> list[str]:
    """A comma-separated list of names (``default`` when empty), each one of ``known``."""
    chosen = [p.strip() for p in text.split(",") if p.strip()] if text else list(default)
    bad = [p for p in chosen if p not in known]
    if bad:
        raise click.BadParameter(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}",
                                 param_hint=hint)
    return chosen


def policies(text: str | None, default: list[str] | tuple[str, ...],
             extra: tuple[str, ...] = ()) -> list[str]:
    """``--policies``: the planner's policies, plus ``extra``, comma-separated."""
    from ..planner import POLICIES

    return names(text, default, (*POLICIES, *extra))


def floats(text: str | None, what: str) -> list[float]:
    """Numbers separated by commas (none for an empty text)."""
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected numbers separated by commas, got {text!r}",
                                 param_hint=what) from None


def positive_floats(text: str, what: str) -> list[float]:
    """Like :func:`floats`, but at least one, and every one above 0."""
    values = floats(text, what)
    if not values or min(values) <= 0:
        raise click.BadParameter("every value must be > 0", param_hint=what)
    return values


#: ``bench`` and ``simulate`` alike: the same workload on other arrivals.
SEED = click.option("--seed", type=int, default=None,
                    help="draw the arrivals and the template mix from this seed instead of "
                    "the workload's (a rerun on fresh arrivals)")


def write_json(obj: Any, path: str | None, indent: int = 2) -> None:
    """Write ``obj`` as JSON to ``path`` (nothing when None) and say so."""
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(obj, indent=indent, default=str) + "\n")
        click.echo(f"wrote {path}", err=True)


def write_outputs(result: dict[str, Any], json_out: str | None, plot_out: str | None) -> None:
    """A bench or simulation result: its JSON (without per-job latencies), its plot."""
    if json_out:
        slim = {**result, "policies": {k: {f: v for f, v in r.items() if f != "latencies_ms"}
                                       for k, r in result["policies"].items()}}
        with open(json_out, "w") as fh:
            json.dump(slim, fh, indent=2)
        click.echo(f"wrote {json_out}")
    if plot_out:
        from ..bench.plot import plot_result

        plot_result(result, plot_out)
        click.echo(f"wrote {plot_out}")
