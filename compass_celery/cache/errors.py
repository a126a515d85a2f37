"""Errors the cache raises; each message names the model so an operator can act on it."""

from __future__ import annotations

from ..errors import CompassInputError


class UnknownModelError(KeyError, CompassInputError):
    """A model name the registry does not know."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it readable
        return str(self.args[0]) if self.args else ""


class ModelTooLargeError(CompassInputError):
    """A model that can never fit the device's memory (rejected early, not at run time)."""


class CacheFullError(MemoryError):
    """A model that cannot be made resident now, even after evicting all that may go."""
