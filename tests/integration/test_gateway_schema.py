"""Schemathesis against the gateway's own OpenAPI document, over HTTP, with a real worker
running what it generates: no 5xx, and every response (status, content type, headers,
body) matches the document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.farmkit import farm_db, make_farm  # noqa: F401
from tests.gatewaykit import tenant_farm  # noqa: F401

pytestmark = pytest.mark.timeout(600)
SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_headers_conformance,response_schema_conformance"
)


def test_gateway_matches_its_openapi_document(tenant_farm, tmp_path: Path) -> None:  # noqa: F811
    tf = tenant_farm()
    tf.farm.start_worker("schema", 1)
    gateway = tf.start_gateway()
    # Small caps, so generated jobs are refused (422) or finish quickly.
    key = tf.tenant("fuzz", caps={"timeout_s": 3, "memory_mb": 256, "cpu_s": 3})
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    assert "JobSpec" in document["components"]["schemas"]
    assert "JobResult" in document["components"]["schemas"]
    report = tmp_path / "report.ndjson"
    run = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{gateway.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {key}",
            "--checks",
            CHECKS,
            "--max-examples",
            "15",
            "--phases",
            "examples,coverage,fuzzing",
            "--generation-database",
            "none",
            "--seed",
            "1",
            "--workers",
            "2",
            "--request-timeout",
            "90",
            "--no-color",
            "--report",
            "ndjson",
            "--report-ndjson-path",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    output = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, output
    # The fuzzing really ran: every operation was called, and jobs were accepted
    statuses: dict[str, set[int]] = {}
    for line in report.read_text().splitlines():
        for label, status in _responses(json.loads(line)):
            statuses.setdefault(label, set()).add(status)
    assert len(statuses) >= 10, statuses
    for operation in ("POST /v1/jobs", "POST /v1/jobs/batch"):
        assert {202, 422} <= statuses.get(operation, set()), statuses
    assert gateway.proc.poll() is None  # the gateway survived it


def _responses(event: dict) -> list[tuple[str, int]]:
    """(operation, status code) of each response a finished scenario recorded."""
    scenario = event.get("ScenarioFinished")
    if not scenario:
        return []
    recorder = scenario["recorder"]
    return [
        (recorder["label"], interaction["response"]["status_code"])
        for interaction in recorder.get("interactions", {}).values()
        if interaction.get("response")
    ]
