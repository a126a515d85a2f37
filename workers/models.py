"""Example models for the demo and tests: small real torch networks built in code.

No downloads: each builder seeds its own RNG and constructs the network in well
under two seconds on a CPU. Each has a forward helper that takes JSON-able input
(a list of floats or token ids) and returns JSON-able output, so Celery tasks can
call it directly. Declared sizes are the float32 parameter+buffer sizes, in MB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from compass_celery.cache.registry import ModelRegistry

IMAGE_SIDE = 32
VOCAB = 8000
BOS, EOS = 1, 2


def _seeded(build: Callable[[], nn.Module], seed: int) -> Callable[[], nn.Module]:
    """A loader that builds the same weights every time without touching global RNG state."""

    def load() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build().eval()

    load.__name__ = f"load_{build.__name__}"
    return load


def _image(pixels: Sequence[float], device: torch.device) -> torch.Tensor:
    """Flat floats -> one 3x32x32 image, zero-padded or trimmed."""
    n = 3 * IMAGE_SIDE * IMAGE_SIDE
    x = torch.zeros(n)
    vals = torch.tensor([float(p) for p in pixels[:n]])
    x[: len(vals)] = vals
    return x.view(1, 3, IMAGE_SIDE, IMAGE_SIDE).to(device)


def _tokens(ids: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([[int(i) % VOCAB for i in ids] or [BOS]], device=device)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


# -- image classifier (~5 MB) ----------------------------------------------------
def image_classifier() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(256, 1000),
    )  # fmt: skip


@torch.inference_mode()
def classify(model: nn.Module, pixels: Sequence[float], top: int = 3) -> dict[str, Any]:
    scores = model(_image(pixels, _device(model))).softmax(-1)[0]
    p, idx = scores.topk(top)
    return {"labels": idx.tolist(), "scores": [round(v, 6) for v in p.tolist()]}


# -- detector-like conv net (~15 MB) ---------------------------------------------
class Detector(nn.Module):
    """A conv backbone with a per-cell box head: (objectness, x, y, w, h) per 4x4 cell."""

    def __init__(self) -> None:
        super().__init__()
        chans = [3, 64, 128, 256, 512]
        layers: list[nn.Module] = []
        for a, b in zip(chans, chans[1:], strict=False):
            layers += [nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU()]
            if b <= 256:
                layers.append(nn.MaxPool2d(2))
        self.backbone = nn.Sequential(*layers, nn.Conv2d(512, 512, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(512, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def detector() -> nn.Module:
    return Detector()


@torch.inference_mode()
def detect(model: nn.Module, pixels: Sequence[float], top: int = 5) -> list[dict[str, float]]:
    out = model(_image(pixels, _device(model)))[0]  # 5 x H x W
    cells = out.flatten(1).T  # HW x 5
    keep = cells[:, 0].sigmoid().topk(min(top, len(cells))).indices
    keys = ("score", "x", "y", "w", "h")
    return [
        {k: round(v, 6) for k, v in zip(keys, c, strict=True)}
        for c in cells[keep].sigmoid().tolist()
    ]


# -- text encoder transformer (~40 MB) -------------------------------------------
class TextEncoder(nn.Module):
    def __init__(self, d: int = 384, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, 6, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(ids)).mean(1)


def text_encoder() -> nn.Module:
    return TextEncoder()


@torch.inference_mode()
def encode(model: nn.Module, token_ids: Sequence[int]) -> list[float]:
    v = model(_tokens(token_ids, _device(model)))[0]
    return [round(x, 6) for x in nn.functional.normalize(v, dim=0).tolist()]


# -- seq2seq translator (~130 MB) ------------------------------------------------
class Translator(nn.Module):
    def __init__(self, d: int = 512, layers: int = 3) -> None:
        super().__init__()
        self.src = nn.Embedding(VOCAB, d)
        self.tgt = nn.Embedding(VOCAB, d)
        self.core = nn.Transformer(d, 8, layers, layers, 4 * d, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = self.core.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        return self.out(self.core(self.src(src), self.tgt(tgt), tgt_mask=mask))


def translator() -> nn.Module:
    return Translator()


@torch.inference_mode()
def translate(model: nn.Module, token_ids: Sequence[int], max_len: int = 12) -> list[int]:
    """Greedy decoding; the weights are random, so the output is a deterministic token list."""
    dev = _device(model)
    src, out = _tokens(token_ids, dev), [BOS]
    for _ in range(max_len):
        nxt = int(model(src, torch.tensor([out], device=dev))[0, -1].argmax())
        out.append(nxt)
        if nxt == EOS:
            break
    return out[1:]


EXAMPLES: dict[str, tuple[Callable[[], nn.Module], float, Callable[..., Any]]] = {
    "image-classifier": (image_classifier, 5.0, classify),
    "detector": (detector, 15.0, detect),
    "text-encoder": (text_encoder, 39.0, encode),
    "translator": (translator, 132.0, translate),
}
"""name -> (builder, declared MB, forward helper)."""


def register_example_models(registry: ModelRegistry, seed: int = 0) -> list[str]:
    """Register the example models (deterministic weights) and return their names."""
    for i, (name, (build, size_mb, _)) in enumerate(EXAMPLES.items()):
        registry.register(name, _seeded(build, seed + i), size_mb)
    return list(EXAMPLES)


def forward(name: str, model: nn.Module, data: Sequence[Any]) -> Any:
    """Run example model ``name`` on JSON-able ``data``; returns JSON-able output."""
    return EXAMPLES[name][2](model, data)
