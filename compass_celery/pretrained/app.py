"""The pretrained-model worker app: real weights, real forward passes, through the cache.

Run a worker on the CPU (or ``--compass-gpu cuda``), with a memory budget standing in
for GPU memory::

    celery -A compass_celery.pretrained.worker worker -P solo -n cpu0@%h \\
        --compass-gpu cpu --compass-device-mb 200

and submit :func:`voice_search` jobs from any process that built the same app. Settings
come from ``COMPASS_*`` environment variables as the emulated app's do;
``COMPASS_TORCH_THREADS`` sets ``compass_torch_threads``, torch's intra-op threads (by
default a CPU worker takes its share of the host's cores; the benchmark gives each one).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery, signals

from ..cache import current_cache, default_registry, get_model
from ..emulated import (
    batched_from_env,
    configured_app,
    counted,
    counted_pass,
    timed_base,
)
from ..jobs.dag import Dag
from . import models as pm
from .search import EXAMPLE_LINES, example_clip, rank_lines

SPEECH_TASK, EMBED_TASK, RANK_TASK = "pretrained.speech", "pretrained.embed", "pretrained.rank"
#: One text per call; a worker embeds every text waiting for it in one forward pass.
EMBED_TEXT_TASK = "pretrained.embed_text"
#: What it batches: up to 32 texts a pass (MiniLM on one CPU thread: 11.7 ms for one
#: sentence, 2.97 ms a sentence in a batch of 32), waiting at most 5 ms for more.
EMBED_TEXT_BATCH = {"max_size": 32, "max_wait_ms": 5}
#: A workload template's nodes (the real-compute benchmark): a canned forward pass.
INFER_TASK, STEP_TASK = "pretrained.infer", "pretrained.step"

#: What the benchmark's generic nodes feed each kind of model.
_CANNED_TEXTS = ("when is the budget review", "the cat knocked a glass off the table",
                 "thanks for watching", "a kitten is on the rug")


def make_app(broker: str | None = None, *, state_url: str | None = None,
             batched: Mapping[str, Mapping[str, Any]] | None = None, **conf: Any) -> Celery:
    """A Compass app with the pretrained models registered and their tasks defined;
    ``batched`` (default: ``COMPASS_BATCHED_TASKS``) adds a workload's batched nodes,
    each a real forward pass over its inputs."""
    sizes = pm.register_pretrained(default_registry)
    threads = os.environ.get("COMPASS_TORCH_THREADS")
    if threads and "compass_torch_threads" not in conf:
        conf["compass_torch_threads"] = int(threads)
    app = configured_app("compass_pretrained", sizes, broker, state_url=state_url, **conf)
    add_pretrained(app)
    _register_batched(app, batched_from_env() if batched is None else batched)
    return app


def add_pretrained(app: Celery) -> Celery:
    """Register the packaged models (loaders, measured sizes) and define their tasks on
    ``app``, a Compass app you already have (a Django or Flask project's): its workers
    then run :func:`voice_search` jobs. Idempotent."""
    if getattr(app, "_compass_pretrained", False):
        return app
    app._compass_pretrained = True  # type: ignore[attr-defined]
    sizes = pm.register_pretrained(default_registry)
    models = dict(app.conf.get("compass_models") or {})
    app.conf.compass_models = {**sizes, **models}
    _register_tasks(app)
    signals.worker_init.connect(_prepare_worker, weak=False)
    return app


def _prepare_worker(**_: Any) -> None:
    """Import the model libraries once, at worker start, so that a model's load is the
    checkpoint read and build, not the first import (torch's threads are the worker
    runtime's: ``compass_torch_threads``)."""
    with contextlib.suppress(pm.PretrainedMissing):  # said by the first task needing it
        pm.warm_imports()


def _worker(task: Any) -> str:
    return task.request.hostname or socket.gethostname()


def _canned(model: str | None, data: Any) -> Any:
    """The benchmark's input for ``model``: ``data`` texts (a count) or the example clip;
    a node without a model (a join) only passes on."""
    if model is None:
        return None
    if pm.CATALOGUE[model].kind == "vad":
        return pm.speech_segments(get_model(model), _clip())
    n = int(data) if isinstance(data, (int, float)) and data > 0 else 2
    return len(pm.embed(get_model(model), [_CANNED_TEXTS[i % 4] for i in range(n)]))


_clips: dict[str, str] = {}


def _clip() -> str:
    if "example" not in _clips:
        _clips["example"] = example_clip()
    return _clips["example"]


def _resident(model: str) -> bool:
    """Whether ``model`` is on this worker's device as the task body starts: the cache
    loads a task's model before its body runs, so this is False only if that broke."""
    return model in current_cache().resident()


def _register_tasks(app: Celery) -> None:
    @app.task(name=SPEECH_TASK, bind=True, shared=False, compass_model="silero-vad")
    def speech(self: Any, audio: str) -> dict[str, Any]:
        """Base64 16-bit PCM at 8 kHz -> the speech segments, in seconds."""
        resident = _resident("silero-vad")
        return {"segments": pm.speech_segments(get_model("silero-vad"), audio),
                "resident": resident}

    @app.task(name=EMBED_TASK, bind=True, shared=False, compass_model="minilm")
    def embed(self: Any, texts: Sequence[str], model: str = "minilm") -> dict[str, Any]:
        """Texts -> unit-length embeddings (384 floats each), in one batch."""
        resident = _resident(model)
        return {"vectors": pm.embed(get_model(model), texts), "resident": resident}

    @app.task(name=EMBED_TEXT_TASK, bind=True, shared=False, compass_model="minilm",
              compass_batch=EMBED_TEXT_BATCH)
    def embed_text(self: Any, texts: list[str]) -> list[list[float]]:
        """``embed_text.delay(text)`` -> its unit-length embedding (384 floats); the
        worker runs one forward pass over every text waiting for it."""
        return pm.embed(get_model("minilm"), texts)

    @app.task(name=RANK_TASK, bind=True, shared=False, compass_exec_ms=1)
    def rank(self: Any, inputs: Sequence[Any], lines: Sequence[Mapping[str, Any]]
             ) -> dict[str, Any]:
        """Join of (speech segments, query embedding, line embeddings) -> the ranking."""
        speech, query, lines_out = inputs
        ranked = rank_lines(speech["segments"], query["vectors"][0], lines_out["vectors"],
                            lines)
        return {**ranked, "models_were_resident": all(
            x["resident"] for x in (speech, query, lines_out))}

    @app.task(name=INFER_TASK, bind=True, shared=False)
    def infer(self: Any, model: str | None, exec_ms: float | None, data: Any = None
              ) -> dict:
        """A workload node on real compute: the model's canned forward pass."""
        return _node(self, model, data)

    @app.task(name=STEP_TASK, bind=True, shared=False)
    def step(self: Any, inputs: Any, model: str | None, exec_ms: float | None) -> dict:
        """A workload node after others, on real compute (its inputs only order it)."""
        return _node(self, model, None)


def _node(task: Any, model: str | None, data: Any) -> dict[str, Any]:
    """Run a workload node's canned forward pass, counted in the benchmark's ledger."""
    out = counted(task, lambda: _canned(model, data))
    return {"model": model, "worker": _worker(task), "out": out}


def voice_search(app: Celery, query: str, audio: str | None = None,
                 lines: Sequence[Mapping[str, Any]] | None = None,
                 embedder: str = "minilm") -> Dag:
    """A four-node job: find speech (VAD) | embed the query | embed the transcript lines
    -> rank the spoken lines against the query. ``audio`` and ``lines`` default to the
    example clip and its transcript."""
    lines = EXAMPLE_LINES if lines is None else lines
    dag = Dag(app, "voice_search")
    speech = dag.node("speech", app.signature(SPEECH_TASK, args=(audio or _clip(),)))
    q = dag.node("query", app.signature(EMBED_TASK, args=([query],),
                                        kwargs={"model": embedder}), model=embedder)
    v = dag.node("lines", app.signature(EMBED_TASK, args=([ln["text"] for ln in lines],),
                                        kwargs={"model": embedder}), model=embedder)
    dag.node("rank", app.signature(RANK_TASK, kwargs={"lines": [dict(x) for x in lines]}),
             after=[speech, q, v])
    return dag


def _register_batched(app: Celery, tasks: Mapping[str, Mapping[str, Any]]) -> None:
    """A workload's batched nodes on real compute (``emulated.batched_tasks``): one
    forward pass of the node's model over a canned text per input. Run times and the
    batch curve are not declared: the planner learns them from measured passes."""
    for name, spec in tasks.items():
        raw = {k: v for k, v in spec["batch"].items() if k in ("max_size", "max_wait_ms")}

        def body(self: Any, inputs: list[Any]) -> list[dict[str, Any]]:
            out = counted_pass(self, len(inputs),
                               lambda: _canned_pass(self.compass_model, len(inputs)))
            return [{"model": self.compass_model, "worker": _worker(self), "batch": len(inputs),
                     "out": n} for n in out]

        app.task(name=name, bind=True, shared=False, base=timed_base(app),
                 compass_model=spec["model"], compass_batch=raw)(body)


def _canned_pass(model: str | None, n: int) -> list[Any]:
    """One forward pass over ``n`` canned texts (an embedder), or ``n`` canned inputs one
    by one (another model, which has no batched pass); a result per input."""
    if model is None:
        return [None] * n
    if pm.CATALOGUE[model].kind == "embedder":
        vectors = pm.embed(get_model(model), [_CANNED_TEXTS[i % 4] for i in range(n)])
        return [len(v) for v in vectors]
    return [_canned(model, 1) for _ in range(n)]
