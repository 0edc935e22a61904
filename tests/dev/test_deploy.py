"""The deployment files (deploy/) agree with the code: env vars, commands, probes, timing.

These read files and the CLI parser only; no container engine or cluster is
needed. Where this machine has a tool that validates more (``kubectl
kustomize``, ``docker compose config``), the test uses it and skips, saying
why, where it does not.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from leaseworker._cli import load_job_class
from leaseworker._cli._main import build_parser
from leaseworker._cli._run_command import build_config
from leaseworker._worker import HEALTH_PATH, READY_PATH

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCS = REPO / "docs" / "operations.md"

OTEL_VARS = {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT"}
"""Standard OpenTelemetry SDK variables: read by the SDK itself, not by a flag."""

GRACE_MARGIN = 2.0
"""Seconds the grace period must leave beyond the drain, release and commit bounds."""


# -- reading the files ----------------------------------------------------------------


def _yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _k8s() -> dict[str, Any]:
    """Every manifest in deploy/k8s by kind (the Secret template included)."""
    found: dict[str, Any] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in _yaml_documents(path):
            found[doc["kind"]] = doc
    return found


def _compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def _interpolate(value: str) -> str:
    """Resolve compose's ``${NAME:-default}`` to its default, as an empty environment would."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the final stage, continuation lines joined."""
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]
    instructions = [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if not line.lstrip().startswith("#")
    ]
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def _docker_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for name, args in _dockerfile():
        if name == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def _docker_json(instruction: str) -> list[str]:
    [args] = [args for name, args in _dockerfile() if name == instruction]
    value: list[str] = yaml.safe_load(args)  # exec form is a JSON array
    return value


# -- reading the CLI ------------------------------------------------------------------


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise AssertionError(f"no subcommand {name}")


def _env_vars(*parsers: argparse.ArgumentParser) -> set[str]:
    """The LEASEWORKER_* variables the parsers' flags say they read ("env NAME" in --help)."""
    names: set[str] = set()
    for parser in parsers:
        for action in parser._actions:
            names.update(re.findall(r"env (LEASEWORKER_[A-Z0-9_]+)", action.help or ""))
    return names


def _reads(subcommand: str) -> set[str]:
    return _env_vars(build_parser(), _subparser(subcommand)) | OTEL_VARS


def _k8s_env(k8s: dict[str, Any], directory: Path) -> dict[str, str]:
    """The ConfigMap's variables, the Secret template's keys as the files its mount makes.

    Each ``*_FILE`` variable naming a file in the Secret's mount points at a
    copy in ``directory`` holding the template's value.
    """
    mount = _secret_mount(k8s)
    env = dict(k8s["ConfigMap"]["data"])
    for key, value in k8s["Secret"]["stringData"].items():
        (directory / key).write_text(value + "\n")
    for name, path in env.items():
        if name.endswith("_FILE") and path.startswith(f"{mount}/"):
            env[name] = str(directory / path.removeprefix(f"{mount}/"))
    return env


def _secret_mount(k8s: dict[str, Any]) -> str:
    """Where the Deployment mounts the Secret (the one ``secret`` volume)."""
    spec = k8s["Deployment"]["spec"]["template"]["spec"]
    [volume] = [v["name"] for v in spec["volumes"] if v.get("secret", {}).get("secretName")]
    [mount] = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume]
    return str(mount)


def _run_config(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, job: str) -> Any:
    """Build the PodConfig that ``leaseworker run JOB`` would build in ``env``."""
    for name in _env_vars(build_parser(), _subparser("run")):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["run", job])
    return build_config(args)


# -- the tests ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [DEPLOY / "compose.yaml", *sorted(K8S.glob("*.yaml"))], ids=lambda p: p.name
)
def test_every_yaml_file_parses(path: Path) -> None:
    """Each deployment YAML file is valid YAML with at least one document."""
    assert _yaml_documents(path)


def test_compose_sets_only_variables_its_commands_read() -> None:
    """Workers set only `run` variables, the producer only `trigger` ones (plus OTEL_*)."""
    services = _compose()["services"]
    worker_env = set(services["worker"]["environment"])
    trigger_env = set(services["trigger"]["environment"])
    assert worker_env - _reads("run") == set()
    assert trigger_env - _reads("trigger") == set()
    assert "LEASEWORKER_HEALTH_PORT" in worker_env


def test_kubernetes_and_image_set_only_variables_the_cli_reads() -> None:
    """ConfigMap, Secret template, Deployment env and the image's ENV name real run variables."""
    k8s = _k8s()
    container = k8s["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    names = (
        set(k8s["ConfigMap"]["data"])
        | {item["name"] for item in container.get("env", [])}
        | {name for name in _docker_env() if name.startswith(("LEASEWORKER_", "OTEL_"))}
    )
    assert names - _reads("run") == set()


