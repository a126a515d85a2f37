"""PNG of a benchmark result: latency CDFs, mean/p99 bars, where the time went, sweeps."""

from __future__ import annotations

from typing import Any


def plot_result(result: dict[str, Any], path: str) -> None:
    """Write a bench result's panels to a PNG at ``path``; RuntimeError without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'compass-celery[plot]'") from None
    policies = result["policies"]
    has_sweep = bool(result.get("sweep"))
    fig, axes = plt.subplots(1, 4 if has_sweep else 3, figsize=(22 if has_sweep else 17, 5))
    ax = axes[0]
    for name, r in policies.items():
        lat = np.sort(np.asarray(r.get("latencies_ms") or [], dtype=float))
        if lat.size:
            ax.plot(lat, np.arange(1, lat.size + 1) / lat.size, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job latency (workload ms, log)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("latency CDF")
    ax.legend(fontsize=8)
    names = list(policies)
    x = np.arange(len(names))
    ax = axes[1]
    ax.bar(x - 0.2, [policies[n]["latency_ms"]["mean"] for n in names], 0.4, label="mean")
    ax.bar(x + 0.2, [policies[n]["latency_ms"]["p99"] for n in names], 0.4, label="p99")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("workload ms")
    ax.set_title("mean and p99 job latency")
    ax.legend(fontsize=8)
    ax = axes[2]
    bottom = np.zeros(len(names))
    for part in ("queued_ms", "load_ms", "run_ms"):
        vals = np.array([policies[n].get("breakdown_ms", {}).get(part, 0.0) for n in names])
        ax.bar(x, vals, 0.6, bottom=bottom, label=part.replace("_ms", ""))
        bottom += vals
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean per task (workload ms)")
    ax.set_title("where the time went")
    ax.legend(fontsize=8)
    if has_sweep:
        ax = axes[3]
        for name, points in result["sweep"].items():
            ax.plot([p["rate_per_s"] for p in points], [p["p99"] for p in points], marker="o",
                    label=name)
        ax.set_xlabel("arrival rate (jobs/s)")
        ax.set_ylabel("p99 latency (workload ms)")
        ax.set_yscale("log")
        ax.set_title("latency against load")
        ax.legend(fontsize=8)
    scale = result.get("time_scale")
    fig.suptitle(f"{result['workload']}: emulated GPU timings"
                 + (f", time scale {scale}" if scale else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
