"""The host-RAM tier: models evicted from the GPU, kept in host memory for a fast reload.

One pure bookkeeping class (names and sizes, no I/O, no locks) shared by the emulated
GPU backend and the simulator, so both drop the same models in the same order: the
least recently evicted goes first once the tier is over its capacity. A reload
(``discard``) takes the model out; the caller holds any lock its threads need.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator


class HostTier:
    """Evicted models by name -> MB, least recently evicted first, within ``capacity_mb``."""

    def __init__(self, capacity_mb: float = math.inf) -> None:
        self.capacity_mb = capacity_mb
        self._sizes: OrderedDict[str, float] = OrderedDict()

    def add(self, name: str, size_mb: float) -> None:
        """Keep an evicted model, dropping the least recently evicted ones until it fits.

        A model larger than the whole tier is not kept (it would push out everything).
        """
        if size_mb > self.capacity_mb:
            return
        self._sizes[name] = size_mb
        self._sizes.move_to_end(name)
        while sum(self._sizes.values()) > self.capacity_mb:
            self._sizes.popitem(last=False)

    def discard(self, name: str) -> None:
        """Forget ``name`` (it was loaded back onto the GPU); absent names are fine."""
        self._sizes.pop(name, None)

    def sizes(self) -> dict[str, float]:
        """A copy of name -> MB, oldest first."""
        return dict(self._sizes)

    def clear(self) -> None:
        """Forget every model."""
        self._sizes.clear()

    def __contains__(self, name: object) -> bool:
        return name in self._sizes

    def __iter__(self) -> Iterator[str]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)
