"""Voice-note search: rank a recording's transcript lines against a query, keeping only
lines said where the recording has speech.

Speech recognisers are known to write plausible text over silence or noise ("thanks
for watching"); a voice-activity model tells which lines stand on real speech. The
ranking itself is cosine similarity of unit-length sentence embeddings. Pure: no
model and no I/O here, so a test can check it on numbers alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .audio import to_pcm16, voice_note

#: The example clip's layout: what is where, in seconds (10 s in all).
EXAMPLE_LAYOUT = (("silence", 1.5), ("speech", 2.5), ("hiss", 2.0), ("speech", 2.5),
                  ("silence", 1.5))

#: Its transcript, as a speech recogniser might write it: the middle line was "heard" in
#: the hiss between the two spoken parts.
EXAMPLE_LINES = (
    {"start": 1.6, "end": 3.9, "text": "the quarterly budget review moves to thursday"},
    {"start": 4.6, "end": 5.8, "text": "thanks for watching, please subscribe"},
    {"start": 6.1, "end": 8.4, "text": "the cat knocked a glass of water off the table"},
)


def example_clip() -> str:
    """The example recording, as base64 16-bit PCM at 8 kHz (about 210 KB)."""
    return to_pcm16(voice_note(EXAMPLE_LAYOUT))


def spoken(line: Mapping[str, Any], segments: Sequence[Mapping[str, float]],
           min_overlap: float = 0.5) -> bool:
    """Whether at least ``min_overlap`` of the line's time lies within speech segments."""
    start, end = float(line["start"]), float(line["end"])
    covered = sum(max(0.0, min(end, s["end"]) - max(start, s["start"])) for s in segments)
    return end > start and covered / (end - start) >= min_overlap


def rank_lines(segments: Sequence[Mapping[str, float]], query: Sequence[float],
               vectors: Sequence[Sequence[float]], lines: Sequence[Mapping[str, Any]]
               ) -> dict[str, Any]:
    """Spoken lines ranked by cosine similarity to the query; the others set aside."""
    if len(vectors) != len(lines):
        raise ValueError(f"{len(vectors)} embeddings for {len(lines)} transcript lines")
    scores = np.asarray(vectors, dtype=np.float64) @ np.asarray(query, dtype=np.float64)
    scored = [{**dict(line), "score": round(float(s), 4)} for line, s in zip(lines, scores,
                                                                              strict=True)]
    hits = sorted((x for x in scored if spoken(x, segments)), key=lambda x: -x["score"])
    return {"hits": hits, "not_spoken": [x for x in scored if not spoken(x, segments)],
            "speech": [dict(s) for s in segments]}
