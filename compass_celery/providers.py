"""Providers: what carries out a scaling decision (:mod:`compass_celery.planner.scaling`).

The rule says how many workers, which models a new one preloads and which one to
remove; a provider makes it so. The interface is three calls (:class:`Provider`):

- ``names()``: the workers it runs (starting or up), by Celery node name;
- ``add(preload)``: start one worker that loads ``preload`` before it takes any task
  (``compass_preload``: the worker loads them in its start, before it publishes its
  record and consumes), and return its name;
- ``remove(name)``: drain that worker with a warm shutdown (SIGTERM). Compass's
  hand-back re-places the tasks waiting in its queue and it finishes the one it runs,
  so nothing is lost and nothing runs twice.

:class:`LocalProvider` starts and stops worker processes on this machine (tests, the
demo, benchmarks). :class:`KubernetesProvider` publishes the hint in Redis for the new pod
to pop (its worker runs with ``--compass-preload @hint``, :func:`take_hint`) and lowers
the chosen pod's ``controller.kubernetes.io/pod-deletion-cost`` before the scale-in (a
Deployment's ReplicaSet deletes that pod); beside KEDA's ScaledObject on
``compass_workers_needed`` it leaves the count to KEDA. Any other provider implements the
same three calls. :class:`Autoscaler` is the controller loop that drives one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .local import WorkerProcess
from .state.hints import HINT, publish_hints, take_hint

__all__ = ["DELETION_COST", "DELETION_COST_KINDS", "HINT", "Autoscaler", "KubernetesProvider",
           "LocalProvider", "Provider", "deletion_cost_body", "publish_hints", "scale_body",
           "take_hint"]


class Provider(Protocol):
    """Starts and drains workers for an autoscaler (see the module)."""

    def names(self) -> list[str]:
        """The workers this provider runs, starting or up."""
        ...

    def add(self, preload: Sequence[str] = ()) -> str:
        """Start one worker that loads ``preload`` before its first task; its name."""
        ...

    def remove(self, name: str) -> None:
        """Drain ``name``: a warm shutdown that hands its waiting tasks back."""
        ...


class LocalProvider:
    """Worker processes on this machine (``celery -A app worker``, solo pool), each in its
    own process group; :meth:`close` (or leaving the ``with``) stops every one left."""

    def __init__(self, app: str, *, args: Sequence[str] = (),
                 env: dict[str, str] | None = None, prefix: str = "auto",
                 host: str = "local", stop_timeout_s: float = 60.0,
                 log_dir: str | None = None) -> None:
        self.app, self.args, self.env = app, list(args), dict(env or {})
        self.log_dir = log_dir  # None: each log in a private temp folder, gone at stop
        self.prefix, self.host, self.stop_timeout_s = prefix, host, stop_timeout_s
        self._procs: dict[str, WorkerProcess] = {}
        self._made = 0

    def names(self) -> list[str]:
        """The workers started and not removed (a process that died stays listed until
        removed: the watchdog drains its queue, the autoscaler decides on a new one)."""
        return list(self._procs)

    def add(self, preload: Sequence[str] = ()) -> str:
        """Start a worker with ``--compass-preload`` set to ``preload``; its node name."""
        self._made += 1
        name = f"{self.prefix}{self._made}@{self.host}"
        args = [*self.args]
        if preload:
            args += ["--compass-preload", ",".join(preload)]
        log = (os.path.join(self.log_dir, name.replace("@", "_") + ".log")
               if self.log_dir else None)
        self._procs[name] = WorkerProcess(self.app, name, args, env=self.env,
                                          log_path=log).start()
        return name

    def remove(self, name: str) -> None:
        """SIGTERM ``name``'s process group and wait for it to exit (SIGKILL after
        ``stop_timeout_s``, when the task it runs outlasts that)."""
        proc = self._procs.pop(name)
        proc.stop(self.stop_timeout_s)

    def process(self, name: str) -> WorkerProcess:
        """The process behind ``name`` (its log, whether it is alive)."""
        return self._procs[name]

    def close(self) -> None:
        """Stop every worker still running."""
        for name in list(self._procs):
            self.remove(name)

    def __enter__(self) -> LocalProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Autoscaler:
    """The controller loop: each :meth:`tick` reads the live workers, calls the pure rule
    (:func:`compass_celery.planner.scaling.decide`) and has the provider carry it out.

    It learns arrivals from what the producers count in Redis (``arrivals``, an
    :class:`~compass_celery.state.arrivals.ArrivalCounter` read at each tick: every
    process that submits counts its jobs there, so the controller may run anywhere), or
    is fed them (:meth:`observe`, class and time) by a caller that sees every submission;
    the classes' planned work, critical path and deadline come from the workload
    (:func:`compass_celery.sim.scaling.loads_at`, the function the simulator's
    compass-plan calls, so both run one rule on the same inputs). ``read_workers`` returns
    the live workers' records (``WorkerView``: the cluster snapshot). A worker being
    drained is left out of the rule's fleet at once and its ``remove`` runs on a thread,
    so a long drain never stalls the loop. It bills each worker per second from ``add``
    to the end of its drain (:attr:`billed_s`, at :meth:`close`), and records, per added
    worker, whether its first record already held its hint (:attr:`first_seen`)."""

    def __init__(self, provider: Provider, workload: Any, read_workers: Callable[[], Any], *,
                 window_s: float, down_window_s: float, horizon_s: float,
                 gpu_mb: float, clock: Callable[[], float] = time.monotonic,
                 arrivals: Any = None, time_scale: float = 1.0,
                 headroom: float | None = None, noise_sigma: float | None = None) -> None:
        from .planner.scaling import DEFAULT_HEADROOM, DEFAULT_NOISE_SIGMA, Damper, RateWindow

        self.provider, self.workload, self.read_workers = provider, workload, read_workers
        #: Where the producers count arrivals (None: fed by observe); its ages are wall
        #: seconds, the clock's are ``time_scale`` times longer.
        self.arrivals, self.time_scale = arrivals, time_scale
        self.counted: dict[str, int] = {}  # arrivals read from Redis, per class
        self.horizon_s, self.gpu_mb, self.clock = horizon_s, gpu_mb, clock
        #: The rule's work factor and the rate's noise discount (None: the rule's defaults,
        #: the simulator's compass-plan's too).
        self.headroom = DEFAULT_HEADROOM if headroom is None else headroom
        self.window = RateWindow(window_s, noise_sigma=DEFAULT_NOISE_SIGMA
                                 if noise_sigma is None else noise_sigma)
        self.damper = Damper(down_window_s)
        self.hints: dict[str, tuple[str, ...]] = {}  # added, not yet seen live
        self.first_seen: dict[str, dict[str, Any]] = {}
        self.since: dict[str, float] = {}
        self.billed_s = 0.0
        self.decisions: list[tuple[float, int, int]] = []  # (t, target, live)
        #: Per tick, what the rule read and asked (sim.scaling.reading: the simulator's
        #: compass-plan records the same, to compare tick by tick).
        self.readings: list[dict[str, Any]] = []
        self._draining: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def observe(self, cls: str, t_s: float, count: int = 1) -> None:
        """``count`` arrivals of SLO class ``cls`` at ``t_s`` (the clock's seconds)."""
        self.window.observe(cls, t_s, count)

    def read_arrivals(self) -> None:
        """Take in what the producers counted since the last read (with ``arrivals``)."""
        if self.arrivals is None:
            return
        now = self.clock()
        for cls, age_s, n in self.arrivals.poll():
            self.observe(cls, now - age_s / self.time_scale, n)
            self.counted[cls] = self.counted.get(cls, 0) + n

    def add(self, preload: Sequence[str] = ()) -> str:
        """Start a worker through the provider (billed from now)."""
        name = self.provider.add(tuple(preload))
        if name:  # a provider that cannot name the worker yet (Kubernetes) is not billed
            self.since[name], self.hints[name] = self.clock(), tuple(preload)
        return name

    def _drain(self, name: str) -> None:
        def run() -> None:
            self.provider.remove(name)
            with self._lock:
                self.billed_s += self.clock() - self.since.pop(name, self.clock())

        thread = threading.Thread(target=run, name=f"drain-{name}", daemon=True)
        self._draining[name] = thread
        thread.start()

    def members(self) -> list[Any]:
        """The rule's fleet: the live workers this provider runs, and those starting."""
        from .planner.scaling import Member, members_from

        live = {w.name: w for w in self.read_workers()}
        now = self.clock()
        for name in [n for n in self.hints if n in live]:  # first record of a new worker
            w, hint = live[name], self.hints.pop(name)
            self.first_seen[name] = {"after_s": round(now - self.since[name], 2),
                                     "hint": list(hint), "resident": sorted(w.resident),
                                     "hint_resident": set(hint) <= set(w.resident)}
        mine = [n for n in self.provider.names() if n not in self._draining]
        out = members_from([live[n] for n in mine if n in live])
        out += [Member(n, frozenset(self.hints.get(n, ())), gpu_mb=self.gpu_mb, ready=False)
                for n in mine if n not in live]
        return out

    def tick(self, now: float | None = None) -> Any:
        """One decision, carried out: workers added with their preloads, or drained.
        ``now``: the tick's time on the clock (None: the clock's reading). A periodic
        loop passes its schedule's time (``k x period``), as the simulator ticks: a loop
        that sleeps a period after each tick drifts (3.01 s apart, not 3), and the
        damper, which holds a recommendation while it is at most ``down_window_s`` old,
        then drops it one tick before the simulator does."""
        from .planner.scaling import decide
        from .sim.scaling import loads_at, reading

        self.read_arrivals()
        now = self.clock() if now is None else now
        members = self.members()
        classes = loads_at(self.workload, self.window.rates(now))
        d = decide(classes, members, self.workload.models, self.damper, now,
                   horizon_s=self.horizon_s, gpu_mb=self.gpu_mb, headroom=self.headroom)
        for hint in d.add:
            self.add(hint)
        for name in d.remove:
            self._drain(name)
        self.decisions.append((round(now, 2), d.target, len(members)))
        self.readings.append(reading(now, classes, members, d))
        return d

    def close(self) -> float:
        """Wait for the drains, bill every worker still up until now; worker-seconds."""
        for thread in self._draining.values():
            thread.join()
        now = self.clock()
        with self._lock:
            self.billed_s += sum(now - t for t in self.since.values())
            self.since.clear()
        return self.billed_s


#: The annotation a ReplicaSet reads to choose which pod a scale-in deletes (lowest first).
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: The workload kinds whose scale-in reads it (a Deployment scales through its
#: ReplicaSet); a StatefulSet always deletes its highest ordinal.
DELETION_COST_KINDS = frozenset({"Deployment", "ReplicaSet"})


class KubernetesProvider:
    """Workers as the pods of a Deployment (ReplicaSet: the pod-deletion-cost annotation
    decides which pod a scale-in deletes; a StatefulSet ignores it and always deletes its
    highest ordinal).

    - ``add(preload)``: publish the hint in Redis (:func:`publish_hints`; the worker's
      command carries ``--compass-preload @hint``), then, unless ``scale`` is False
      (KEDA owns the replica count), raise the Deployment's replicas by one;
    - ``remove(name)``: annotate the chosen pod with the lowest deletion cost, then,
      unless KEDA owns the count, lower the replicas by one: the ReplicaSet deletes that
      pod, the kubelet sends SIGTERM and compass hands its queue back.

    Worker names are ``worker_prefix@<pod name>`` (the manifests' ``-n gpu@$(POD_NAME)``).
    ``api`` is a ``kubernetes.client.CoreV1Api``/``AppsV1Api`` pair; left out, the
    ``kubernetes`` package (imported here, not at import time) loads the in-cluster or
    local configuration."""

    def __init__(self, deployment: str, namespace: str, selector: str, redis_client: Any,
                 prefix: str = "compass", *, worker_prefix: str = "gpu", scale: bool = True,
                 core: Any = None, apps: Any = None) -> None:
        self.deployment, self.namespace, self.selector = deployment, namespace, selector
        self.redis, self.prefix = redis_client, prefix
        self.worker_prefix, self.scale = worker_prefix, scale
        if core is None or apps is None:
            core, apps = _kubernetes_apis()
        self.core, self.apps = core, apps

    def pod_of(self, name: str) -> str:
        """The pod behind worker ``name``."""
        return name.split("@", 1)[1] if "@" in name else name

    def names(self) -> list[str]:
        """The workers: every pod of the Deployment not being deleted."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        return sorted(f"{self.worker_prefix}@{p.metadata.name}" for p in pods.items
                      if p.metadata.deletion_timestamp is None)

    def _replicas(self, delta: int) -> None:
        scale = self.apps.read_namespaced_deployment_scale(self.deployment, self.namespace)
        self.apps.patch_namespaced_deployment_scale(
            self.deployment, self.namespace, scale_body(scale.spec.replicas + delta))

    def add(self, preload: Sequence[str] = ()) -> str:
        """Publish the hint, and ask for one more pod (its name is not known yet: "")."""
        publish_hints(self.redis, self.prefix, [tuple(preload)])
        if self.scale:
            self._replicas(+1)
        return ""

    def remove(self, name: str) -> None:
        """Make ``name``'s pod the one a scale-in deletes, and scale in (unless KEDA
        does)."""
        self.core.patch_namespaced_pod(self.pod_of(name), self.namespace,
                                       deletion_cost_body(-1000))
        if self.scale:
            self._replicas(-1)


def deletion_cost_body(cost: int) -> dict[str, Any]:
    """The strategic-merge patch that sets a pod's deletion cost (lower: deleted first)."""
    return {"metadata": {"annotations": {DELETION_COST: str(int(cost))}}}


def scale_body(replicas: int) -> dict[str, Any]:
    """The patch of a Deployment's scale subresource to ``replicas`` (never below 0)."""
    return {"spec": {"replicas": max(int(replicas), 0)}}


def _kubernetes_apis() -> tuple[Any, Any]:
    """CoreV1Api and AppsV1Api from the ``kubernetes`` package, configured in-cluster or
    from ~/.kube/config."""
    try:
        from kubernetes import client, config  # type: ignore[import-not-found]
    except ImportError:
        raise RuntimeError("KubernetesProvider needs the kubernetes package "
                           "(pip install kubernetes)") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api(), client.AppsV1Api()
