"""Scale out, proven on one machine: four hosts as network namespaces on a bridge (10.231.0.0/24).

A (10.231.0.1) runs moto's S3 server, PostgreSQL (the Prefect server's database and the worker registry),
the Prefect server and the API; B and C run one engine worker each, bound to their own address and serving
HTTPS there with a certificate for both addresses from a throwaway CA; D runs the Prefect process work pool
worker that runs the `run-batch` and `leap` flow runs. Every request between hosts crosses the bridge, and every
request to a worker carries the shared token over TLS, verified against that CA. A Leap through the API switches
the workers of B and C; a batch made through the API on A runs on both; cutting C's link while the batch runs
moves C's steps to B, with every input line answered exactly once. Skipped where the machine cannot make
namespaces (not root, no `ip`).

Workers announce themselves to PostgreSQL on A over the bridge, so a cut host's heartbeats stop. The hosts
share a disk, so the model registry (MLflow on SQLite) is a shared file here.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from pronk.engine.client import WorkerClient
from pronk.engine.tls import verify_context
from pronk.settings import PROJECT_ROOT, Settings
from pronk.stack.embedded import WORK_POOL
from pronk.stack.postgres import PREFECT_ON_POSTGRES, PostgresError, find_binaries
from pronk.stack.prefect_env import RUN_PAGE_LOGGING, TUNED_SERVER
from pronk.stack.prefect_yaml import write_prefect_yaml
from pronk.stack.processes import wait_healthy
from tests.netns import Hosts, unavailable
from tests.tls_certs import issue, make_ca

pytestmark = pytest.mark.e2e

JOB = "job-c0ffee01"
MODEL = "pronk-tiny"
LINES = 24
PORTS = {"s3": 9000, "prefect": 4200, "api": 8000, "worker": 8100}
PYTHON = sys.executable
CLI = [PYTHON, "-c", "from pronk.cli.main import main; main()"]


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable()
    if reason:
        pytest.skip(f"cannot make hosts as network namespaces: {reason}")
    made = Hosts(["a", "b", "c", "d"])
    try:
        yield made
    finally:
        made.close()


def environment(hosts: Hosts, data_dir: Path) -> dict[str, str]:
    """What every host's processes are told: where Prefect, the store and the registry are, and the token."""
    a = hosts.address["a"]
    env = {
        "PRONK_DATA_DIR": str(data_dir),
        "PRONK_PROJECT_ROOT": str(PROJECT_ROOT),
        "PRONK_WORKER_TOKEN": "net-test-token",
        "PRONK_API_AUTH": "false",
        "PRONK_API_PORT": str(PORTS["api"]),
        "PRONK_STORAGE_URI": "s3://pronk-net/store",
        "PRONK_S3_ENDPOINT_URL": f"http://{a}:{PORTS['s3']}",
        "PRONK_RECONCILE_INTERVAL_S": "0",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PREFECT_HOME": str(data_dir / "prefect"),
        "PREFECT_API_URL": f"http://{a}:{PORTS['prefect']}/api",
        "PREFECT_SERVER_API_HOST": a,
        "PREFECT_SERVER_API_PORT": str(PORTS["prefect"]),
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "NO_PROXY": "*",
        **RUN_PAGE_LOGGING,
        **TUNED_SERVER,
    }
    return env


def make_bucket(endpoint: str) -> None:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket="pronk-net")


def start_postgres(hosts: Hosts, env: dict[str, str]) -> dict[str, str]:
    """PostgreSQL on A, listening on A's address, started by the stack's own starter; the URLs of its databases."""
    script = (
        "import json; from pronk.settings import get_settings; from pronk.stack.postgres import start_postgres; "
        "state = {}; server = start_postgres(get_settings(), state); print(json.dumps({'pid': state['postgres'], "
        "'registry': server.url('pronk'), 'prefect': server.url('prefect', 'postgresql+asyncpg')}))"
    )
    env = {**env, "PRONK_POSTGRES_HOST": hosts.address["a"]}
    started = json.loads(ok(hosts.run("a", [PYTHON, "-c", script], env, cwd=PROJECT_ROOT)).splitlines()[-1])
    hosts.pids.append(started["pid"])
    urls = {"PRONK_REGISTRY_URL": started["registry"], "PREFECT_API_DATABASE_CONNECTION_URL": started["prefect"]}
    return {**urls, **PREFECT_ON_POSTGRES}


