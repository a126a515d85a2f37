"""Plain-text tables for the command line and the demo."""

from __future__ import annotations

from typing import Any


def text_table(rows: list[list[str]], header: list[str]) -> str:
    """Columns padded to their widest cell, under a header and a rule."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def result_table(result: dict[str, Any]) -> str:
    """One row per policy of a benchmark or simulation result."""
    rows = []
    for name, r in result["policies"].items():
        lat = r["latency_ms"]
        rows.append([name, r["jobs"], r["completed"], r["failed"], r["lost"],
                     r.get("duplicates", "-"), r.get("stranded", "-"), f"{lat['mean']:.1f}",
                     f"{lat['p50']:.1f}", f"{lat['p95']:.1f}",
                     f"{lat['p99']:.1f}", f"{r['cache_hit_rate']:.3f}", r["model_loads"],
                     f"{r['throughput_jobs_per_s']:.2f}"])
    return text_table([[str(x) for x in r] for r in rows],
                      ["policy", "jobs", "done", "failed", "lost", "dup", "stranded", "mean ms",
                       "p50", "p95", "p99", "hit rate", "loads", "jobs/s"])
