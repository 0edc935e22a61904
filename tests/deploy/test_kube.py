"""deploy/k8s played with ``podman kube play`` through the local overlay (deploy/k8s/podman).

The overlay is rendered here the way ``kubectl kustomize`` would for the
fields it uses (strategic-merge patches by kind and name, the image name),
since kubectl is not installed on these machines. The session's service
ports, the built image and a health port the host has free are filled in,
and the Secret is made from the template with local URLs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from leaseworker_dev._services import LocalKafka, LocalPostgres, LocalRedis, free_port

from ..health_util import probe
from ..kafka_util import produce
from ..waiting import eventually
from .podman import REPO, Podman
from .reports import PARTITIONS, TOPIC, all_committed

K8S = REPO / "deploy" / "k8s"
OVERLAY = K8S / "podman"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize does it for these files.

    Maps merge, null deletes, lists of named items merge by name.
    """
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = _merge(merged[key], value) if key in merged else value
        return merged
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(item, dict) and "name" in item for item in base + patch):
        by_name = {item["name"]: item for item in base}
        for item in patch:
            by_name[item["name"]] = _merge(by_name.get(item["name"], {}), item)
        return list(by_name.values())
    return patch


def render_overlay() -> list[dict[str, Any]]:
    """The base's resources with the overlay's patches and image applied."""
    overlay = _documents(OVERLAY / "kustomization.yaml")[0]
    assert overlay["resources"] == [".."]
    base = _documents(K8S / "kustomization.yaml")[0]
    docs = [doc for name in base["resources"] for doc in _documents(K8S / name)]
    for entry in overlay["patches"]:
        [patch] = _documents(OVERLAY / entry["path"])
        for i, doc in enumerate(docs):
            if (doc["kind"], doc["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"]):
                docs[i] = _merge(doc, patch)
    images = {image["name"]: image for image in overlay["images"]}
    for doc in docs:
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                image = images[container["image"]]
                container["image"] = f"{image['newName']}:{image['newTag']}"
    return docs


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs}


