"""The farm end to end with workers on the bwrap and docker backends, and a docker
worker killed mid-job: its container is reaped and the job redelivered."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from sandbox_core import Status
from tests.conftest import require
from tests.farmkit import Farm, collect_once, farm_db, wait_for  # noqa: F401
from tests.integration.test_farm import mixed_jobs
from tests.security.conftest import docker_status

pytestmark = pytest.mark.timeout(300)


def _farm_on(backend: str, farm_db: str, tmp, is_root: bool, **env: str) -> Farm:  # noqa: F811
    require(is_root, "the farm's sandbox slots need root (per-slot uids)")
    if backend == "docker":
        ok, reason = docker_status()
        require(ok, reason)
    farm = Farm(farm_db, tmp)
    extra = {"SANDFARM_DEFAULT_BACKEND": backend, **env}
    farm.start_worker(f"{backend}-a", 1, wait=False, **extra)
    farm.start_worker(f"{backend}-b", 1, wait=False, **extra)
    for worker in farm.workers:
        worker.wait_ready()
    return farm


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_mixed_batch_on_backend(backend, farm_db, tmp_path, is_root):  # noqa: F811
    farm = _farm_on(backend, farm_db, tmp_path, is_root, SANDFARM_DOCKER_WARM_POOL="1")
    try:
        jobs = mixed_jobs(f"{backend}-{uuid.uuid4().hex[:6]}")
        with farm.client() as client:
            ids = client.submit_many([spec for spec, _, _ in jobs])
            results = collect_once(client, ids, 240, farm)
        for (_, status, check), job_id in zip(jobs, ids, strict=True):
            result = results[job_id]
            assert result.backend == backend
            assert result.status == status, (job_id, result.model_dump_json()[:1500])
            assert check(result), (job_id, result.model_dump_json()[:1500])
        assert {r.worker for r in results.values()} == {w.name for w in farm.workers}
    finally:
        farm.stop()


def test_docker_worker_killed_mid_job(farm_db, tmp_path, is_root):  # noqa: F811
    import docker

    farm = _farm_on(
        "docker",
        farm_db,
        tmp_path,
        is_root,
        SANDFARM_VISIBILITY_TIMEOUT_S="8",
        SANDFARM_REAPER_INTERVAL_S="1",
        SANDFARM_DOCKER_WARM_POOL="0",
    )
    engine = docker.from_env()
    try:
        job_id = f"dk-{uuid.uuid4().hex[:8]}"
        with farm.client() as client:
            client.submit({"id": job_id, "command": "sleep 4; echo finished"})
            running = wait_for(lambda: farm.running_info(client, job_id), timeout=60)
            owner = next(w for w in farm.workers if w.name == running["worker"])
            label = {"label": [f"sandfarm.job={job_id}"]}
            wait_for(lambda: engine.api.containers(filters=label), timeout=30, what="container")
            os.killpg(owner.proc.pid, signal.SIGKILL)  # main process and pool children
            owner.proc.wait()
            # Gone within a reaper interval or two (1 s here): its owner, the killed pool
            # process, is dead even while it is a zombie nobody waits for.
            wait_for(
                lambda: (
                    not any(
                        c["Labels"].get("sandfarm.worker") == owner.name
                        for c in engine.api.containers(all=True, filters=label)
                    )
                ),
                timeout=10,
                what="the dead worker's container to be reaped",
            )
            result = client.result(job_id, timeout=120)
        assert result is not None, farm.logs()
        assert result.status == Status.SUCCEEDED, result
        assert result.steps[0].stdout == "finished\n"
        assert result.attempts == 2
        assert result.worker != owner.name
        time.sleep(1)
        assert engine.api.containers(all=True, filters={"label": [f"sandfarm.job={job_id}"]}) == []
    finally:
        farm.stop()


def test_docker_ptys_live_under_the_configured_workspace_base(tmp_path, is_root) -> None:
    """SANDFARM_WORKSPACE_DIR moves the workspaces, and with them the docker backend's
    devpts instances: the process backend hides that whole tree from its jobs (it once
    stayed under the default base, visible in a process job's mountinfo)."""
    import threading
    from pathlib import Path

    from producer.protocol import Settings
    from sandbox_core import get_backend, parse_spec

    require(is_root, "the containers' devpts instances are mounted as root")
    ok, reason = docker_status()
    require(ok, reason)
    base = tmp_path / "work"
    config = Settings(workspace_dir=base).backend_config("docker")
    assert config.workspace_dir == base  # type: ignore[union-attr]
    backend = get_backend(config)
    seen: list[str] = []

    def look() -> None:
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            seen.extend(
                line.split()[4]
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if " - devpts " in line and line.split()[4].startswith(str(base))
            )
            time.sleep(0.05)

    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        result = backend.run(parse_spec({"command": "sleep 2; echo ran", "backend": "docker"}))
    finally:
        watcher.join()
        backend.close()
    assert result.status == Status.SUCCEEDED and result.steps[0].stdout == "ran\n", result
    assert seen and seen[0].startswith(f"{base}/docker-pts/pts-"), seen
