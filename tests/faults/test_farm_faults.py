"""Faults: killed pool processes, killed workers, a restarted Redis, poison jobs, leftovers.

Every test runs real `sandfarm worker` processes with a short visibility timeout and a
fast reaper, kills something for real, and checks that each job ends with exactly one
result.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import redis

from producer.protocol import KOMBU_UNACKED_INDEX
from sandbox_core import Status
from sandbox_core.sweep import pids_of_uid
from tests.conftest import job_shared_dir
from tests.farmkit import (  # noqa: F401
    Farm,
    Worker,
    alive,
    collect_once,
    farm_db,
    make_farm,
    wait_for,
)
from tests.rediskit import private_redis

pytestmark = pytest.mark.timeout(120)

FAST = {
    "SANDFARM_VISIBILITY_TIMEOUT_S": "6",  # a dead worker's jobs come back after ~6-8 s
    "SANDFARM_REAPER_INTERVAL_S": "1",
}


def shared_dir() -> Path:
    """A directory every slot uid may write to: jobs count their own executions there."""
    path = job_shared_dir("sandfarm-fault-")
    path.chmod(0o777)
    return path


def running(client, job_id: str) -> dict | None:
    import json

    raw = client.redis.get(client.keys.running(client.jobs.qid(job_id)))
    return json.loads(raw) if raw else None


def test_pool_process_killed_mid_job_runs_again_one_result(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(**{**FAST, "SANDFARM_VISIBILITY_TIMEOUT_S": "30"})
    worker = farm.start_worker("pk", 1)
    marks = shared_dir()
    try:
        with farm.client() as client:
            job_id = client.submit(
                {"command": f"echo start >> {marks}/runs; sleep 2; echo done", "labels": {"f": "1"}}
            )
            info = wait_for(lambda: running(client, job_id), 20, what="job running")
            assert info["pid"] in worker.pool_pids()
            time.sleep(0.3)  # mid-job
            killed_at = time.monotonic()
            os.kill(info["pid"], signal.SIGKILL)
            result = client.result(job_id, timeout=40)
            assert result is not None, farm.logs()
            assert result.status == Status.SUCCEEDED
            assert result.steps[0].stdout == "done\n"
            assert result.attempts == 2
            # task_reject_on_worker_lost requeues at once: no visibility timeout (30 s) wait.
            assert time.monotonic() - killed_at < 20
            assert (marks / "runs").read_text() == "start\nstart\n"
            assert len(list(client.redis.scan_iter(client.keys.result("*")))) == 1
            assert client.status()["duplicates"] == 0
            assert worker.proc.poll() is None  # the worker itself lives on
    finally:
        shutil.rmtree(marks, ignore_errors=True)


def test_whole_worker_killed_mid_batch_every_job_completes(make_farm) -> None:  # noqa: F811
    farm: Farm = make_farm(**FAST)
    victim = farm.start_worker("victim", 2, wait=False)
    survivor = farm.start_worker("survivor", 2, wait=False)
    victim.wait_ready()
    survivor.wait_ready()
    with farm.client() as client:
        ids = client.submit_many([{"command": f"sleep 1; echo {i}"} for i in range(16)])

        def victim_busy() -> bool:
            infos = [running(client, i) for i in ids]
            return any(i and i["worker"] == victim.name for i in infos)

        wait_for(victim_busy, 20, what="the victim running a job")
        victim.kill_all()
        assert not alive(victim.pid)
        results = collect_once(client, ids, 60, farm)
        for i, job_id in enumerate(ids):
            assert results[job_id].status == Status.SUCCEEDED
            assert results[job_id].steps[0].stdout == f"{i}\n"
        assert any(r.attempts == 2 for r in results.values())  # the victim's, redelivered
        assert all(r.worker == survivor.name for r in results.values() if r.attempts == 2)
        assert len(list(client.redis.scan_iter(client.keys.result("*"), count=1000))) == 16
        assert client.status()["duplicates"] == 0


def test_redis_restarted_mid_batch_loses_no_queued_job(make_farm, tmp_path: Path) -> None:  # noqa: F811
    with private_redis(tmp_path) as server:
        farm: Farm = make_farm(SANDFARM_REDIS_URL=server.url, **FAST)
        farm.env["SANDFARM_REDIS_URL"] = server.url
        farm.start_worker("rr", 2)
        with farm.client() as client:
            ids = client.submit_many([{"command": f"sleep 0.2; echo {i}"} for i in range(30)])
            wait_for(lambda: len(client.results(ids)) >= 4, 30, what="some jobs done")
            server.kill()  # SIGKILL: only what the AOF has survives
            assert client.redis.connection_pool  # the client retries across the gap
            time.sleep(1.0)
            server.start()
            results = collect_once(client, ids, 90, farm)
            for i, job_id in enumerate(ids):
                assert results[job_id].status == Status.SUCCEEDED
                assert results[job_id].steps[0].stdout == f"{i}\n"


def test_channel_closed_after_broker_loss_is_a_connection_error(tmp_path: Path) -> None:
    """Why the test above once failed: the worker exited ("Unrecoverable error:
    AttributeError ... 'hostname'") when kombu closed its channel a second time after
    the broker went away (worker/kombu_fixes.py). Real kombu, real Redis: a message
    delivered and not acked, the broker killed, the channel left as the failed first
    close leaves it; the second close must fail as a connection error (which Celery's
    cleanup ignores before it reconnects), not as a crash."""
    from kombu import Connection
    from kombu.common import ignore_errors
    from kombu.transport import redis as kombu_redis

    import worker.app  # noqa: F401  (the worker applies the fix at import)
    from worker import kombu_fixes

    assert kombu_redis.Channel._connparams is kombu_fixes._connparams
    with private_redis(tmp_path) as server:
        conn = Connection(server.url)
        queue = conn.SimpleQueue("kombu-close")
        queue.put({"job": 1})
        queue.get(timeout=5)  # delivered, not acked: the close will try to restore it
        channel = queue.channel
        assert len(channel.qos._delivered) == 1
        server.kill()
        channel._disconnect_pools()  # what the first close did before it failed
        conn._do_close_transport()  # and what collect() did after it
        with pytest.raises(AttributeError, match="hostname"):  # kombu's own path crashes
            kombu_fixes._original_connparams(channel)
        with pytest.raises(redis.ConnectionError):
            channel._connparams()
        ignore_errors(conn, channel.close)  # Celery's cleanup: ignored, no crash
        assert channel.closed


def test_job_killing_its_worker_every_time_ends_error(make_farm) -> None:  # noqa: F811
    """A job cannot signal its worker (another uid, by design), so the test plays the
    job's part: it SIGKILLs the pool process each time the job starts, as an OOM kill
    of the worker or a sandbox escape that crashes it would."""
    farm: Farm = make_farm(SANDFARM_MAX_ATTEMPTS="2", **FAST)
    worker = farm.start_worker("poison", 1)
    with farm.client() as client:
        job_id = client.submit({"command": "sleep 30", "limits": {"timeout_s": 60}})
        killed: list[int] = []
        deadline = time.monotonic() + 60
        while client.result(job_id) is None:
            assert time.monotonic() < deadline, farm.logs()
            info = running(client, job_id)
            # the attempt after the last allowed one runs no job (it stores the error at
            # once, from the same running record): killing it too would be a third kill
            if info and info["pid"] not in killed and len(killed) < 2:
                os.kill(info["pid"], signal.SIGKILL)
                killed.append(info["pid"])
            time.sleep(0.05)
        result = client.result(job_id)
        assert result is not None
        assert result.status == Status.ERROR
        assert result.message == "job killed its worker 2 times; not run again"
        assert result.attempts == 3
        assert len(killed) == 2
        assert not result.steps
        assert worker.proc.poll() is None


@pytest.mark.parametrize("who_reaps", ["own reaper", "another worker"])
def test_no_sandbox_process_outlives_killed_worker(make_farm, who_reaps: str) -> None:  # noqa: F811
    farm: Farm = make_farm(**FAST)
    interval = float(FAST["SANDFARM_REAPER_INTERVAL_S"])
    victim = farm.start_worker("leaky", 1)
    uid = victim.uids()[0]
    with farm.client() as client:
        # A daemon that escapes the step's process group (setsid), plus the step itself.
        job_id = client.submit(
            {
                "command": "setsid sleep 300 < /dev/null > /dev/null 2>&1 & sleep 300",
                "limits": {"timeout_s": 5},
            }
        )
        wait_for(lambda: running(client, job_id), 20, what="job running")
        wait_for(lambda: len(pids_of_uid(uid)) >= 2, 10, what="daemon started")
        reaper = victim.reaper_pid()
        assert reaper is not None
        other = None
        if who_reaps == "another worker":
            other = farm.start_worker("sweeper", 1)
            os.kill(reaper, signal.SIGKILL)
        victim.kill_all()
        killed_at = time.monotonic()
        # a reaper round, and SIGKILLed processes finishing their exit on a loaded host
        bound = interval + 9
        wait_for(lambda: not pids_of_uid(uid), bound, 0.05, f"uid {uid} processes gone")
        assert time.monotonic() - killed_at <= bound + 1  # the daemon (sleep 300) did not last
        if other is not None:
            other.stop()  # it may be running the redelivered job; that ends within 5 s


def test_a_killed_reaper_is_started_again_and_its_worker_stays_online(make_farm) -> None:  # noqa: F811
    """The reaper alone writes its worker's heartbeat: killed, it left a healthy worker
    looking gone (past the stale time), dispatch stopped sending it jobs, and nothing
    said so in its log (a review). Its worker starts another."""
    farm: Farm = make_farm(**FAST)
    worker = farm.start_worker("beats", 1)
    first = worker.reaper_pid()
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: worker.reaper_pid() not in (None, first), 10, what="another reaper")
    assert "reaper exited" in worker.log.read_text()
    time.sleep(6)  # past the stale time at a 1 s interval (3 intervals + 2 s)
    with farm.client() as client:
        assert any(name.startswith("beats") for name in client.consumers()), client.status()
        job_id = client.submit({"command": "echo still-here"})
        result = client.result(job_id, timeout=30)
    assert result is not None and result.steps[0].stdout == "still-here\n", result


def a_running_job(client, victim: Worker) -> tuple[str, dict]:
    """A 2 s job, running on ``victim``: its id and running record."""
    job_id = client.submit({"command": "sleep 2; echo done"})
    info = wait_for(lambda: running(client, job_id), 20, what="job running")
    assert info["worker"] == victim.name
    return job_id, info


def host_down(victim: Worker, info: dict) -> float:
    """Everything of ``victim`` SIGKILLed, its reaper too (its host gone), and seen gone
    (a SIGKILLed pool process takes a moment to exit once its parent is gone): when."""
    reaper = victim.reaper_pid()
    assert reaper is not None
    os.kill(reaper, signal.SIGKILL)
    victim.kill_all()
    killed_at = time.monotonic()
    wait_for(
        lambda: not any(alive(p) for p in (victim.pid, info["pid"], reaper)),
        10,
        what="the worker's processes gone",
    )
    return killed_at


def test_a_lost_hosts_jobs_run_again_once_its_heartbeat_is_old(make_farm) -> None:  # noqa: F811
    """A host lost with its reaper (power, network, kernel) gave nothing back: its begun
    jobs waited for the visibility timeout, an hour by default. Another worker's reaper
    gives them back once the lost one's heartbeat is ``worker_lost_s`` old, not before."""
    lost_s = 8
    farm: Farm = make_farm(
        SANDFARM_VISIBILITY_TIMEOUT_S="600",
        SANDFARM_REAPER_INTERVAL_S="1",
        SANDFARM_WORKER_LOST_S=str(lost_s),
    )
    victim = farm.start_worker("lost", 1)
    with farm.client() as client:
        job_id, info = a_running_job(client, victim)
        heir = farm.start_worker("heir", 1)
        killed_at = host_down(victim, info)
        # nobody gave its job back: its heartbeat and its message are still there
        assert client.redis.hexists(client.keys.workers, victim.name)
        assert client.result(job_id) is None
        result = client.result(job_id, timeout=60)  # not 600 s
        took = time.monotonic() - killed_at
        assert result is not None, farm.logs()
        assert result.status == Status.SUCCEEDED and result.steps[0].stdout == "done\n"
        assert (result.attempts, result.worker) == (2, heir.name)
        assert lost_s - 2 <= took < 40, took  # once its heartbeat was old, not before
        assert client.status()["duplicates"] == 0
        assert not client.redis.hexists(client.keys.workers, victim.name)  # forgotten
        assert f"{victim.name} lost" in heir.log.read_text()


def test_a_rebooted_hosts_worker_gives_back_what_it_began_before(make_farm) -> None:  # noqa: F811
    """A host rebooted: its worker comes back under the same name within worker_lost_s,
    and its fresh heartbeat hid the jobs its earlier instance had begun; they waited for
    the visibility timeout. The new instance gives them back itself."""
    farm: Farm = make_farm(
        SANDFARM_VISIBILITY_TIMEOUT_S="600",
        SANDFARM_REAPER_INTERVAL_S="1",
        SANDFARM_WORKER_LOST_S="8",  # the wait; no other worker: no lost-host rule
    )
    before = farm.start_worker("host-a", 1)
    with farm.client() as client:
        job_id, info = a_running_job(client, before)
        host_down(before, info)  # everything on it
        after = farm.start_worker("host-a", 1)  # the host is back, its worker too
        assert after.name == before.name
        result = client.result(job_id, timeout=60)  # not 600 s
        assert result is not None, farm.logs()
        assert result.status == Status.SUCCEEDED and result.steps[0].stdout == "done\n"
        assert (result.attempts, result.worker) == (2, after.name)
        assert client.status()["duplicates"] == 0
        assert "jobs its earlier instance began sent again" in after.log.read_text()


def test_a_live_workers_long_job_is_never_taken_for_a_lost_ones(make_farm) -> None:  # noqa: F811
    """The other side: a job running longer than ``worker_lost_s`` on a worker that beats
    is left to it (its heartbeat is fresh), run once."""
    farm: Farm = make_farm(SANDFARM_REAPER_INTERVAL_S="1", SANDFARM_WORKER_LOST_S="1")
    worker = farm.start_worker("busy", 1)
    farm.start_worker("idle", 1)
    with farm.client() as client:
        job_id = client.submit({"command": "sleep 9; echo done"})
        info = wait_for(lambda: running(client, job_id), 20, what="job running")
        assert info["worker"] == worker.name
        result = client.result(job_id, timeout=60)
        assert result is not None and result.status == Status.SUCCEEDED, farm.logs()
        assert (result.attempts, result.worker) == (1, worker.name)
        assert client.status()["duplicates"] == 0
        assert " lost (heartbeat still" not in farm.logs()


# kombu stamps each delivery with its host's clock: this one runs 30 s ahead of Redis's.
CLOCK_AHEAD = """
import time as _time
import kombu.transport.redis as _transport
_transport.time = lambda: _time.time() + 30
"""


def test_a_killed_workers_jobs_run_again_before_its_visibility_timeout(
    make_farm,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed (main process and pool) left its running jobs' messages unacked
    until the visibility timeout, an hour by default, before anything ran them again (a
    reliability review). Its reaper, in its own session, gives them back once its slots
    are clean (worker/giveback.py). Its host's clock runs ahead of Redis's: judged by
    comparing kombu's delivery time with the run's start, it gave nothing back."""
    farm: Farm = make_farm(SANDFARM_VISIBILITY_TIMEOUT_S="600", SANDFARM_REAPER_INTERVAL_S="1")
    (tmp_path / "sitecustomize.py").write_text(CLOCK_AHEAD)
    paths = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    victim = farm.start_worker("gone", 1, PYTHONPATH=paths)
    with farm.client() as client:
        job_id, info = a_running_job(client, victim)
        # its delivery was stamped by the fast clock, and its run keeps that stamp
        delivered = client.redis.zscore(KOMBU_UNACKED_INDEX, info["tag"])
        assert delivered is not None and delivered - info["at"] > 25, info
        assert info["delivered"] == delivered
        heir = farm.start_worker("heir", 1)
        victim.kill_all()
        # A SIGKILLed pool process takes a moment to exit once its parent is gone.
        wait_for(lambda: not alive(victim.pid) and not alive(info["pid"]), 10, what="worker dead")
        result = client.result(job_id, timeout=30)  # not 600 s
        assert result is not None, farm.logs()
        assert result.status == Status.SUCCEEDED
        assert result.steps[0].stdout == "done\n"
        assert result.attempts == 2
        assert result.worker == heir.name
        assert client.status()["duplicates"] == 0
        assert "gone" in victim.log.read_text() and "1 of its jobs sent again" in (
            victim.log.read_text()
        )
