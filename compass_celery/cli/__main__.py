"""``python -m compass_celery.cli``: the ``compass-celery`` script, for a checkout not installed."""

from . import main

main()
