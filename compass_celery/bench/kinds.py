"""What the benchmark's workers run: emulated GPUs that sleep, or real models on the CPU.

Both kinds take the same workload file, arrivals and policies; only the worker app,
its flags and the node tasks differ. On real compute the workload's ``exec_ms`` is
not declared to the planner: run times are learned from measured runs, as in
production, and the simulator takes the measured per-model times instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..workload import WorkerSpec


@dataclass(frozen=True)
class WorkerKind:
    """One kind of benchmark worker: its app module, node tasks and worker flags."""

    name: str
    module: str
    infer_task: str
    step_task: str
    #: Whether nodes declare the workload's run times (emulated) or learn them (real).
    declare_exec_ms: bool
    emulated_gpu: bool

    @property
    def namespace(self) -> str:
        """The first part of its task names (``emulated``, ``pretrained``)."""
        return self.infer_task.split(".", 1)[0]

    def app(self, *args: Any, **kwargs: Any) -> Any:
        """The submitting side's app, built as the workers build theirs."""
        return _factory(self.module)(*args, **kwargs)

    def worker_args(self, spec: WorkerSpec, scale: float, device: str = "cpu") -> list[str]:
        """One worker's flags for ``spec``: its (emulated) GPU, or its device and memory
        budget there."""
        if self.emulated_gpu:
            return ["--compass-emulate-gpu-mb", str(spec.gpu_mem_mb),
                    "--compass-load-mb-per-s", str(spec.load_mb_per_s),
                    "--compass-speed", str(spec.speed), "--compass-time-scale", str(scale),
                    "--compass-emulate-host-mb", str(spec.host_mem_mb)]
        return ["--compass-gpu", device, "--compass-device-mb", str(spec.gpu_mem_mb),
                "--compass-load-mb-per-s", str(spec.load_mb_per_s)]

    def worker_env(self) -> dict[str, str]:
        """Extra environment: one torch thread per real worker, so that two workers share
        two cores honestly."""
        return {} if self.emulated_gpu else {"COMPASS_TORCH_THREADS": "1",
                                             "OMP_NUM_THREADS": "1"}


def _factory(module: str) -> Callable[..., Any]:
    if module == "compass_celery.emulated_app":
        from ..emulated import make_app
    else:
        from ..pretrained.app import make_app
    return make_app


EMULATED = WorkerKind("emulated", "compass_celery.emulated_app", "emulated.infer",
                      "emulated.step", declare_exec_ms=True, emulated_gpu=True)
REAL = WorkerKind("real", "compass_celery.pretrained.worker", "pretrained.infer",
                  "pretrained.step", declare_exec_ms=False, emulated_gpu=False)
