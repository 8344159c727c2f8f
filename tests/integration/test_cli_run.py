"""`sandfarm run`, `schema` and `doctor` as a user calls them: a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SANDFARM = [sys.executable, "-m", "producer.cli"]


def sandfarm(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SANDFARM, *args], capture_output=True, text=True, input=stdin, timeout=120
    )


def test_run_json_prints_exactly_one_result_and_exits_0_even_on_failure():
    proc = sandfarm("run", "--backend", "process", "--command", "echo hi; exit 3", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)  # exactly one JSON document
    assert document["status"] == "failed"
    assert document["steps"][0]["stdout"] == "hi\n"
    assert document["steps"][0]["exit_code"] == 3


def test_run_code_with_limits():
    proc = sandfarm("run", "--code", "while True: pass", "--timeout", "1", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["status"] == "timed_out"


def test_run_job_file(tmp_path: Path):
    job = {
        "steps": [
            {"kind": "write_file", "path": "a.txt", "content": "x"},
            {"kind": "bash", "command": "cat a.txt"},
        ],
        "collect": ["a.txt"],
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    document = json.loads(sandfarm("run", "--job", str(path), "--json").stdout)
    assert document["status"] == "succeeded"
    assert document["files"][0]["content"] == "x"


def test_invalid_input_exits_2_with_one_line_naming_the_field(tmp_path: Path):
    proc = sandfarm("run", "--code", "1", "--timeout", "-5")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "limits.timeout_s" in proc.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"steps": [{"kind": "nope"}]}))
    proc = sandfarm("run", "--job", str(bad))
    assert proc.returncode == 2 and "steps.0" in proc.stderr and "Traceback" not in proc.stderr
    proc = sandfarm("run", "--job", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert sandfarm("run").returncode == 2


def test_schema_and_doctor():
    schema = json.loads(sandfarm("schema").stdout)
    assert "steps" in schema["properties"]
    doctor = json.loads(sandfarm("doctor", "--json").stdout)
    names = {item["name"] for item in doctor["process"]}
    assert {"uid_isolation", "network_isolation", "tree_kill", "rlimits"} <= names


def test_doctor_warns_of_a_redis_without_password(tmp_path: Path) -> None:
    import os
    import shutil

    from tests.conftest import require
    from tests.gatewaykit import free_port

    require(shutil.which("redis-server") is not None, "redis-server is not installed")
    port = free_port()
    env = {**os.environ, "SANDFARM_REDIS_PASSWORD": "s3cret-pw"}
    subprocess.run(["ops/start_redis.sh", str(port), str(tmp_path / "redis")], env=env, check=True)
    try:
        # the attack's precondition: an open Redis answers anyone (the suite's own)
        url = os.environ.get("SANDFARM_REDIS_URL", "redis://127.0.0.1:6379/0")

        def farm_row(redis_url: str) -> dict:
            run = subprocess.run(
                [*SANDFARM, "doctor", "--json"],
                env={**os.environ, "SANDFARM_REDIS_URL": redis_url},
                capture_output=True,
                text=True,
                timeout=120,
            )
            return json.loads(run.stdout)["farm"][0]

        row = farm_row(url)
        assert row["active"] is False and "without a password" in row["detail"]
        locked = farm_row(f"redis://:s3cret-pw@127.0.0.1:{port}/0")
        assert locked["active"] is True and "s3cret-pw" not in locked["detail"]
        # the password is in no process's command line
        procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "s3cret-pw" not in procs
    finally:
        subprocess.run(
            ["redis-cli", "-p", str(port), "-a", "s3cret-pw", "--no-auth-warning", "shutdown",
             "nosave"],
            capture_output=True,
        )  # fmt: skip
