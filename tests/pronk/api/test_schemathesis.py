"""schemathesis against the API's own OpenAPI schema, in-process: whatever it sends, the API never answers 5xx."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from pronk.api.app import create_app
from pronk.api.keys import ApiKeyStore
from pronk.settings import Settings
from tests.pronk.api.test_routes import RecordingRuns

ROOT = Path(tempfile.mkdtemp(prefix="pronk-schemathesis-"))
SETTINGS = Settings(
    data_dir=ROOT,
    storage_uri=str(ROOT / "store"),
    s3_endpoint_url=None,
    api_auth=True,
    weights_root=ROOT / "weights",
    reconcile_interval_s=0,
)
APP = create_app(SETTINGS, runs=RecordingRuns())
KEY = ApiKeyStore(SETTINGS).create(admin=True)[0]
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_no_request_gets_a_5xx(case):
    response = case.call(headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
