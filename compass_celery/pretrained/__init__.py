"""Real pretrained models that packages ship (the ``real`` extra), and jobs on them.

:mod:`.models` loads all-MiniLM-L6-v2 and Silero VAD and runs their forward passes;
:mod:`.search` ranks a recording's transcript; :mod:`.app` is a worker app whose tasks
run them through the model cache, with :func:`~.app.voice_search`, a four-node job.

The packaged models' files are public: :func:`~.models.model_path` gives a model's path as
a ``str`` any loader takes, and :func:`~.models.load_sentence_transformer` loads one from a
``str`` or a path object, without a progress bar.
"""

from .models import load_sentence_transformer, model_path

__all__ = ["load_sentence_transformer", "model_path"]
