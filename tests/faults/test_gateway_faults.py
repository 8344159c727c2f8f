"""Admission and dispatch under faults: a gateway killed mid-batch (a second one
serving) and dispatchers killed mid-move lose and double nothing; every accepted job has
exactly one result, run once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from producer.gateway_client import GatewayClient
from producer.protocol import connect
from tests.farmkit import farm_db, make_farm, wait_for  # noqa: F401
from tests.gatewaykit import exactly_once, tenant_farm  # noqa: F401

pytestmark = pytest.mark.timeout(400)
QUICK = {"command": "true"}


def test_a_gateway_killed_mid_batch_loses_and_doubles_nothing(tenant_farm) -> None:  # noqa: F811
    tf = tenant_farm()
    farm = tf.farm
    farm.start_worker("gwf", 2)
    first, second = tf.start_gateway(), tf.start_gateway()
    key = tf.tenant("faulty")
    r, keys = connect(farm.settings.redis_url), farm.settings.keys
    ids = [f"j{i}" for i in range(1500)]
    client = GatewayClient([first.url, second.url], key)
    accepted: list[str] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            accepted.extend(client.submit_many([{**QUICK, "id": i} for i in ids], batch=50))
        except BaseException as exc:  # reported below
            errors.append(exc)

    sender = threading.Thread(target=submit)
    sender.start()
    wait_for(lambda: r.zcard(keys.joblist("faulty")) >= 300, 60, what="a third accepted")
    first.stop(signal.SIGKILL)  # mid-batch: requests to it were in flight
    assert first.proc.poll() is not None
    sender.join(120)
    assert not errors, errors
    assert accepted == ids  # the client moved to the second gateway and sent the rest
    assert r.zcard(keys.joblist("faulty")) == len(ids)
    done = {res.id for res in client.as_completed(ids, timeout=240)}
    assert done == set(ids)
    exactly_once(r, keys, "faulty", ids)


DISPATCHER = """
import sys, time
from producer.protocol import FarmScripts, connect, get_settings
s = get_settings()
scripts = FarmScripts(connect(s.redis_url), s)
print("dispatching", flush=True)
while True:
    scripts.dispatch()
"""


def test_dispatchers_killed_mid_move_lose_and_double_nothing(tenant_farm) -> None:  # noqa: F811
    """Dispatch runs in every gateway, every worker and every finished job: kill the
    gateway for good and SIGKILL busy dispatchers over and over; jobs still all run once."""
    tf = tenant_farm()
    farm = tf.farm
    farm.start_worker("dsp", 2)
    gateway = tf.start_gateway()
    key = tf.tenant("moved")
    r, keys = connect(farm.settings.redis_url), farm.settings.keys
    ids = [f"d{i}" for i in range(800)]
    client = GatewayClient(gateway.url, key)
    assert client.submit_many([{**QUICK, "id": i} for i in ids]) == ids
    gateway.stop(signal.SIGKILL)
    assert r.llen(keys.pending("moved")) > 600  # most still wait for a dispatch
    env = {**os.environ, **farm.env}
    kills = 0
    rng = random.Random(7)
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", DISPATCHER],
                env=env,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            for _ in range(3)
        ]
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"dispatching\n"
        time.sleep(rng.uniform(0.01, 0.2))  # they are mid-loop: scripts in flight
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
    assert kills >= 30
    # No gateway, no extra dispatcher: the workers' own dispatch finishes the work.
    wait_for(
        lambda: r.llen(keys.pending("moved")) == 0 and r.zcard(keys.active("moved")) == 0,
        240,
        0.5,
        "every job dispatched and final",
    )
    with GatewayClient(tf.start_gateway().url, key) as reader:
        assert {res.id for res in reader.as_completed(ids, timeout=60)} == set(ids)
    exactly_once(r, keys, "moved", ids)
