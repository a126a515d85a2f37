"""The Kubernetes manifests: valid against the Kubernetes schemas (offline), and true to
what the workers need: a GPU each, time to hand back, a name per pod, a scale-in that
removes the pod the autoscaler marked, no committed password, and commands that name
modules and flags that exist."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from compass_celery.providers import DELETION_COST, DELETION_COST_KINDS, HINT
from compass_celery.settings import OPTIONS
from compass_celery.worker.bootstep import WORKER_FLAGS

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "compose" / "Dockerfile"
COMPOSE = ROOT / "compose" / "docker-compose.yml"
SECRET_NAME = "compass-secrets"
SECRETS_EXAMPLE = K8S / "base" / "secrets.env.example"
#: The oldest Kubernetes the manifests promise to fit, and the newest schemas bundled.
OLDEST_K8S = "1.27"
MIN_GRACE_S = 120          # compose's stop_grace_period: 2m
WORKLOADS = ("Deployment", "StatefulSet")
#: API groups of custom resources (an operator's CRDs), which the Kubernetes schemas lack.
CUSTOM_GROUPS = ("keda.sh",)
SCALED_OBJECT = "keda/scaledobject.yaml"
SECRET_ENV = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH", re.I)
URL_PASSWORD = re.compile(r"\w+://[^/@\s:]*:([^@/\s]*)@")

Manifests = dict[str, list[dict[str, Any]]]


def _kubernetes_validate() -> Any:
    """The schema validator; CI must have it (the test extra), a developer may skip."""
    if os.environ.get("CI"):
        import kubernetes_validate.utils as utils

        return utils
    return pytest.importorskip("kubernetes_validate.utils",
                               reason="pip install -e '.[test]' for kubernetes-validate")


def schema_versions(utils: Any) -> list[str]:
    """The oldest Kubernetes promised (or the oldest whose schemas are bundled, should a
    newer kubernetes-validate drop it) and the newest bundled."""
    bundled = sorted({tuple(map(int, v.split(".")[:2])) for v in utils.all_versions()})
    oldest = max(tuple(map(int, OLDEST_K8S.split("."))), bundled[0])
    return [".".join(map(str, v)) for v in (oldest, bundled[-1])]


def manifest_files(root: Path = K8S) -> list[Path]:
    """Every Kubernetes manifest under ``root`` (kustomization files are not resources)."""
    return sorted(p for p in root.rglob("*.yaml") if p.name != "kustomization.yaml")


def is_custom(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` is a custom resource (checked by its own test, not the schemas)."""
    return str(doc.get("apiVersion", "")).split("/")[0] in CUSTOM_GROUPS


def load(root: Path = K8S) -> Manifests:
    """Documents of every manifest, by path relative to ``root``."""
    return {str(p.relative_to(root)): [d for d in yaml.safe_load_all(p.read_text()) if d]
            for p in manifest_files(root)}


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The containers of a workload's pod template (none for other kinds)."""
    if doc.get("kind") in WORKLOADS:
        yield from doc["spec"]["template"]["spec"].get("containers", [])


def command_text(container: dict[str, Any]) -> str:
    """A container's command and args as one string."""
    return " ".join(map(str, container.get("command", []) + container.get("args", [])))


def probe_text(container: dict[str, Any], probe: str) -> str:
    """An exec probe's command as one string ('' without one)."""
    return " ".join(container.get(probe, {}).get("exec", {}).get("command", []))


def arg_after(cmd: list[str], flag: str) -> str | None:
    """The value following ``flag`` in an argument list."""
    return cmd[cmd.index(flag) + 1] if flag in cmd and cmd.index(flag) + 1 < len(cmd) else None


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's env entries by name."""
    return {e["name"]: e for e in container.get("env", [])}


def compose_images() -> tuple[set[str], str]:
    """The compass images (without and with torch) and the Redis image compose runs."""
    compose = yaml.safe_load(COMPOSE.read_text())
    return ({compose["x-compass-image"]["image"], compose["x-gpu-worker"]["image"]},
            compose["services"]["redis"]["image"])


