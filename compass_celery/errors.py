"""The one base of every "your input is wrong" error compass raises.

A malformed DAG, a workload file, a setting, a task that cannot be placed and a
garbled worker record all raise a subclass of :class:`CompassInputError`, whose
message names the bad field; callers can catch them together (and still as
``ValueError``, which they all were before).
"""

from __future__ import annotations


class CompassInputError(ValueError):
    """Bad input to compass; the message names what and where."""
