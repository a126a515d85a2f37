"""URLs as compass prints them: never with a password."""

from __future__ import annotations

import re

#: ``scheme://user:password@`` in any URL form compass takes (Sentinel lists included).
_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@;,\s]*:)[^@;\s]*(?=@)", re.I)


def masked(url: str | None) -> str:
    """``url`` with every password replaced by ``***``: the one form of a URL that logs,
    errors and the CLI print (each part of a ``sentinel://...;sentinel://...`` list too)."""
    return _PASSWORD.sub(lambda m: m.group("head") + "***", str(url or ""))
