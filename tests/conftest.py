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
