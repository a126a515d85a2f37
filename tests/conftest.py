"""Test-wide switches: every plan made in these tests (here and in worker processes
started from here) is checked against its invariants (``compass_validate``).

The compass pytest plugin is opt-in, as ``celery.contrib.pytest`` is: installing the
package must not load fixtures into other projects' test runs, so this suite loads it here.
``tests.support.leftovers`` fails the run when it leaves files in the temp dir or raises a
``DuplicateTaskNameWarning``.
"""

import os

pytest_plugins = ["compass_celery.testing", "tests.support.leftovers"]

os.environ.setdefault("COMPASS_VALIDATE", "1")


import pytest  # noqa: E402


@pytest.fixture
def private_redis_url():
    """A Redis that no other test, thread or worker process knows of, for a test that
    counts the server's commands: INFO's commandstats counts every client's, and a thread
    an earlier test left (a snapshot kept fresh, a charge flush) may write to the shared
    one at any moment."""
    from compass_celery.local import RedisServer

    with RedisServer() as server:
        yield server.url
