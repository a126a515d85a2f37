"""A voice-search request as a web app receives it: check the body, name what is wrong.

What the Django and Flask examples' ``POST /search/`` takes: ``{"query": ...}`` and,
optionally, ``"lines"`` (a transcript: ``[{"start": s, "end": s, "text": ...}]``) to
search instead of the built-in clip's; audio is not taken over HTTP. The job itself is
:func:`compass_celery.pretrained.app.voice_search`. Pure: no model, no torch.
"""

from __future__ import annotations

import math
from typing import Any

MAX_QUERY_CHARS = 500
MAX_LINES = 100
MAX_LINE_CHARS = 500


class BadSearch(ValueError):
    """The request body is not a search: the message says why (an HTTP 400)."""


def _seconds(line: dict[str, Any], key: str, where: str) -> float:
    value = line.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise BadSearch(f"{where}.{key} must be a number of seconds, 0 or more")
    return float(value)


def _line(line: Any, i: int) -> dict[str, Any]:
    where = f"lines[{i}]"
    if not isinstance(line, dict):
        raise BadSearch(f"{where} must be an object with start, end and text")
    start, end = _seconds(line, "start", where), _seconds(line, "end", where)
    if end <= start:
        raise BadSearch(f"{where}.end must be after its start")
    text = line.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadSearch(f"{where}.text must be a non-empty string")
    if len(text) > MAX_LINE_CHARS:
        raise BadSearch(f"{where}.text is {len(text)} characters: at most {MAX_LINE_CHARS}")
    return {"start": start, "end": end, "text": text}


def parse_search(body: Any) -> tuple[str, list[dict[str, Any]] | None]:
    """The query and the transcript lines (None: the example clip's) of a request body."""
    if not isinstance(body, dict):
        raise BadSearch("the body must be a JSON object")
    if "audio" in body:
        raise BadSearch("audio is not taken here: this example searches its built-in clip")
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise BadSearch("query (a non-empty string) is required")
    if len(query) > MAX_QUERY_CHARS:
        raise BadSearch(f"query is {len(query)} characters: at most {MAX_QUERY_CHARS}")
    lines = body.get("lines")
    if lines is None:
        return query, None
    if not isinstance(lines, list) or not 1 <= len(lines) <= MAX_LINES:
        raise BadSearch(f"lines must be a list of 1 to {MAX_LINES} objects with start, end "
                        "and text")
    return query, [_line(line, i) for i, line in enumerate(lines)]
