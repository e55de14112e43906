"""The values files for Prefect's official Helm charts (`deployments/k8s/helm/`), checked offline: every key they
set is one the pinned chart version has, and they agree with pronk's own files (the Secret holding the database
URL, the tuned server, the work pool of deployments/prefect.yaml, the Prefect pin, the Service the pods call)."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest
import yaml

from pronk.settings import PROJECT_ROOT
from pronk.stack.prefect_env import TUNED_SERVER
from pronk.stack.prefect_yaml import prefect_yaml

K8S = PROJECT_ROOT / "deployments" / "k8s"
HELM = K8S / "helm"
DOCS = [PROJECT_ROOT / "docs" / "scaling-out.md", PROJECT_ROOT / "README.md"]
CHART_VERSION = "2026.8.18172642"
# The keys these values set, with their types, as charts/<chart>/values.yaml and values.schema.json of
# PrefectHQ/prefect-helm at tag CHART_VERSION define them. Both schemas allow unknown keys, so Helm would
# ignore a misspelt one; this list does not.
CHART_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "prefect-server": {
        "global.prefect.image.repository": str,
        "global.prefect.image.prefectTag": str,
        "server.env": list,
        "postgresql.enabled": bool,
        "externalDatabase.existingSecret": str,
        "externalDatabase.connectionStringSecretKey": str,
    },
    "prefect-worker": {
        "worker.image.repository": str,
        "worker.image.prefectTag": str,
        "worker.config.workPool": str,
        "worker.config.type": str,
        "worker.config.baseJobTemplate.configuration": (str, dict, type(None)),
        "worker.apiConfig": str,
        "worker.selfHostedServerApiConfig.apiUrl": str,
    },
}
# Defaults of the prefect-server chart that pronk's settings rely on: its Service is `prefect-server`, port 4200.
SERVER_SERVICE = "prefect-server"
SERVER_PORT = 4200
TEMPLATE_FLAG = "--set-file worker.config.baseJobTemplate.configuration=deployments/k8s/base-job-template.json"


def values(chart: str) -> dict[str, Any]:
    return yaml.safe_load((HELM / f"{chart}.yaml").read_text())


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key → value of every leaf; a list is a leaf, as Helm replaces lists whole."""
    found: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found |= leaves(value, f"{prefix}{key}.")
        else:
            found[f"{prefix}{key}"] = value
    return found


def unknown_keys(tree: dict[str, Any], chart: str) -> list[str]:
    known = CHART_KEYS[chart]
    return [key for key, value in leaves(tree).items() if key not in known or not isinstance(value, known[key])]


def settings_docs() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((K8S / "settings.yaml").read_text()) if doc}


def shell_commands(text: str) -> list[str]:
    """The lines of a text with backslash continuations joined and comment markers dropped."""
    lines = [re.sub(r"^#\s*", "", line).strip() for line in text.splitlines()]
    return re.sub(r"\\\n\s*", "", "\n".join(lines)).splitlines()


def prefect_pin() -> str:
    dependencies = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(dep.split("==")[1] for dep in dependencies if dep.startswith("prefect=="))


@pytest.mark.parametrize("chart", CHART_KEYS)
def test_every_key_set_is_one_the_pinned_chart_has(chart):
    assert unknown_keys(values(chart), chart) == []
    assert f"chart version {CHART_VERSION}" in (HELM / f"{chart}.yaml").read_text()


def test_a_misspelt_or_mistyped_key_is_caught():
    assert unknown_keys({"worker": {"config": {"workpool": "pronk"}}}, "prefect-worker") == ["worker.config.workpool"]
    assert unknown_keys({"postgresql": {"enabled": "false"}}, "prefect-server") == ["postgresql.enabled"]


def test_the_server_uses_the_external_postgresql_from_pronks_secret():
    server = values("prefect-server")
    assert server["postgresql"]["enabled"] is False
    secret = settings_docs()["Secret"]
    database = server["externalDatabase"]
    assert database["existingSecret"] == secret["metadata"]["name"]
    assert secret["stringData"][database["connectionStringSecretKey"]].startswith("postgresql+asyncpg://")


def test_the_server_is_tuned_as_the_embedded_one():
    env = {item["name"]: item["value"] for item in values("prefect-server")["server"]["env"]}
    assert env == TUNED_SERVER


def test_the_worker_serves_the_work_pool_every_deployment_names():
    worker = values("prefect-worker")["worker"]
    pools = {deployment["work_pool"]["name"] for deployment in prefect_yaml()["deployments"]}
    assert pools == {worker["config"]["workPool"]}
    assert worker["config"]["type"] == "kubernetes"


def test_server_worker_and_pods_run_and_call_one_prefect():
    pin = prefect_pin()
    assert prefect_yaml()["prefect-version"] == pin
    server, worker = values("prefect-server"), values("prefect-worker")
    assert server["global"]["prefect"]["image"]["prefectTag"] == f"{pin}-python3.11"
    assert worker["worker"]["image"]["prefectTag"] == f"{pin}-python3.11-kubernetes"
    url = f"http://{SERVER_SERVICE}:{SERVER_PORT}/api"
    assert worker["worker"]["selfHostedServerApiConfig"]["apiUrl"] == url
    assert settings_docs()["ConfigMap"]["data"]["PREFECT_API_URL"] == url


@pytest.mark.parametrize("chart", CHART_KEYS)
def test_the_docs_and_the_values_file_install_the_pinned_chart_with_it(chart):
    for text in [path.read_text() for path in DOCS] + [(HELM / f"{chart}.yaml").read_text()]:
        (install,) = [line for line in shell_commands(text) if line.startswith(f"helm install {chart} ")]
        assert f"prefect/{chart} --version {CHART_VERSION} " in install
        assert f"-f deployments/k8s/helm/{chart}.yaml" in install
        if chart == "prefect-worker":
            # pronk's base job template reaches the pool through the chart, as a file.
            assert TEMPLATE_FLAG in install
            assert (PROJECT_ROOT / TEMPLATE_FLAG.rsplit("=", 1)[1]).exists()
