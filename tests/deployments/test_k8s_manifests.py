"""`deployments/k8s/` is on paper, so it is checked here: every manifest against the Kubernetes OpenAPI schema
(strict: an unknown or misspelt field fails), offline, with the schemas `kubernetes-validate` ships."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml
from prefect.utilities.templating import apply_values, find_placeholders

from pronk.settings import PROJECT_ROOT, Settings

K8S = PROJECT_ROOT / "deployments" / "k8s"
VERSION = "1.33.0"  # the oldest release still supported upstream when these were written
MANIFESTS = sorted(K8S.glob("*.yaml"))


def documents() -> list[tuple[str, dict]]:
    return [
        (f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
        for path in MANIFESTS
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def by_kind(kind: str) -> dict:
    return next(doc for _, doc in documents() if doc["kind"] == kind)


def test_the_manifests_cover_workers_api_and_settings():
    kinds = sorted(name.split(":")[1] for name, _ in documents())
    assert kinds == [
        "ConfigMap/pronk-settings",
        "Deployment/pronk-api",
        "Secret/pronk-secrets",
        "Service/pronk-api",
        "Service/pronk-workers",
        "StatefulSet/pronk-workers",
    ]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[name for name, _ in documents()])
def test_each_manifest_is_valid_kubernetes(name, doc):
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_a_misspelt_field_fails_validation():
    """The check has teeth: strict validation refuses a field Kubernetes does not know."""
    broken = by_kind("StatefulSet")
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/health"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_engine_workers_request_gpus_probe_health_and_advertise_their_stable_name():
    workers = by_kind("StatefulSet")
    container = workers["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    args = dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])
    assert args["host"] == "0.0.0.0" and int(args["port"]) == port
    service = workers["spec"]["serviceName"]
    assert args["advertise"] == f"http://$(POD_NAME).{service}.$(POD_NAMESPACE).svc:{port}"
    defined = {env["name"] for env in container["env"]}
    assert set(re.findall(r"\$\((\w+)\)", " ".join(container["args"]))) <= defined


def test_every_setting_the_pods_get_is_a_pronk_setting_or_a_prefect_or_aws_one():
    known = {f"PRONK_{name.upper()}" for name in Settings.model_fields}
    for kind in ("ConfigMap", "Secret"):
        doc = by_kind(kind)
        for key in doc.get("data") or doc.get("stringData"):
            assert key in known or key.startswith(("PREFECT_", "AWS_")), f"{kind} sets unknown {key}"
    assert "PRONK_WORKER_TOKEN" in by_kind("Secret")["stringData"]


def base_job_template() -> dict:
    return json.loads((K8S / "base-job-template.json").read_text())


def test_the_work_pool_template_names_only_its_own_variables():
    template = base_job_template()
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used <= set(template["variables"]["properties"])
    assert set(template["job_configuration"]) >= {
        "command",
        "env",
        "labels",
        "name",
        "namespace",
        "job_manifest",
        "cluster_config",
        "job_watch_timeout_seconds",
        "pod_watch_timeout_seconds",
        "stream_output",
    }


def test_the_work_pool_template_renders_a_valid_kubernetes_job():
    """Rendered the way a Prefect worker renders it: variable defaults, plus what Prefect fills in for a run."""
    template = base_job_template()
    values = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    values |= {
        "name": "run-batch-abc123",
        "command": "prefect flow-run execute",
        "env": {"PREFECT__FLOW_RUN_ID": "1b4c0e0e-0000-4000-8000-000000000000"},
        "labels": {"prefect.io/flow-run-id": "1b4c0e0e-0000-4000-8000-000000000000"},
    }
    manifest = apply_values(template["job_configuration"]["job_manifest"], values)
    # The worker turns `env` into a list and `args` into argv before it creates the Job; so does this check.
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]
    container["args"] = container["args"].split()
    # prefect-kubernetes refuses a template without these two Job fields under the pod spec (its own default puts
    # them there); the API server drops them with a warning. They are the only fields strict validation may refuse.
    pod = manifest["spec"]["template"]["spec"]
    assert (pod.pop("parallelism"), pod.pop("completions")) == (1, 1)
    kubernetes_validate.validate(manifest, VERSION, strict=True)
    assert container["envFrom"] == [
        {"configMapRef": {"name": "pronk-settings"}},
        {"secretRef": {"name": "pronk-secrets"}},
    ]
    assert manifest["metadata"]["namespace"] == "pronk" and manifest["spec"]["backoffLimit"] == 0


def test_no_manifest_reaches_for_the_network_to_validate(monkeypatch):
    """The schemas ship with the package: validation works with every socket refused."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network is off in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    for _, doc in documents():
        kubernetes_validate.validate(doc, VERSION, strict=True)