def ok(done) -> str:
    assert done.returncode == 0, f"{done.args}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def data_dir():
    """Under /tmp itself: PostgreSQL runs as its own user, and pytest's tmp folders let no other user through."""
    made = Path(tempfile.mkdtemp(prefix="pronk-scale-out-"))
    try:
        find_binaries(Settings(data_dir=made))
    except PostgresError as exc:
        shutil.rmtree(made, ignore_errors=True)
        pytest.skip(f"no PostgreSQL binaries for host A: {exc}")
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(data_dir, hosts):
    """The four hosts' processes up (stopped before their data dir goes); yields what the tests need."""
    logs = data_dir / "logs"
    env = environment(hosts, data_dir)
    a, b, c = (hosts.address[h] for h in "abc")
    ca = make_ca(data_dir / "tls", "pronk-test-ca")
    cert, key = issue(ca, data_dir / "tls", "workers", [b, c])
    env["PRONK_WORKER_TLS_CA"] = str(ca.bundle)  # every caller of the workers trusts it: the API, flow runs on D

    env |= start_postgres(hosts, env)
    s3 = hosts.spawn("a", [PYTHON, "-m", "moto.server", "-H", a, "-p", str(PORTS["s3"])], logs / "s3.log", env)
    prefect = hosts.spawn(
        "a",
        [PYTHON, "-m", "prefect", "server", "start", "--host", a, "--port", str(PORTS["prefect"])],
        logs / "prefect-server.log",
        env,
    )
    ok(hosts.run("a", [*CLI, "model", "make-tiny"], env, cwd=PROJECT_ROOT))
    workers = {}  # they load the model (the longest start) while the rest starts
    tls = {"PRONK_WORKER_TLS_CERT": str(cert), "PRONK_WORKER_TLS_KEY": str(key)}
    for host, index in (("b", 0), ("c", 1)):
        argv = [PYTHON, "-m", "pronk.stack.worker", "--job", JOB, "--index", str(index), "--host", hosts.address[host]]
        argv += ["--port", str(PORTS["worker"])]  # it advertises https://ADDRESS:PORT, as it serves TLS
        workers[host] = hosts.spawn(host, argv, logs / f"worker-{host}.log", env | tls, cwd=PROJECT_ROOT)
    v2 = json.loads(ok(hosts.run("a", [*CLI, "model", "finetune-tiny"], env, cwd=PROJECT_ROOT)).splitlines()[-1])
    hosts.call("a", lambda: wait_healthy(f"http://{a}:{PORTS['s3']}/", "moto S3", s3, logs / "s3.log"))
    hosts.call("a", lambda: make_bucket(f"http://{a}:{PORTS['s3']}"))
    hosts.call(
        "a",
        lambda: wait_healthy(f"http://{a}:{PORTS['prefect']}/api/health", "Prefect", prefect, logs / "prefect.log"),
    )

    project = write_prefect_yaml(data_dir / "prefect.yaml")
    ok(hosts.run("d", [PYTHON, "-m", "prefect", "work-pool", "create", WORK_POOL, "--type", "process"], env))
    deploy = [PYTHON, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", str(project)]
    ok(hosts.run("d", deploy, env, cwd=PROJECT_ROOT))
    worker = [PYTHON, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process"]
    hosts.spawn("d", worker, logs / "prefect-worker.log", env, cwd=PROJECT_ROOT)
    api_argv = [PYTHON, "-m", "uvicorn", "pronk.api.app:from_environment", "--factory", "--host", a]
    api = hosts.spawn("a", [*api_argv, "--port", str(PORTS["api"])], logs / "api.log", env, cwd=PROJECT_ROOT)
    base = f"http://{a}:{PORTS['api']}/v1"
    hosts.call("a", lambda: wait_healthy(f"http://{a}:{PORTS['api']}/health", "pronk API", api, logs / "api.log"))
    for host in ("b", "c"):
        url = f"https://{hosts.address[host]}:{PORTS['worker']}/health"
        hosts.call(
            "d", lambda url=url, host=host: wait_healthy(url, f"worker on {host}", workers[host], logs, 300, ca.bundle)
        )
    yield {"env": env, "api": base, "v2": v2["version"], "data_dir": data_dir, "addresses": (a, b, c), "ca": ca.bundle}


def api(hosts: Hosts, host: str, method: str, url: str, **kwargs) -> httpx.Response:
    return hosts.call(host, lambda: httpx.request(method, url, timeout=60, **kwargs))


def job_status(hosts: Hosts, cluster) -> dict:
    response = api(hosts, "d", "GET", f"{cluster['api']}/weights/status", params={"job_id": JOB})
    (job,) = response.json()["data"]
    return job


def test_workers_on_their_own_hosts_refuse_callers_without_the_token(hosts, cluster):
    _, b, c = cluster["addresses"]
    verify = verify_context(cluster["ca"])
    for address in (b, c):
        url = f"https://{address}:{PORTS['worker']}"
        assert api(hosts, "d", "GET", f"{url}/stats", verify=verify).status_code == 401
        assert api(hosts, "d", "GET", f"{url}/health", verify=verify).json() == {"status": "ok"}
        token = {"authorization": f"Bearer {cluster['env']['PRONK_WORKER_TOKEN']}"}
        assert api(hosts, "d", "GET", f"{url}/stats", headers=token, verify=verify).status_code == 200


def test_workers_serve_https_that_only_their_ca_vouches_for(hosts, cluster, tmp_path):
    _, b, c = cluster["addresses"]
    status = ok(hosts.run("d", [*CLI, "stack", "status"], cluster["env"], cwd=PROJECT_ROOT))
    assert f"{JOB}-w0 https://{b}:{PORTS['worker']} " in " ".join(status.split()), status
    assert f"{JOB}-w1 https://{c}:{PORTS['worker']} " in " ".join(status.split()), status
    stranger = make_ca(tmp_path, "another-ca").bundle
    token = cluster["env"]["PRONK_WORKER_TOKEN"]

    async def stats(url: str, ca_file: Path):
        client = WorkerClient(token, ca_file=ca_file)
        try:
            return await client.stats(url)
        finally:
            await client.aclose()

    for index, address in enumerate((b, c)):
        url = f"https://{address}:{PORTS['worker']}"
        assert hosts.call("d", lambda url=url: asyncio.run(stats(url, cluster["ca"]))).worker_id == f"{JOB}-w{index}"
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            hosts.call("d", lambda url=url: asyncio.run(stats(url, stranger)))
        with pytest.raises(httpx.TransportError):
            api(hosts, "d", "GET", f"http://{address}:{PORTS['worker']}/health")


def test_a_leap_from_the_api_switches_the_workers_of_both_hosts(hosts, cluster):
    target = f"{MODEL}/{cluster['v2']}"
    started = api(hosts, "a", "POST", f"{cluster['api']}/weights/reload", json={MODEL: f"models:/{target}"})
    assert started.status_code == 202, started.text
    (leap,) = started.json()["data"]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        job = job_status(hosts, cluster)
        latest = job["latest_leap"]
        if latest and latest["id"] == leap["leap_id"] and latest["status"] not in ("queued", "staging", "reloading"):
            break
        time.sleep(1)
    assert latest["status"] == "completed", latest
    assert sorted((w["worker_id"], w["model_version"]) for w in job["workers"]) == [
        (f"{JOB}-w0", target),
        (f"{JOB}-w1", target),
    ]


def request_lines() -> bytes:
    rows = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"story {i}"}], "max_tokens": 400},
        }
        for i in range(LINES)
    ]
    return "\n".join(json.dumps(r) for r in rows).encode()


