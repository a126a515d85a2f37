"""A voice-note clip made in code: vowel-like speech between silences, as 16-bit PCM.

The speech is a formant synthesiser's (a glottal pulse train through three vocal-tract
resonances, shaped into syllables at four a second), which a voice-activity model takes
for speech while it ignores silence and hiss. Making it here keeps the repository free of
audio files and lets a test know exactly where the speech is.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

import numpy as np

#: Samples per second of every clip (Silero VAD takes 8 kHz or 16 kHz).
SAMPLE_RATE = 8000

#: Formant frequency and bandwidth (Hz) of three vowels: /a/, /i/, /o/.
VOWELS = (((700, 130), (1220, 70), (2600, 160)),
          ((300, 60), (2300, 100), (3000, 150)),
          ((500, 80), (900, 80), (2500, 150)))


def _resonate(x: np.ndarray, freq: float, bandwidth: float) -> np.ndarray:
    """One two-pole resonator (a formant), run sample by sample."""
    r = math.exp(-math.pi * bandwidth / SAMPLE_RATE)
    a1, a2, gain = 2 * r * math.cos(2 * math.pi * freq / SAMPLE_RATE), -r * r, 1 - r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    for i, v in enumerate(x.tolist()):
        y0 = gain * v + a1 * y1 + a2 * y2
        y[i], y2, y1 = y0, y1, y0
    return y


def _syllables(seconds: float, seed: int) -> np.ndarray:
    """``seconds`` of vowel-like speech: pitch around 120 Hz, a vowel per half second."""
    rng = np.random.default_rng(seed)
    pieces = []
    for k in range(max(1, round(seconds / 0.5))):
        n = int(0.5 * SAMPLE_RATE)
        t = np.arange(n) / SAMPLE_RATE
        phase = np.cumsum(120.0 * (1 + 0.05 * np.sin(2 * np.pi * 3 * t))) / SAMPLE_RATE
        y = (np.diff(np.floor(phase), prepend=0.0) > 0).astype(float)
        y += 0.02 * rng.standard_normal(n)
        for freq, bw in VOWELS[(k + seed) % len(VOWELS)]:
            y = _resonate(y, freq, bw)
        pieces.append(y * 0.5 * (1 - np.cos(2 * np.pi * 4 * t)))
    speech = np.concatenate(pieces)
    return 0.5 * speech / np.abs(speech).max()


def voice_note(layout: Sequence[tuple[str, float]], seed: int = 0) -> np.ndarray:
    """Float samples in [-1, 1]: each ``("speech" | "silence" | "hiss", seconds)`` in turn."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, (kind, seconds) in enumerate(layout):
        n = int(seconds * SAMPLE_RATE)
        if kind == "speech":
            parts.append(_syllables(seconds, seed + i)[:n])
        elif kind == "hiss":
            parts.append(0.03 * rng.standard_normal(n))
        elif kind == "silence":
            parts.append(np.zeros(n))
        else:
            raise ValueError(f"unknown clip part {kind!r}: use speech, silence or hiss")
    return np.concatenate(parts).astype(np.float32)


def to_pcm16(samples: np.ndarray) -> str:
    """Float samples -> base64 of little-endian 16-bit PCM (what a JSON message carries)."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    return base64.b64encode(pcm.tobytes()).decode("ascii")


def from_pcm16(data: str) -> np.ndarray:
    """Base64 16-bit PCM -> float32 samples in [-1, 1]."""
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError(f"audio must be base64 16-bit PCM: {exc}") from None
    if len(raw) % 2:
        raise ValueError(f"audio must be base64 16-bit PCM: {len(raw)} bytes is odd")
    return (np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32767.0).copy()
