"""Three ML steps, one model each: detect -> caption -> translate.

Each task stands in for a model call with trivial, deterministic work, so the
example runs without torch; ``compass_model`` and ``compass_exec_ms`` tell
Compass which model the task needs in GPU memory and how long it runs.
"""

import hashlib
from typing import Any

from celery import shared_task

from compass_celery import Dag

OBJECTS = ("cat", "dog", "bicycle", "car", "tree", "person")
DICTIONARIES = {
    "fr": {"a": "un", "photo": "photo", "of": "de", "and": "et", "cat": "chat",
           "dog": "chien", "bicycle": "vélo", "car": "voiture", "tree": "arbre",
           "person": "personne", "nothing": "rien"},
    "de": {"a": "ein", "photo": "Foto", "of": "von", "and": "und", "cat": "Katze",
           "dog": "Hund", "bicycle": "Fahrrad", "car": "Auto", "tree": "Baum",
           "person": "Person", "nothing": "nichts"},
}
LANGUAGES = tuple(DICTIONARIES)


@shared_task(compass_model="detector", compass_exec_ms=40)
def detect(image_url: str) -> dict[str, Any]:
    """Objects "seen" in the image: picked from a hash of its URL."""
    digest = hashlib.sha256(image_url.encode()).digest()
    return {"image": image_url, "objects": sorted({OBJECTS[b % len(OBJECTS)]
                                                   for b in digest[:2]})}


@shared_task(compass_model="captioner", compass_exec_ms=30)
def caption(detection: dict[str, Any]) -> str:
    """An English caption naming the detected objects."""
    objects = detection["objects"] or ["nothing"]
    return "a photo of " + " and ".join(f"a {o}" for o in objects)


@shared_task(compass_model="translator", compass_exec_ms=20)
def translate(text: str, lang: str = "fr") -> str:
    """Word-by-word translation of the caption."""
    if lang not in DICTIONARIES:
        raise ValueError(f"unknown language {lang!r}; known: {', '.join(LANGUAGES)}")
    words = DICTIONARIES[lang]
    return " ".join(words.get(w, w) for w in text.split())


def caption_job(app: Any, image_url: str, lang: str) -> Dag:
    """The job: detect -> caption -> translate, one node per model.

    Signatures come from ``app``'s own tasks: each ``create_app()`` makes a new Celery app.
    """
    dag = Dag(app, "caption_translate")
    d = dag.node("detect", app.tasks[detect.name].s(image_url))
    c = dag.node("caption", app.tasks[caption.name].s(), after=[d])
    dag.node("translate", app.tasks[translate.name].s(lang=lang), after=[c])
    return dag
