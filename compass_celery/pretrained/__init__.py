"""Real pretrained models that packages ship (the ``real`` extra), and jobs on them.

:mod:`.models` loads all-MiniLM-L6-v2 and Silero VAD and runs their forward passes;
:mod:`.search` ranks a recording's transcript; :mod:`.app` is a worker app whose tasks
run them through the model cache, with :func:`~.app.voice_search`, a four-node job.
"""
