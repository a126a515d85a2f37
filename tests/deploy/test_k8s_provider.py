"""The Kubernetes provider's requests, built offline against a recording API (no
cluster): a scale-out publishes the preload hint a new pod pops, a scale-in marks the
chosen pod with the lowest deletion cost before the replicas drop."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from compass_celery.providers import (
    DELETION_COST,
    KubernetesProvider,
    deletion_cost_body,
    publish_hints,
    take_hint,
)


class FakeRedis:
    """The list operations the hints use, in memory."""

    def __init__(self) -> None:
        self.lists: dict[str, list[str]] = {}
        self.ttl: dict[str, int] = {}

    def pipeline(self) -> FakeRedis:
        return self

    def execute(self) -> None:
        pass

    def rpush(self, key: str, *values: str) -> None:
        self.lists.setdefault(key, []).extend(values)

    def expire(self, key: str, seconds: int) -> None:
        self.ttl[key] = seconds

    def lpop(self, key: str) -> bytes | None:
        items = self.lists.get(key, [])
        return items.pop(0).encode() if items else None


class Recorder:
    """CoreV1Api and AppsV1Api stand-ins: every call in order, a Deployment of 3 pods."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.replicas = 3

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self.calls.append(("list", (namespace, label_selector)))
        pod = lambda n, gone=None: SimpleNamespace(  # noqa: E731
            metadata=SimpleNamespace(name=n, deletion_timestamp=gone))
        return SimpleNamespace(items=[pod("w-b"), pod("w-a"), pod("w-c", "2026-01-01")])

    def read_namespaced_deployment_scale(self, name: str, namespace: str) -> Any:
        return SimpleNamespace(spec=SimpleNamespace(replicas=self.replicas))

    def patch_namespaced_deployment_scale(self, name: str, namespace: str, body: Any) -> None:
        self.calls.append(("scale", (name, namespace, body)))
        self.replicas = body["spec"]["replicas"]

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> None:
        self.calls.append(("pod", (name, namespace, body)))


def _provider(scale: bool = True) -> tuple[KubernetesProvider, Recorder, FakeRedis]:
    api, redis = Recorder(), FakeRedis()
    return (KubernetesProvider("compass-gpu-worker", "ml", "app=w", redis, "compass",
                               scale=scale, core=api, apps=api), api, redis)


def test_names_are_the_pods_not_being_deleted() -> None:
    provider, api, _ = _provider()
    assert provider.names() == ["gpu@w-a", "gpu@w-b"]
    assert api.calls == [("list", ("ml", "app=w"))]


def test_scale_out_publishes_the_hint_a_new_pod_pops() -> None:
    provider, api, redis = _provider()
    provider.add(("captioner", "ocr"))
    provider.add(())
    assert api.calls == [("scale", ("compass-gpu-worker", "ml", {"spec": {"replicas": 4}})),
                         ("scale", ("compass-gpu-worker", "ml", {"spec": {"replicas": 5}}))]
    assert take_hint(redis, "compass") == ["captioner", "ocr"]  # oldest first
    assert take_hint(redis, "compass") == []  # the empty hint: nothing to preload
    assert take_hint(redis, "compass") == []  # none left
    assert list(redis.ttl.values()) == [900]  # an unclaimed hint expires


def test_scale_in_marks_the_chosen_pod_before_the_replicas_drop() -> None:
    provider, api, _ = _provider()
    provider.remove("gpu@w-b")
    assert api.calls == [
        ("pod", ("w-b", "ml", {"metadata": {"annotations": {DELETION_COST: "-1000"}}})),
        ("scale", ("compass-gpu-worker", "ml", {"spec": {"replicas": 2}}))]


def test_with_keda_owning_the_count_it_only_hints_and_marks() -> None:
    provider, api, redis = _provider(scale=False)
    provider.add(("ocr",))
    provider.remove("gpu@w-a")
    assert [c[0] for c in api.calls] == ["pod"]
    assert take_hint(redis, "compass") == ["ocr"]


def test_the_patch_bodies() -> None:
    assert deletion_cost_body(-5) == {"metadata": {"annotations": {DELETION_COST: "-5"}}}
    publish_hints(FakeRedis(), "compass", [])  # nothing to publish: no call


def test_without_the_kubernetes_package_it_says_what_to_install(monkeypatch) -> None:
    import builtins

    real = builtins.__import__

    def no_kubernetes(name: str, *a: Any, **kw: Any) -> Any:
        if name == "kubernetes":
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_kubernetes)
    with pytest.raises(RuntimeError, match="pip install kubernetes"):
        KubernetesProvider("d", "ns", "app=w", FakeRedis())