def dockerfile_facts() -> tuple[list[str], set[str]]:
    """The image's PYTHONPATH entries and the top-level folders it copies into /app."""
    text = DOCKERFILE.read_text()
    path = re.search(r"^ENV PYTHONPATH=(\S+)", text, re.M)
    copied = set(re.findall(r"^COPY (\S+) \./\1\s*$", text, re.M))
    return (path.group(1).split(":") if path else []), copied


def module_exists(module: str, pythonpath: list[str]) -> str | None:
    """Where ``module`` is found in the image, mapped onto the repo (None if nowhere)."""
    _, copied = dockerfile_facts()
    rel = module.replace(".", "/")
    for entry in [*pythonpath, "/app"]:
        if not entry.startswith("/app"):
            continue
        base = ROOT / entry.removeprefix("/app").lstrip("/")
        for cand in (base / f"{rel}.py", base / rel / "__init__.py"):
            if cand.is_file() and cand.relative_to(ROOT).parts[0] in copied:
                return str(cand.relative_to(ROOT))
    return None


def config_maps(manifests: Manifests) -> dict[str, dict[str, str]]:
    """ConfigMap data by name."""
    return {d["metadata"]["name"]: d.get("data", {}) for docs in manifests.values()
            for d in docs if d.get("kind") == "ConfigMap"}


