"""Test-wide switches: every plan made in these tests (here and in worker processes
started from here) is checked against its invariants (``compass_validate``)."""

import os

os.environ.setdefault("COMPASS_VALIDATE", "1")