def _worker(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def test_the_overlay_keeps_the_bases_probes_and_changes_only_what_podman_needs() -> None:
    """Probe paths stay; the numeric port equals the base's named one; host network, one replica."""
    base = _by_kind([doc for name in ("configmap.yaml", "deployment.yaml")
                     for doc in _documents(K8S / name)])  # fmt: skip
    played = _by_kind(render_overlay())
    base_worker, worker = _worker(base["Deployment"]), _worker(played["Deployment"])
    named = {port["name"]: port["containerPort"] for port in base_worker["ports"]}
    health = int(base["ConfigMap"]["data"]["LEASEWORKER_HEALTH_PORT"])
    for name in PROBES:
        written, overlaid = base_worker[name]["httpGet"], worker[name]["httpGet"]
        assert overlaid["path"] == written["path"]
        assert overlaid["port"] == named[written["port"]] == health
        assert {k: v for k, v in worker[name].items() if k != "httpGet"} == {
            k: v for k, v in base_worker[name].items() if k != "httpGet"
        }
    spec = played["Deployment"]["spec"]
    assert spec["template"]["spec"]["hostNetwork"] is True
    assert spec["replicas"] == 1
    assert "ports" not in worker
    assert worker["securityContext"] == base_worker["securityContext"]
    assert worker["image"] == "localhost/leaseworker:dev"
    [patch] = _documents(OVERLAY / "configmap.yaml")
    deleted = {key for key, value in patch["data"].items() if value is None}
    assert deleted <= base["ConfigMap"]["data"].keys()  # a renamed base key fails here


def test_what_podman_does_not_play_agrees_with_what_it_does() -> None:
    """The PodDisruptionBudget (accepted, ignored by Podman) fits the Deployment it guards.

    A voluntary disruption takes no more pods than a rolling update does and
    always leaves one running; the selector is checked in tests/dev/test_deploy.py.
    """
    kinds = _by_kind([doc for name in ("deployment.yaml", "poddisruptionbudget.yaml")
                      for doc in _documents(K8S / name)])  # fmt: skip
    budget = kinds["PodDisruptionBudget"]
    spec = kinds["Deployment"]["spec"]
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["maxUnavailable"] <= spec["strategy"]["rollingUpdate"]["maxUnavailable"]
    assert budget["spec"]["maxUnavailable"] < spec["replicas"]
    assert "minAvailable" not in budget["spec"]  # one or the other, never both


@pytest.fixture
def played(
    engine: Podman,
    image: str,
    kafka_server: LocalKafka,
    redis_server: LocalRedis,
    postgres_server: LocalPostgres,
    tmp_path: Path,
) -> Iterator[dict[str, Any]]:
    """The overlay played as a pod of this test's own; ``--down`` after, checked to leave nothing.

    The Secret made from the template is created with ``podman secret
    create`` (the Secret's own YAML; Podman 4.3's ``secret`` volume mounts
    ``data`` only, its values as written, not base64) and removed after;
    ``--down`` does not remove secrets.
    """
    suffix = uuid.uuid4().hex[:8]
    name = f"leaseworker-{suffix}"
    kinds = _by_kind(render_overlay())
    port = free_port()
    config, deployment = kinds["ConfigMap"], kinds["Deployment"]
    config["data"].update(
        LEASEWORKER_BOOTSTRAP_SERVERS=kafka_server.bootstrap_servers,
        LEASEWORKER_HEALTH_PORT=str(port),
        LEASEWORKER_GROUP=f"kube-{suffix}",
        LEASEWORKER_NAMESPACE=f"kube{suffix}",
    )
    [secret] = _documents(K8S / "secret.template.yaml")
    values = {
        "redis-url": redis_server.url,
        "store-url": postgres_server.create_database(f"k{suffix}"),
    }  # the local broker has no SASL: the template's Kafka password does not apply
    assert values.keys() <= secret["stringData"].keys()
    # Podman 4.3's secret volume mounts only ``data``, its values as written (no base64)
    del secret["stringData"]
    secret["data"] = values
    secret["metadata"]["name"] = name
    worker = _worker(deployment)
    worker["image"] = image
    for probe_name in PROBES:
        worker[probe_name]["httpGet"]["port"] = port
    for doc in (config, deployment):
        doc["metadata"]["name"] = name
    for ref in worker["envFrom"]:
        next(iter(ref.values()))["name"] = name
    for volume in deployment["spec"]["template"]["spec"]["volumes"]:
        if "secret" in volume:
            volume["secret"]["secretName"] = name
    engine("secret", "create", name, "-", stdin=yaml.safe_dump(secret).encode())
    path = tmp_path / "play.yaml"
    ignored = [kinds["PodDisruptionBudget"], kinds["Service"]]  # accepted, not played
    path.write_text(yaml.safe_dump_all([config, deployment, *ignored]))
    try:
        engine("kube", "play", str(path), timeout=180)
        yield {"deployment": deployment, "port": port, "suffix": suffix}
    finally:
        engine("kube", "play", "--down", str(path), timeout=180, check=False)
        engine("secret", "rm", name, check=False)
    left = engine("ps", "-a", "--format", "{{.Names}}").stdout + engine("pod", "ps").stdout
    assert suffix not in left + engine("secret", "ls").stdout


async def test_the_manifests_play_as_a_pod_that_passes_its_probes_runs_a_trigger_and_drains(
    engine: Podman, played: dict[str, Any], kafka_server: LocalKafka
) -> None:
    """The played pod runs the Deployment's job, its probes answer 200, SIGTERM exits 0.

    Startup, liveness and readiness probes (path and port as the Deployment
    says) are asked from the host, as a kubelet would: the pod shares the
    host's network. The securityContext reaches the container (uid 10001,
    read-only root, no capabilities, no privilege escalation), and so do the
    memory limit and the /tmp emptyDir. Podman plays no terminationGracePeriod
    (its stop timeout stays 10 s), so the pod is stopped with the manifest's.
    """
    deployment, port, suffix = played["deployment"], played["port"], played["suffix"]
    worker = _worker(deployment)
    assert {worker[name]["httpGet"]["port"] for name in PROBES} == {port}
    kafka_server.create_topics([TOPIC, "reports.dead-letter"], partitions=PARTITIONS, exist_ok=True)

    async def probes_pass() -> bool:
        for name in PROBES:
            try:
                status, _ = await probe(
                    worker[name]["httpGet"]["port"], worker[name]["httpGet"]["path"]
                )
            except OSError:
                return False
            if status != 200:
                return False
        return True

    try:
        await eventually(probes_pass, within=90)
    except TimeoutError:
        names = engine("ps", "-a", "--format", "{{.Names}}").stdout.split()
        logs = [engine("logs", n, check=False).stderr[-2000:] for n in names if suffix in n]
        pytest.fail("the probes never passed; the containers logged:\n" + "\n".join(logs))
    container = _container_name(engine, suffix)
    [inspected] = json.loads(engine("inspect", container).stdout)
    assert inspected["Config"]["User"] == "10001:10001"
    assert inspected["HostConfig"]["ReadonlyRootfs"] is True
    assert not inspected["EffectiveCaps"]
    assert "no-new-privileges" in inspected["HostConfig"]["SecurityOpt"]
    assert inspected["HostConfig"]["Memory"] == 512 * 2**20  # resources.limits.memory
    assert "/tmp" in {mount["Destination"] for mount in inspected["Mounts"]}  # the emptyDir
    group = f"kube-{suffix}"
    trigger = {"tenant": f"t{suffix}", "period": "2026-11", "rows": 1000}
    await produce(kafka_server.bootstrap_servers, TOPIC, [(None, json.dumps(trigger).encode())])
    await eventually(lambda: all_committed(kafka_server.bootstrap_servers, group), within=90)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pod = inspected["Pod"]
    engine("pod", "stop", "--time", str(grace), pod, timeout=grace + 30)
    code = engine("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip()
    assert code == "0", engine("logs", container).stderr[-3000:]


def _container_name(engine: Podman, suffix: str) -> str:
    names = engine("ps", "--format", "{{.Names}}").stdout.split()
    [name] = [n for n in names if suffix in n and not n.endswith("-infra")]
    return name