def test_a_batch_from_the_api_runs_on_both_hosts_and_survives_losing_one(hosts, cluster):
    base = cluster["api"]
    uploaded = api(
        hosts, "a", "POST", f"{base}/files", files={"file": ("in.jsonl", request_lines())}, data={"purpose": "batch"}
    )
    assert uploaded.status_code == 200, uploaded.text
    body = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    created = api(hosts, "a", "POST", f"{base}/batches", json={**body, "job_id": JOB})
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    c = cluster["addresses"][2]

    def busy_on_c() -> dict:
        """The batch, once both workers are serving its steps (C's in flight, seen by asking C itself)."""
        token = {"authorization": f"Bearer {cluster['env']['PRONK_WORKER_TOKEN']}"}
        verify = verify_context(cluster["ca"])
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            batch = httpx.get(f"{base}/batches/{batch_id}", timeout=10).json()
            stats = httpx.get(f"https://{c}:{PORTS['worker']}/stats", headers=token, timeout=10, verify=verify).json()
            if batch["status"] == "in_progress" and stats["in_flight"] > 0:
                return batch
            assert batch["status"] in ("validating", "in_progress"), batch
            time.sleep(0.2)
        raise AssertionError(f"batch {batch_id} never had steps on C")

    at_cut = hosts.call("d", busy_on_c)
    hosts.cut("c")
    assert at_cut["status"] == "in_progress" and at_cut["request_counts"]["completed"] < LINES, at_cut

    def finished() -> dict:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            batch = httpx.get(f"{base}/batches/{batch_id}", timeout=10).json()
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return batch
            time.sleep(1)
        raise AssertionError(f"batch {batch_id} not done: {batch}")

    batch = hosts.call("a", finished)
    assert batch["status"] == "completed", batch

    def lines(file_id: str | None) -> list[dict]:
        if not file_id:
            return []
        text = hosts.call("a", lambda: httpx.get(f"{base}/files/{file_id}/content", timeout=30).text)
        return [json.loads(line) for line in text.splitlines()]

    outputs, errors = lines(batch["output_file_id"]), lines(batch.get("error_file_id"))
    ids = [line["custom_id"] for line in outputs + errors]
    assert len(ids) == LINES and set(ids) == {f"line-{i}" for i in range(LINES)}, ids
    assert errors == [] and batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0, "cancelled": 0}
    # C held steps when it was cut: B finished those lines (C may have finished some before the cut).
    served = {line["response"]["body"]["pronk"]["worker_id"] for line in outputs}
    assert f"{JOB}-w0" in served and served <= {f"{JOB}-w0", f"{JOB}-w1"}, served
    versions = {line["response"]["body"]["pronk"]["model_version"] for line in outputs}
    assert versions == {f"{MODEL}/{cluster['v2']}"}