def secret_keys() -> dict[str, str]:
    """The keys (and committed values) of the secrets template."""
    pairs = (line.split("=", 1) for line in SECRETS_EXAMPLE.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def walk_strings(node: Any) -> Iterator[str]:
    """Every string in a document, keys included."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from walk_strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk_strings(v)
    elif isinstance(node, str):
        yield node


# -- the project's invariants, as lists of problems ---------------------------------


def secret_problems(manifests: Manifests) -> list[str]:
    """Passwords only from the Secret: none written into any manifest."""
    out = []
    for path, docs in manifests.items():
        for doc in docs:
            where = f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            if doc.get("kind") == "Secret" and (doc.get("data") or doc.get("stringData")):
                out.append(f"{where}: a Secret with values is committed")
            for s in walk_strings(doc):
                for pw in URL_PASSWORD.findall(s):
                    if pw != "$(REDIS_PASSWORD)":
                        out.append(f"{where}: a URL carries a literal password {pw!r}")
                if "--basic-auth" in s:
                    out.append(f"{where}: --basic-auth on a command line; use the Secret")
                m = re.search(r"--requirepass\s+(\S+)", s)
                if m and m.group(1) != '"$REDIS_PASSWORD"':
                    out.append(f"{where}: --requirepass {m.group(1)} is not from the Secret")
            for c in containers(doc):
                for name, e in env_of(c).items():
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if SECRET_ENV.search(name) and ref is None:
                        out.append(f"{where}: env {name} is not read from a Secret")
                    if ref is not None and (ref.get("name") != SECRET_NAME
                                            or ref.get("key") not in secret_keys()):
                        out.append(f"{where}: env {name} reads {ref}, not a key of "
                                   f"{SECRET_NAME} in {SECRETS_EXAMPLE.name}")
    return out


def worker_problems(manifests: Manifests) -> list[str]:
    """Every worker: solo pool, a name per pod, grace for hand-back, a liveness ping,
    known flags; GPU workers: one GPU each, cuda:0, in a workload whose scale-in honours
    the pod-deletion cost the autoscaler sets (a Deployment)."""
    out, kinds = [], {"gpu": 0, "emulated": 0}
    for path, docs in manifests.items():
        for doc in docs:
            pod = doc["spec"]["template"]["spec"] if doc.get("kind") in WORKLOADS else {}
            for c in containers(doc):
                cmd = [str(a) for a in c.get("command", []) + c.get("args", [])]
                if cmd[:1] != ["celery"] or "worker" not in cmd:
                    continue
                where = f"{path}: {doc['kind']} {doc['metadata']['name']}"
                if pod.get("terminationGracePeriodSeconds", 30) < MIN_GRACE_S:
                    out.append(f"{where}: terminationGracePeriodSeconds < {MIN_GRACE_S}")
                if arg_after(cmd, "-P") != "solo":
                    out.append(f"{where}: not -P solo")
                name = arg_after(cmd, "-n") or ""
                if not re.fullmatch(r"[\w-]+@\$\(POD_NAME\)", name):
                    out.append(f"{where}: worker name {name!r} is not <name>@$(POD_NAME)")
                pod_name = env_of(c).get("POD_NAME", {}).get("valueFrom", {})
                if pod_name.get("fieldRef", {}).get("fieldPath") != "metadata.name":
                    out.append(f"{where}: POD_NAME is not the pod's metadata.name")
                ping = probe_text(c, "livenessProbe")
                if "inspect ping" not in ping or name.replace("$(POD_NAME)", "$POD_NAME") \
                        not in ping:
                    out.append(f"{where}: liveness probe does not ping {name}")
                for flag in (a for a in cmd if a.startswith("--compass-")):
                    if flag[2:].removeprefix("compass-").replace("-", "_") not in WORKER_FLAGS:
                        out.append(f"{where}: unknown worker flag {flag}")
                port = arg_after(cmd, "--compass-metrics-port")
                if port is None or int(port) not in {p["containerPort"]
                                                     for p in c.get("ports", [])}:
                    out.append(f"{where}: metrics port {port} is not a container port")
                gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                if "--compass-gpu" in cmd:
                    kinds["gpu"] += 1
                    if doc["kind"] not in DELETION_COST_KINDS:
                        out.append(f"{where}: a {doc['kind']} ignores {DELETION_COST}: "
                                   f"GPU workers must be a Deployment to scale in the "
                                   f"chosen pod")
                    if str(gpus) != "1":
                        out.append(f"{where}: limits nvidia.com/gpu is {gpus!r}, not 1")
                    if arg_after(cmd, "--compass-gpu") != "cuda:0":
                        out.append(f"{where}: the one visible GPU is cuda:0")
                else:
                    kinds["emulated"] += 1
                    if "--compass-emulate-gpu-mb" not in cmd:
                        out.append(f"{where}: neither --compass-gpu nor an emulated GPU")
                    if gpus is not None:
                        out.append(f"{where}: an emulated worker requests a GPU")
    out += [f"no {kind} worker in the manifests" for kind, n in kinds.items() if not n]
    return out


def reference_problems(manifests: Manifests) -> list[str]:
    """Images as in compose; app modules, config files, ConfigMaps and COMPASS_* names
    that exist in the repo."""
    out = []
    compass_image, redis_image = compose_images()
    image_path, _ = dockerfile_facts()
    maps = config_maps(manifests)
    read_by_code = "\n".join(p.read_text() for d in ("compass_celery", "workers", "compose",
                                                    "examples") for p in (ROOT / d).rglob("*.py"))
    # A setting is used when code reads it, or a command expands it ($(KEY) or $KEY).
    read_by_code += "\n".join(f'"{v}"' for docs in manifests.values() for d in docs
                              for s in walk_strings(d)
                              for v in re.findall(r"\$\(?([A-Z_]+)\)?", s))
    for path, docs in manifests.items():
        for doc in docs:
            where = f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            for key in (maps.get(doc["metadata"]["name"], {})
                        if doc.get("kind") == "ConfigMap" else {}):
                if f'"{key}"' not in read_by_code:
                    out.append(f"{where}: {key} is read by no code in the repo")
            for c in containers(doc):
                if c["image"] not in (*compass_image, redis_image):
                    out.append(f"{where}: image {c['image']} is not the compose file's")
                if c["image"] not in compass_image:
                    continue
                env: dict[str, str] = {}
                for ref in c.get("envFrom", []):
                    cm = ref.get("configMapRef", {}).get("name")
                    if cm not in maps:
                        out.append(f"{where}: no ConfigMap {cm}")
                    env.update(maps.get(cm, {}))
                env.update({k: e["value"] for k, e in env_of(c).items() if "value" in e})
                for k in env_of(c):
                    if k.startswith("COMPASS_") and f'"{k}"' not in read_by_code:
                        out.append(f"{where}: {k} is read by no code in the repo")
                pythonpath = env.get("PYTHONPATH", "").split(":") if "PYTHONPATH" in env \
                    else image_path
                texts = [command_text(c), probe_text(c, "livenessProbe"),
                         probe_text(c, "startupProbe")]
                modules = [m for t in texts for m in
                           re.findall(r"(?:-A|--app)\s+\"?(\$\(?\w+\)?|[\w.]+)\"?", t)]
                modules += [m for t in texts for m in  # a WSGI server's "module:factory()"
                            re.findall(r"gunicorn\b.*?\"?([A-Za-z_][\w.]*):\w+\(", t)]
                if not modules:
                    out.append(f"{where}: container {c['name']} names no app module")
                for mod in modules:
                    var = re.fullmatch(r"\$\(?(\w+)\)?", mod)
                    mod = env.get(var.group(1), "") if var else mod
                    if not mod or module_exists(mod, pythonpath) is None:
                        out.append(f"{where}: app module {mod!r} is not in the image")
                for conf in re.findall(r"--conf=(\S+)", command_text(c)):
                    if not (ROOT / conf.removeprefix("/app/")).is_file():
                        out.append(f"{where}: {conf} is not in the image")
    return out


def workload_of(manifests: Manifests, kind: str, name: str) -> dict[str, Any] | None:
    """The workload ``kind``/``name`` among the manifests (None: not there)."""
    return next((d for docs in manifests.values() for d in docs
                 if d.get("kind") == kind and d["metadata"]["name"] == name), None)


def scaling_problems(manifests: Manifests, keda: dict[str, Any] | None = None) -> list[str]:
    """What KEDA scales is what the autoscaler's provider can steer: every ScaledObject's
    target is a workload in the manifests whose scale-in reads the pod-deletion cost
    (:data:`DELETION_COST_KINDS`: a StatefulSet removes its highest ordinal whatever the
    annotation says), running GPU workers; and the keda overlay's patch (which drops the
    replicas and adds the preload hint) targets that same workload."""
    out = []
    keda = keda if keda is not None else yaml.safe_load((K8S / "keda" /
                                                         "kustomization.yaml").read_text())
    scaled = [(path, d) for path, docs in manifests.items() for d in docs
              if d.get("kind") == "ScaledObject"]
    if not scaled:
        out.append("no ScaledObject in the manifests")
    for path, obj in scaled:
        ref = obj["spec"]["scaleTargetRef"]
        kind, name = ref.get("kind", "Deployment"), ref["name"]  # KEDA's default kind
        where = f"{path}: ScaledObject {obj['metadata']['name']} -> {kind} {name}"
        if kind not in DELETION_COST_KINDS:
            out.append(f"{where}: a {kind} ignores {DELETION_COST}, so the scale-in "
                       f"cannot remove the pod the autoscaler marked")
        target = workload_of(manifests, kind, name)
        if target is None:
            out.append(f"{where}: no such workload in the manifests")
            continue
        if ref.get("apiVersion", "apps/v1") != target["apiVersion"]:
            out.append(f"{where}: apiVersion {ref.get('apiVersion')} is not the target's")
        if not any("--compass-gpu" in command_text(c) for c in containers(target)):
            out.append(f"{where}: the target runs no GPU worker")
        patched = {(p["target"].get("kind"), p["target"].get("name"))
                   for p in keda.get("patches", [])}
        if (kind, name) not in patched:
            out.append(f"{where}: the keda overlay patches {sorted(patched)}, not the "
                       f"scaled target (its replicas would fight KEDA, its pods get no "
                       f"preload hint)")
    return out


def problems(manifests: Manifests, keda: dict[str, Any] | None = None) -> list[str]:
    """Every invariant broken by ``manifests`` (and the keda overlay's kustomization)."""
    return secret_problems(manifests) + worker_problems(manifests) + \
        reference_problems(manifests) + scaling_problems(manifests, keda)


# -- tests --------------------------------------------------------------------------


def test_every_manifest_validates_against_the_kubernetes_schemas() -> None:
    utils = _kubernetes_validate()
    docs = [(path, d) for path, ds in load().items() for d in ds if not is_custom(d)]
    assert len(docs) >= 10
    failures = []
    for version in schema_versions(utils):
        for path, doc in docs:
            try:
                utils.validate(doc, version, strict=True)
            except utils.ValidationError as exc:
                failures.append(f"{path}: {doc['kind']} {doc['metadata']['name']} "
                                f"(Kubernetes {version}) at {exc.json_path}: {exc.message}")
    assert failures == []


def test_the_manifests_keep_the_project_invariants() -> None:
    assert problems(load()) == []


def test_the_app_runs_on_a_production_server_and_gpu_workers_on_the_torch_image() -> None:
    manifests = load()
    app = next(c for docs in manifests.values() for d in docs for c in containers(d)
               if c["name"] == "app")
    assert app["command"][0] == "gunicorn", app["command"]
    gpu = _gpu_container(manifests)
    assert gpu["image"] == yaml.safe_load(COMPOSE.read_text())["x-gpu-worker"]["image"]


def test_every_manifest_is_in_a_kustomization_and_secrets_stay_out_of_git() -> None:
    for kfile in K8S.rglob("kustomization.yaml"):
        kust = yaml.safe_load(kfile.read_text())
        for res in kust.get("resources", []):
            assert (kfile.parent / res).exists(), f"{kfile}: {res} missing"
        listed = {(kfile.parent / r).resolve() for r in kust.get("resources", [])}
        for p in kfile.parent.glob("*.yaml"):
            assert p.name == "kustomization.yaml" or p.resolve() in listed, \
                f"{p} is in no kustomization"
        for gen in kust.get("secretGenerator", []):
            assert gen["name"] == SECRET_NAME
            for env_file in gen.get("envs", []):
                assert (kfile.parent / f"{env_file}.example").is_file()
        for image in kust.get("images", []):
            assert image["name"] in {i.split(":")[0] for i in compose_images()[0]}
    assert "secrets.env" in (K8S / ".gitignore").read_text().split()
    assert set(secret_keys()) == {"REDIS_PASSWORD", "FLOWER_BASIC_AUTH"}
    assert all(v == "" for v in secret_keys().values()), "the template must hold no secret"


def _gpu_worker(m: Manifests) -> dict[str, Any]:
    return next(d for d in m["gpu/gpu-workers.yaml"] if d["kind"] == "Deployment")


def _gpu_container(m: Manifests) -> dict[str, Any]:
    return _gpu_worker(m)["spec"]["template"]["spec"]["containers"][0]


def _set_env(m: Manifests, name: str, value: str) -> None:
    env = _gpu_container(m)["env"]
    env[:] = [e for e in env if e["name"] != name] + [{"name": name, "value": value}]


def _replace_arg(m: Manifests, old: str, new: str) -> None:
    cmd = _gpu_container(m)["command"]
    cmd[cmd.index(old)] = new


BREAKAGES = {
    "no GPU limit": (lambda m: _gpu_container(m)["resources"]["limits"].pop("nvidia.com/gpu"),
                     "nvidia.com/gpu"),
    "short grace": (lambda m: _gpu_worker(m)["spec"]["template"]["spec"].update(
        terminationGracePeriodSeconds=30), "terminationGracePeriodSeconds"),
    "name from the host": (lambda m: _replace_arg(m, "gpu@$(POD_NAME)", "gpu@%h"),
                           "worker name"),
    "GPU workers as a StatefulSet": (lambda m: _gpu_worker(m).update(kind="StatefulSet"),
                                     "ignores " + DELETION_COST),
    "KEDA scales a StatefulSet": (
        lambda m: m[SCALED_OBJECT][0]["spec"]["scaleTargetRef"].update(kind="StatefulSet"),
        "cannot remove the pod the autoscaler marked"),
    "KEDA scales what is not there": (
        lambda m: m[SCALED_OBJECT][0]["spec"]["scaleTargetRef"].update(name="gpu-workers"),
        "no such workload"),
    "prefork pool": (lambda m: _replace_arg(m, "solo", "prefork"), "solo"),
    "literal password in a URL": (
        lambda m: _set_env(m, "COMPASS_BROKER_URL", "redis://:hunter2@compass-redis:6379/0"),
        "literal password"),
    "password in plain env": (lambda m: _set_env(m, "REDIS_PASSWORD", "hunter2"),
                              "not read from a Secret"),
    "committed Secret": (lambda m: m["gpu/gpu-workers.yaml"].append(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"},
         "stringData": {"REDIS_PASSWORD": "hunter2"}}), "Secret with values"),
    "misspelt app module": (lambda m: _replace_arg(m, "$(COMPASS_APP)", "compass_prj"),
                            "compass_prj"),
    "unknown flag": (lambda m: _replace_arg(m, "--compass-gpu", "--compass-gpus"),
                     "unknown worker flag"),
    "another image": (lambda m: _gpu_container(m).update(image="celery:5"), "image"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_manifest_is_caught(breakage: str) -> None:
    manifests = copy.deepcopy(load())
    assert problems(manifests) == []
    breaks, expected = BREAKAGES[breakage]
    breaks(manifests)
    found = problems(manifests)
    assert any(expected in p for p in found), found


def test_a_schema_violation_is_caught() -> None:
    utils = _kubernetes_validate()
    worker = copy.deepcopy(_gpu_worker(load()))
    spec = worker["spec"]["template"]["spec"]
    spec["terminationGracePeriodSecond"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(utils.ValidationError):
        utils.validate(worker, schema_versions(utils)[0], strict=True)
    worker = copy.deepcopy(_gpu_worker(load()))
    worker["spec"]["replicas"] = "two"
    with pytest.raises(utils.ValidationError):
        utils.validate(worker, schema_versions(utils)[0], strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="needs kubectl (its built-in kustomize) to build the overlays")
def test_kustomize_builds_each_overlay_and_refuses_without_secrets(tmp_path: Path) -> None:
    tree = tmp_path / "kubernetes"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    refused = subprocess.run(["kubectl", "kustomize", str(tree / "gpu")],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "secrets.env" in refused.stderr
    (tree / "base" / "secrets.env").write_text("REDIS_PASSWORD=x\nFLOWER_BASIC_AUTH=u:p\n")
    utils = _kubernetes_validate()
    for overlay, worker in (("gpu", "compass-gpu-worker"), (".", "compass-gpu-worker"),
                            ("emulated", "compass-emulated-worker"),
                            ("keda", "compass-gpu-worker")):
        built = subprocess.run(["kubectl", "kustomize", str(tree / overlay)],
                               capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
        docs = [d for d in yaml.safe_load_all(built.stdout) if d]
        names = {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert ("Secret", SECRET_NAME) in names and ("StatefulSet", "compass-redis") in names
        assert any(n == worker for _, n in names), overlay
        for doc in docs:
            if not is_custom(doc):
                utils.validate(doc, schema_versions(utils)[0], strict=True)
        gpu = [d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"] == "compass-gpu-worker"]
        assert ("StatefulSet", "compass-gpu-worker") not in names
        if overlay == "keda":  # KEDA owns the count: an apply must not reset it
            assert ("ScaledObject", "compass-gpu-worker") in names
            # what it scales is built, and is a kind whose scale-in reads the mark
            assert scaling_problems({"built": docs}) == []
            assert "replicas" not in gpu[0]["spec"]
            # a new pod pops the autoscaler's preload hint (providers.HINT) at start
            command = next(containers(gpu[0]))["command"]
            assert command[-2:] == ["--compass-preload", HINT], command
        else:
            assert ("ScaledObject", "compass-gpu-worker") not in names


def test_the_keda_overlay_patching_another_workload_is_caught() -> None:
    keda = yaml.safe_load((K8S / "keda" / "kustomization.yaml").read_text())
    assert scaling_problems(load(), keda) == []
    keda["patches"][0]["target"]["kind"] = "StatefulSet"  # the target before it moved
    found = scaling_problems(load(), keda)
    assert any("not the scaled target" in p for p in found), found


def test_the_guide_marks_pods_of_the_workload_keda_scales() -> None:
    """The provider the autoscaling guide builds lists the pods of the scaled Deployment
    (its label selector matches the pod template's labels) and names workers as the pods
    do (``-n gpu@$(POD_NAME)``), so the pod it marks is one KEDA's scale-in picks from."""
    text = (ROOT / "docs" / "guides" / "autoscaling.md").read_text()
    call = re.search(r'KubernetesProvider\("([\w-]+)", "[\w-]+",\s*"([^"]+)"', text)
    assert call is not None, "the guide builds no KubernetesProvider"
    name, selector = call.groups()
    (obj,) = load()[SCALED_OBJECT]
    ref = obj["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", name)
    target = workload_of(load(), "Deployment", name)
    assert target is not None
    labels = target["spec"]["template"]["metadata"]["labels"]
    wanted = dict(term.split("=", 1) for term in selector.split(","))
    assert wanted.items() <= labels.items(), (wanted, labels)
    assert wanted.items() <= target["spec"]["selector"]["matchLabels"].items()
    cmd = next(containers(target))["command"]
    assert arg_after(cmd, "-n") == "gpu@$(POD_NAME)"  # the provider's worker_prefix "gpu"


def test_the_scaled_object_scales_the_gpu_workers_on_the_capacity_signal() -> None:
    """KEDA's ScaledObject targets the GPU worker Deployment and asks Prometheus for
    compass_workers_needed, a gauge the state collector exports, one pod per unit."""
    (obj,) = load()[SCALED_OBJECT]
    assert (obj["apiVersion"], obj["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    target = obj["spec"]["scaleTargetRef"]
    gpu = _gpu_worker(load())
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        gpu["apiVersion"], gpu["kind"], gpu["metadata"]["name"])
    assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
    (trigger,) = obj["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["threshold"] == "1"  # desired pods = ceil(value / 1) = the signal itself
    assert re.fullmatch(r"https?://\S+", meta["serverAddress"])
    metric = re.search(r"\b(compass_[a-z_]+)\b", meta["query"])
    assert metric is not None and metric.group(1) == "compass_workers_needed"
    assert f'"{metric.group(1)}"' in (ROOT / "compass_celery" / "monitoring.py").read_text()
    assert obj["spec"]["fallback"]["replicas"] >= obj["spec"]["minReplicaCount"]
    # Flower, which exports the gauge, is scraped where the pods are discovered
    flower = next(d for d in load()["base/flower.yaml"] if d["kind"] == "Deployment")
    notes = flower["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    ports = {p["containerPort"] for c in containers(flower) for p in c["ports"]}
    assert int(notes["prometheus.io/port"]) in ports


def exported_metrics() -> set[str]:
    """The metric names the monitoring module exports, without their ``compass_``."""
    text = (ROOT / "compass_celery" / "monitoring.py").read_text()
    return set(re.findall(r'"compass_([a-z_]+[a-z])"', text)) | {
        f"worker_{k}" for k in re.findall(r'\("([a-z_]+)", "', text)}


def test_the_multihost_guide_names_only_settings_and_flags_that_exist() -> None:
    text = (ROOT / "docs" / "MULTIHOST.md").read_text()
    settings = set(re.findall(r"\bcompass_([a-z_]+[a-z])", text)) - {"proj", "celery"}
    settings = {s.removesuffix("_total") for s in settings} - exported_metrics()
    assert settings and settings <= set(OPTIONS), settings - set(OPTIONS)
    flags = {f.replace("-", "_") for f in re.findall(r"--compass-([a-z-]+[a-z])", text)}
    assert flags and flags <= set(WORKER_FLAGS), flags - set(WORKER_FLAGS)
    for path in re.findall(r"`((?:deploy|compose|docs)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), path
