"""A user's own app, written as the README says: one model with its loader registered
through ``compass_celery.model``, one declared for placement only (``compass_models``),
on a real torch worker (``--compass-gpu cpu``)."""

from __future__ import annotations

import os

from celery import Celery

from compass_celery import Compass, get_model, model


@model("tiny-linear", size_mb=1)
def load_tiny_linear():
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def make_app(broker: str | None = None, **conf: object) -> Celery:
    """The app, on ``broker`` (else ``COMPASS_BROKER_URL``)."""
    broker = broker or os.environ.get("COMPASS_BROKER_URL", "redis://127.0.0.1:6379/0")
    backend = broker if broker.startswith("redis") else "cache+memory://"
    app = Celery("own", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(compass_models={"loaded-by-my-code": 300}, **conf)
    Compass(app)

    @app.task(name="own.embed", shared=False, compass_model="tiny-linear", compass_exec_ms=5)
    def embed(values: list[float]) -> list[float]:
        import torch

        net = get_model("tiny-linear")
        with torch.no_grad():
            return [round(v, 6) for v in net(torch.tensor(values)).tolist()]

    @app.task(name="own.mine", shared=False, compass_model="loaded-by-my-code", compass_exec_ms=5)
    def mine(x: int) -> int:
        return x * 2  # this code keeps its own model: compass only places the task

    @app.task(name="own.asks_for_mine", shared=False, compass_model="loaded-by-my-code")
    def asks_for_mine() -> str:
        return type(get_model("loaded-by-my-code")).__name__

    @app.task(name="own.torch_threads", shared=False)
    def torch_threads() -> int:
        import torch

        return torch.get_num_threads()  # in the thread that runs the tasks

    return app


app = make_app()
