"""Where models live: a real torch device, or an emulated GPU that spends time honestly.

Both implement :class:`Backend`, so :class:`~compass_celery.cache.manager.ModelCache`
and the benchmark never branch on which one runs. torch is imported lazily, inside
:class:`TorchBackend` only, so ``compass_celery.cache`` imports without torch.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from compass_celery.cache.host_tier import HostTier
from compass_celery.cache.registry import Loader
from compass_celery.planner.types import DEFAULT_HOST_LOAD_MB_PER_S, DEFAULT_LOAD_MB_PER_S

MB = 1e6  #: bytes in the MB every compass size is given in (as the catalogue's)


#: Hugging Face's switch for its progress bars (huggingface_hub and transformers read it).
HF_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"


def quiet_progress_bars(environ: dict[str, str] | Any = os.environ) -> bool:
    """Turn Hugging Face's progress bars off before a loader runs in a worker, whose stderr
    goes to its log (transformers' "Loading weights" bar became WARNING lines there), unless
    the user chose with ``HF_HUB_DISABLE_PROGRESS_BARS``. True when they are off now."""
    import sys

    if environ.get(HF_BARS, "1").strip().upper() in ("0", "FALSE", "NO", "OFF"):
        return False  # the user wants them
    environ.setdefault(HF_BARS, "1")  # libraries imported from here on read it
    with contextlib.suppress(AttributeError):  # a library half imported: it reads the env
        if (transformers := sys.modules.get("transformers")) is not None:
            transformers.logging.disable_progress_bar()  # imported already: told directly
        if (hub := sys.modules.get("huggingface_hub")) is not None:
            hub.utils.disable_progress_bars()
    return True


class EmulatedOOM(MemoryError):
    """The emulated GPU ran out of memory during a load."""


class Backend(Protocol):
    """Where models live; the cache manager drives it and never asks which kind it is."""

    device: str
    #: Whether a model needs a registered loader to be loaded (emulated loads only sleep).
    needs_loader: bool

    def total_mb(self) -> float:
        """Memory models may use in all, MB."""

    def free_mb(self) -> float:
        """Memory free for models now, MB."""

    def load(self, name: str, loader: Loader | None, size_mb: float) -> tuple[Any, float]:
        """Make ``name`` resident; return (model, measured MB)."""

    def expected_load_s(self, name: str, size_mb: float) -> float | None:
        """Real seconds a load of ``name`` should take now; None when only a measured load
        can say."""

    def evict(self, name: str) -> None:
        """Drop ``name`` from device memory (into the host tier, where there is one)."""

    def get(self, name: str) -> Any:
        """The resident model ``name``; KeyError when it is not resident."""

    def host_resident(self) -> dict[str, float]:
        """Models in the host-RAM tier, name -> MB."""

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the device ran out of memory."""

    def run(self, exec_ms: float) -> None:
        """Spend a task's run time, where the backend emulates it."""

    def clear(self) -> None:
        """Forget every model, resident or in the host tier."""


@dataclass(frozen=True)
class EmulatedModel:
    """Light placeholder for a model on the emulated GPU."""

    name: str
    size_mb: float


class EmulatedBackend:
    """A GPU of ``capacity_mb`` with a load bandwidth; loads and runs sleep (times ``time_scale``).

    A GPU of ``speed`` s runs a task in its run time over s (``exec_ms`` is speed-1.0 ms),
    as the planner and the simulator cost it.

    Models evicted from the GPU go to a host-RAM tier (LRU within ``host_capacity_mb``)
    and reload at ``host_load_mb_per_s``. A model with a registered loader is also built
    (on the CPU), so a task body gets the real model while memory and load time stay
    emulated; one declared only by size is a placeholder.
    """

    #: An emulated load only sleeps: any model with a size can be "loaded".
    needs_loader = False

    def __init__(
        self,
        capacity_mb: float,
        load_mb_per_s: float = DEFAULT_LOAD_MB_PER_S,
        host_load_mb_per_s: float = DEFAULT_HOST_LOAD_MB_PER_S,
        time_scale: float = 1.0,
        host_capacity_mb: float = math.inf,
        device: str = "emulated",
        speed: float = 1.0,
    ) -> None:
        if capacity_mb <= 0 or load_mb_per_s <= 0 or host_load_mb_per_s <= 0 or time_scale < 0 \
                or speed <= 0:
            raise ValueError("emulated GPU needs capacity, bandwidths and speed > 0 and "
                             "time_scale >= 0")
        self.speed = float(speed)
        self.capacity_mb, self.load_mb_per_s = float(capacity_mb), float(load_mb_per_s)
        self.host_load_mb_per_s, self.time_scale = float(host_load_mb_per_s), float(time_scale)
        self.device = device
        self._gpu: dict[str, EmulatedModel] = {}
        self._built: dict[str, Any] = {}  # what a registered loader built, by name
        self._host = HostTier(host_capacity_mb)
        self._lock = threading.Lock()

    @property
    def host_capacity_mb(self) -> float:
        """Capacity of the host-RAM tier, MB."""
        return self._host.capacity_mb

    def total_mb(self) -> float:
        """The emulated GPU's capacity, MB."""
        return self.capacity_mb

    def free_mb(self) -> float:
        """Capacity minus the models loaded, MB."""
        with self._lock:
            return self.capacity_mb - sum(m.size_mb for m in self._gpu.values())

    def load_ms(self, name: str, size_mb: float) -> float:
        """Workload ms a load of ``name`` costs now (host tier or disk)."""
        bw = self.host_load_mb_per_s if name in self._host else self.load_mb_per_s
        return 1000.0 * size_mb / bw

    def expected_load_s(self, name: str, size_mb: float) -> float | None:
        """Real seconds the load sleeps: its workload ms times ``time_scale``."""
        return self.load_ms(name, size_mb) * self.time_scale / 1000.0

    def load(self, name: str, loader: Loader | None, size_mb: float) -> tuple[Any, float]:
        """Reserve ``size_mb`` and sleep the load time (host tier or storage); raise on OOM."""
        with self._lock:  # reserve first so concurrent loads cannot overcommit
            used = sum(m.size_mb for m in self._gpu.values())
            if used + size_mb > self.capacity_mb + 1e-9:
                raise EmulatedOOM(
                    f"emulated GPU out of memory loading {name!r} ({size_mb:.1f} MB): "
                    f"{self.capacity_mb - used:.1f} MB free"
                )
            ms = self.load_ms(name, size_mb)
            model = EmulatedModel(name, size_mb)
            self._gpu[name] = model
            self._host.discard(name)
        time.sleep(ms * self.time_scale / 1000.0)
        if loader is not None:
            built = loader()
            with self._lock:
                self._built[name] = built
            return built, size_mb
        return model, size_mb

    def evict(self, name: str) -> None:
        """Free the model's memory; keep it in the host tier if it fits."""
        with self._lock:
            model = self._gpu.pop(name, None)
            self._built.pop(name, None)
            if model is not None:
                self._host.add(name, model.size_mb)

    def get(self, name: str) -> Any:
        """The resident model: what its loader built, else its placeholder."""
        with self._lock:
            return self._built[name] if name in self._built else self._gpu[name]

    def host_resident(self) -> dict[str, float]:
        """Models in the host-RAM tier, name -> MB, oldest first."""
        with self._lock:
            return self._host.sizes()

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this GPU's out-of-memory error."""
        return isinstance(exc, EmulatedOOM)

    def run(self, exec_ms: float) -> None:
        """Sleep the task's run time on this GPU (over its speed, times ``time_scale``); a
        zero one returns at once."""
        if exec_ms > 0:
            time.sleep(exec_ms / self.speed * self.time_scale / 1000.0)

    def clear(self) -> None:
        """Empty the GPU and the host tier."""
        with self._lock:
            self._built.clear()
            self._gpu.clear()
            self._host.clear()


def _module_mb(obj: Any) -> float | None:
    """Parameter + buffer bytes of a torch module in MB, or None for other objects."""
    import torch

    if not isinstance(obj, torch.nn.Module):
        return None
    tensors = [*obj.parameters(), *obj.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / MB


class TorchBackend:
    """Models as real torch modules on ``device`` ("cpu" or "cuda[:N]"), in eval mode.

    On CUDA, evicted modules are kept as pinned host-RAM copies (the host tier) so a
    reload is a fast host-to-device copy. On CPU the host tier would be the same RAM,
    so eviction drops the module outright. ``capacity_mb`` bounds CPU use (default:
    physical RAM); on CUDA the device's real total and free memory are read, capped at
    ``capacity_mb`` when it is given (several workers sharing one GPU).
    """

    #: Models are built by their registered loader: one without a loader cannot be loaded.
    needs_loader = True

    def __init__(
        self, device: str = "cpu", capacity_mb: float | None = None, host_tier: bool = True
    ) -> None:
        import torch

        self._torch = torch
        self.device = str(torch.device(device))
        self.is_cuda = self.device.startswith("cuda")
        if self.is_cuda and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available")
        self.capacity_mb = capacity_mb
        self.host_tier = host_tier and self.is_cuda
        self._gpu: dict[str, tuple[Any, float]] = {}
        self._host: dict[str, Any] = {}
        self._lock = threading.Lock()

    def total_mb(self) -> float:
        """The device's memory (CUDA, capped at ``capacity_mb``), or ``capacity_mb``, or
        physical RAM, MB."""
        if self.is_cuda:
            total = self._torch.cuda.mem_get_info(self._torch.device(self.device))[1] / MB
            return min(total, self.capacity_mb) if self.capacity_mb is not None else total
        if self.capacity_mb is not None:
            return float(self.capacity_mb)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MB

    def free_mb(self) -> float:
        """Free device memory as CUDA reports it (within the cap); on CPU, total minus our
        modules."""
        with self._lock:
            ours = sum(mb for _, mb in self._gpu.values())
        if self.is_cuda:
            free = self._torch.cuda.mem_get_info(self._torch.device(self.device))[0] / MB
            return free if self.capacity_mb is None else min(free, self.capacity_mb - ours)
        return self.total_mb() - ours

    def expected_load_s(self, name: str, size_mb: float) -> float | None:
        """Unknown before a load of it was measured (reading and building a checkpoint
        is not a bandwidth)."""
        return None

    def load(self, name: str, loader: Loader | None, size_mb: float) -> tuple[Any, float]:
        """Move the module (from the host tier, else the loader) onto the device; measure it."""
        with self._lock:
            host = self._host.pop(name, None)
        if host is None:
            if loader is None:
                raise ValueError(f"model {name!r} has no loader")
            quiet_progress_bars()
            host = loader()
        model = host
        if isinstance(host, self._torch.nn.Module):
            model = host.eval().to(self.device, non_blocking=self.is_cuda)
            if self.is_cuda:
                self._torch.cuda.synchronize(self.device)
        measured = _module_mb(model)
        mb = size_mb if measured is None else measured
        with self._lock:
            self._gpu[name] = (model, mb)
        return model, mb

    def evict(self, name: str) -> None:
        """Drop the module from the device; on CUDA keep a pinned host copy."""
        with self._lock:
            entry = self._gpu.pop(name, None)
        if entry is None:
            return
        model = entry[0]
        if self.host_tier and isinstance(model, self._torch.nn.Module):
            host = model.to("cpu")
            for t in [*host.parameters(), *host.buffers()]:
                t.data = t.data.pin_memory()
            with self._lock:
                self._host[name] = host
        del model, entry
        self._free()

    def _free(self) -> None:
        gc.collect()
        if self.is_cuda:
            self._torch.cuda.empty_cache()

    def get(self, name: str) -> Any:
        """The resident module."""
        return self._gpu[name][0]

    def host_resident(self) -> dict[str, float]:
        """Pinned host copies, name -> MB."""
        with self._lock:
            return {n: _module_mb(m) or 0.0 for n, m in self._host.items()}

    def is_oom(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a CUDA or host out-of-memory error."""
        oom = getattr(self._torch.cuda, "OutOfMemoryError", None)
        return (oom is not None and isinstance(exc, oom)) or isinstance(exc, MemoryError)

    def run(self, exec_ms: float) -> None:
        """Real work happens in the task's own forward pass; nothing to emulate."""

    def clear(self) -> None:
        """Drop every module, resident or pinned, and free the memory."""
        with self._lock:
            self._gpu.clear()
            self._host.clear()
        self._free()