def test_every_credential_is_a_file_of_the_secret_named_by_a_file_variable() -> None:
    """No credential in a variable: each Secret key is mounted and read through ``*_FILE``."""
    k8s = _k8s()
    container = k8s["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert all("secretRef" not in ref for ref in container["envFrom"])
    mount = _secret_mount(k8s)
    named = {
        path.removeprefix(f"{mount}/")
        for name, path in k8s["ConfigMap"]["data"].items()
        if name.endswith("_FILE") and path.startswith(f"{mount}/")
    }
    assert named == set(k8s["Secret"]["stringData"])
    assert not any(re.search(r"PASSWORD$|_URL$", name) for name in k8s["ConfigMap"]["data"])


def test_the_configured_values_make_a_valid_worker_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The k8s ConfigMap + Secret template and the compose worker env build a PodConfig."""
    k8s = _k8s()
    ca = tmp_path / "ca.crt"
    trustme.CA().cert_pem.write_to_path(str(ca))  # the pod loads it at start
    env = _k8s_env(k8s, tmp_path)
    env["LEASEWORKER_KAFKA_CA_FILE"] = str(ca)
    job = _job_argument()
    config = _run_config(env, monkeypatch, job)
    assert config.kafka_security.protocol == env["LEASEWORKER_KAFKA_SECURITY_PROTOCOL"]
    secret = k8s["Secret"]["stringData"]
    assert config.kafka_security.password() == secret["kafka-sasl-password"]  # from its file
    assert config.redis_url == secret["redis-url"]
    compose_env = {
        k: _interpolate(v) for k, v in _compose()["services"]["worker"]["environment"].items()
    }
    assert _run_config(compose_env, monkeypatch, job).group == compose_env["LEASEWORKER_GROUP"]


def _job_argument() -> str:
    [job] = _docker_json("CMD")
    return job


def test_image_entrypoint_is_leaseworker_run_and_its_job_loads() -> None:
    """ENTRYPOINT is `leaseworker run`; the default job, and the one compose and k8s run, loads."""
    assert _docker_json("ENTRYPOINT") == ["leaseworker", "run"]
    job = _job_argument()
    assert load_job_class(job).__name__ == job.rsplit(":", 1)[1]
    container = _k8s()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [job]
    assert _compose()["services"]["worker"]["command"] == [job]


def test_image_runs_as_non_root_from_a_slim_base_and_bakes_in_no_secret() -> None:
    """Slim Python base, numeric non-root USER, no secret-like ENV/ARG, no whole-context COPY.

    The base is a build argument (the suite builds on a local Debian base):
    its default is the official slim image, and every stage starts from it.
    """
    [base] = [
        args for name, args in _dockerfile_all() if name == "ARG" and args.startswith("BASE=")
    ]
    assert re.fullmatch(r"BASE=python:3\.\d+-slim", base), base
    stages = [args for name, args in _dockerfile_all() if name == "FROM"]
    assert all(stage.split()[0] == "${BASE}" for stage in stages), stages
    [user] = [args for name, args in _dockerfile() if name == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    for name, args in _dockerfile_all():
        if name in ("ENV", "ARG"):
            assert not re.search(r"PASSWORD|SECRET|TOKEN|_KEY\b|REDIS_URL", args), args
        if name == "COPY" and "--from" not in args:
            sources = [s for s in shlex.split(args) if not s.startswith("--")][:-1]
            assert "." not in sources, f"COPY {args} would copy the whole build context"


def _dockerfile_all() -> Iterator[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, args = line.strip().partition(" ")
            yield name.upper(), args.strip()


def test_grace_periods_exceed_shutdown_timeout_plus_release_and_commit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """k8s terminationGracePeriodSeconds and compose stop_grace_period cover the whole drain.

    drain = shutdown_timeout + lease release (2 x redis_timeout + 0.5, the
    source's release grace) + commit_timeout, plus a margin.
    """
    k8s = _k8s()
    ca = tmp_path / "ca.crt"
    trustme.CA().cert_pem.write_to_path(str(ca))  # the pod loads it at start
    env = _k8s_env(k8s, tmp_path)
    env["LEASEWORKER_KAFKA_CA_FILE"] = str(ca)
    config = _run_config(env, monkeypatch, _job_argument())
    grace = k8s["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > _drain(config) + GRACE_MARGIN
    compose_env = {
        k: _interpolate(v) for k, v in _compose()["services"]["worker"]["environment"].items()
    }
    compose_config = _run_config(compose_env, monkeypatch, _job_argument())
    stop_grace = _compose()["services"]["worker"]["stop_grace_period"]
    assert float(stop_grace.removesuffix("s")) > _drain(compose_config) + GRACE_MARGIN


def _drain(config: Any) -> float:
    release = 2 * config.redis_timeout + 0.5
    return float(config.shutdown_timeout + release + config.commit_timeout)


def test_probes_use_the_health_paths_and_port_the_code_serves() -> None:
    """Liveness -> /healthz, readiness -> /readyz, on the container port LEASEWORKER_HEALTH_PORT."""
    k8s = _k8s()
    container = k8s["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    health_port = int(k8s["ConfigMap"]["data"]["LEASEWORKER_HEALTH_PORT"])
    assert container["livenessProbe"]["httpGet"]["path"] == HEALTH_PATH
    assert container["readinessProbe"]["httpGet"]["path"] == READY_PATH
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == health_port
    image_port = int(_docker_env()["LEASEWORKER_HEALTH_PORT"])
    assert str(image_port) in [args for name, args in _dockerfile() if name == "EXPOSE"]
    [healthcheck] = [args for name, args in _dockerfile() if name == "HEALTHCHECK"]
    assert f"/{HEALTH_PATH.lstrip('/')}'" in healthcheck
    assert "LEASEWORKER_HEALTH_PORT" in healthcheck


def test_compose_healthchecks_and_dependencies_fit_together() -> None:
    """Workers wait for healthy deps and the topic creator; their healthcheck asks /readyz."""
    services = _compose()["services"]
    worker = services["worker"]
    port = worker["environment"]["LEASEWORKER_HEALTH_PORT"]
    assert f"127.0.0.1:{port}{READY_PATH}" in " ".join(worker["healthcheck"]["test"])
    assert worker["deploy"]["replicas"] == 3
    for service in services.values():
        for dep, rule in service.get("depends_on", {}).items():
            assert dep in services
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{dep} has no healthcheck"
            if rule["condition"] == "service_completed_successfully":
                assert services[dep].get("restart") == "no"
    assert worker["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert {"4317:4317", "4318:4318", "16686:16686"} <= set(services["jaeger"]["ports"])
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]


def test_compose_images_pin_the_versions_the_test_suite_runs() -> None:
    """apache/kafka and Jaeger tags equal deploy/local's pinned Kafka and Jaeger versions."""
    services = _compose()["services"]
    pom = (DEPLOY / "local" / "kafka" / "pom.xml").read_text()
    [kafka_version] = re.findall(r"<kafka.version>([^<]+)</kafka.version>", pom)
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_version}"
    assert services["kafka-init"]["image"] == f"apache/kafka:{kafka_version}"
    gomod = (DEPLOY / "local" / "jaeger" / "go.mod").read_text()
    [jaeger_version] = re.findall(r"github.com/jaegertracing/jaeger v(\S+)", gomod)
    assert services["jaeger"]["image"] == f"jaegertracing/all-in-one:{jaeger_version}"


def test_selectors_match_the_pod_labels_and_the_service_targets_named_ports() -> None:
    """Deployment, PDB and Service select the pod template's labels; targetPorts exist."""
    k8s = _k8s()
    template = k8s["Deployment"]["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert k8s["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert k8s["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert k8s["Service"]["spec"]["selector"].items() <= labels.items()
    names = {port["name"] for port in template["spec"]["containers"][0]["ports"]}
    assert {port["targetPort"] for port in k8s["Service"]["spec"]["ports"]} <= names
    container = template["spec"]["containers"][0]
    assert container["resources"]["requests"]
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True


def _documented_commands(path: Path) -> list[list[str]]:
    """Every ``leaseworker ...`` command in the fenced code blocks of ``path``."""
    commands = []
    in_block = False
    for line in path.read_text().replace("\\\n", " ").splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block and line.strip().startswith("leaseworker "):
            commands.append(shlex.split(line.strip(), comments=True)[1:])
    return commands


@pytest.mark.parametrize("doc", [DOCS, REPO / "README.md"], ids=lambda p: p.name)
def test_documented_commands_parse_and_name_loadable_jobs(doc: Path) -> None:
    """Each `leaseworker` command in the docs' code blocks is accepted by the parser.

    `run` jobs must load when they live in this repository (``examples.`` or
    ``tests.``, or anywhere in docs/operations.md, which must show at least one
    `run`); README examples may name the reader's own module.
    """
    commands = _documented_commands(doc)
    if doc == DOCS:
        assert any(command[0] == "run" for command in commands)
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        if args.command == "run" and (doc == DOCS or args.job.startswith(("examples.", "tests."))):
            load_job_class(args.job)


def test_kustomize_builds_the_base() -> None:
    """`kubectl kustomize deploy/k8s` renders a Deployment, ConfigMap, PDB and Service."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed here: kustomize build not exercised")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
    assert kinds == {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service"}


def test_docker_compose_accepts_the_file() -> None:
    """`docker compose config` validates compose.yaml against the compose schema."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker CLI not installed here")
    plugin = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
    )
    if plugin.returncode != 0:
        pytest.skip("the docker compose plugin is not installed here: compose config not run")
    subprocess.run(
        [docker, "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
        capture_output=True,
        timeout=60,
        check=True,
    )
