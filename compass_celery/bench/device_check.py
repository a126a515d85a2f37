"""``compass-celery device-check``: the real model cache and real compute on one device.

One prepared run for a machine with a GPU (``--device cuda``), which runs unchanged on
the CPU (``--device cpu``, as CI runs it). On the packaged pretrained models it:

1. runs the model cache on the device with a memory budget that holds two of the three
   embedder copies: loads (time, resident MB against the catalogue's), a hit, an
   eviction, a prefetch, a model larger than the budget refused by name, and (CUDA
   only) a real out-of-memory error handled by evicting and retrying;
2. times forward passes: the embedder on batches of 1, 8 and 32 sentences, the VAD on
   the 10 s example clip;
3. unless ``--no-bench``, runs the real-compute benchmark (compass and celery-default
   on ``voice-real``) with its workers on the same device.

It writes one JSON object (``--json``) and prints Markdown tables for the benchmarks page.
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from ..cache import CacheFullError, ModelCache, ModelRegistry, ModelTooLargeError, TorchBackend
from ..pretrained import models as pm

#: Two embedder copies and the VAD fit; the third copy makes the cache evict.
BUDGET_MB = 200.0


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, round(1000 * (time.perf_counter() - t0), 2)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _use(cache: ModelCache, name: str, queued: tuple[str, ...] = ()) -> None:
    """Acquire and release ``name``, as a task does around its body."""
    cache.acquire(name, queued)
    cache.release(name)


def cache_check(device: str, budget_mb: float = BUDGET_MB) -> dict[str, Any]:
    """Loads, a hit, an eviction, a prefetch and the refusals, on ``device``."""
    pm.warm_imports()  # as a worker does at start: a load is then the load alone
    registry = ModelRegistry()
    pm.register_pretrained(registry)
    events: list[dict[str, Any]] = []
    cache = ModelCache(TorchBackend(device, capacity_mb=budget_mb), registry=registry,
                       policy="lookahead",
                       on_event=lambda kind, f: events.append({"event": kind, **f}))
    out: dict[str, Any] = {"device": device, "budget_mb": budget_mb, "loads": []}
    for name in ("silero-vad", "minilm-a", "minilm-b"):
        _, ms = _timed(lambda n=name: _use(cache, n))
        out["loads"].append({"model": name, "ms": ms, "resident_mb": round(
            cache.resident()[name], 3), "catalogue_mb": registry.get(name).size_mb})
    _, out["hit_ms"] = _timed(lambda: _use(cache, "minilm-a"))
    _use(cache, "minilm-c", ("minilm-a",))  # needs room: evicts b, not the queued a
    out["after_eviction"] = sorted(cache.resident())
    out["prefetched"] = cache.prefetch(["minilm-b"])  # b back in the background
    cache.wait_prefetch(60)
    out["after_prefetch"] = sorted(cache.resident())
    out["counters"] = {"hits": cache.hits, "misses": cache.misses, "loads": cache.loads,
                       "evictions": cache.evictions}
    out["too_large"] = _refusal(device, budget_mb)
    out["oom"] = _real_oom(cache, device) if device.startswith("cuda") else None
    out["events"] = [e["event"] for e in events]
    cache.clear()
    return out


def _refusal(device: str, budget_mb: float) -> str:
    """The error a model larger than the whole budget gets: it names the model."""
    registry = ModelRegistry()
    pm.register_pretrained(registry, ["minilm"])
    small = ModelCache(TorchBackend(device, capacity_mb=budget_mb / 4), registry=registry)
    try:
        small.acquire("minilm")
    except ModelTooLargeError as exc:
        return str(exc)
    return "not refused"


def _real_oom(cache: ModelCache, device: str) -> dict[str, Any]:
    """Fill the GPU with a ballast tensor, then load: the cache must evict and retry or
    fail with CacheFullError naming the model, never crash the worker."""
    import torch

    free = torch.cuda.mem_get_info(torch.device(device))[0]
    ballast = torch.empty(int(free - 50e6), dtype=torch.uint8, device=device)
    try:
        _, ms = _timed(lambda: cache.acquire("minilm-b"))
        cache.release("minilm-b")
        return {"outcome": "loaded after evicting", "ms": ms}
    except (CacheFullError, MemoryError) as exc:
        return {"outcome": "refused", "error": str(exc)[:300]}
    finally:
        del ballast
        torch.cuda.empty_cache()


def forward_check(device: str, repeats: int = 5) -> dict[str, Any]:
    """Median steady forward pass (ms) of each model on ``device``."""
    from ..pretrained.search import example_clip

    embedder = pm.load_minilm().to(device)
    vad = pm.load_vad().to(device)
    pm.warm_up("embedder", embedder)
    pm.warm_up("vad", vad)
    out: dict[str, Any] = {"device": device, "embed_ms": {}, "embed_ms_per_item": {}}
    for n in (1, 8, 32):
        texts = [f"sentence number {i} about a cat on a mat" for i in range(n)]
        times = []
        for _ in range(repeats):
            _, ms = _timed(lambda t=texts: (pm.embed(embedder, t), _sync(device)))
            times.append(ms)
        out["embed_ms"][n] = round(statistics.median(times), 2)
        out["embed_ms_per_item"][n] = round(out["embed_ms"][n] / n, 2)
    clip = example_clip()
    out["vad_ms"] = round(statistics.median(
        _timed(lambda: pm.speech_segments(vad, clip))[1] for _ in range(repeats)), 2)
    return out


def machine(device: str) -> dict[str, Any]:
    """What ran it: the CPU, and the GPU where there is one."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        info["gpu"] = f"{props.name}, {props.total_memory / 1e9:.0f} GB"
    return info


def run_device_check(device: str, bench: Callable[[str], dict[str, Any]] | None = None,
                     echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """The whole check; ``bench`` (device -> bench result) runs the benchmark part."""
    out: dict[str, Any] = {"machine": machine(device)}
    echo(f"model cache on {device} ...")
    out["cache"] = cache_check(device)
    echo(f"forward passes on {device} ...")
    out["forward"] = forward_check(device)
    if bench is not None:
        echo(f"real-compute benchmark on {device} ...")
        with contextlib.suppress(KeyboardInterrupt):
            out["bench"] = bench(device)
    return out


def markdown(result: dict[str, Any]) -> str:
    """The figures as Markdown tables for the benchmarks page."""
    c, f = result["cache"], result["forward"]
    lines = [f"Device: {c['device']} ({result['machine'].get('gpu', result['machine']['cpu'])}),"
             f" budget {c['budget_mb']:.0f} MB.", "",
             "| model | load ms | resident MB | catalogue MB |", "|---|---|---|---|"]
    lines += [f"| {x['model']} | {x['ms']:.0f} | {x['resident_mb']:.1f} | "
              f"{x['catalogue_mb']:.1f} |" for x in c["loads"]]
    lines += ["", f"Hit: {c['hit_ms']:.2f} ms. After loading minilm-c: {c['after_eviction']}; "
              f"after prefetching minilm-b: {c['after_prefetch']}. Counters: {c['counters']}.",
              f"Too large: {c['too_large']}", ""]
    lines += ["| forward pass | ms |", "|---|---|"]
    lines += [f"| embed, batch {n} | {ms:.1f} ({f['embed_ms_per_item'][n]:.2f} per sentence) |"
              for n, ms in f["embed_ms"].items()]
    lines += [f"| VAD, 10 s clip | {f['vad_ms']:.1f} |"]
    return "\n".join(lines)
