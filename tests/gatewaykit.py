"""Plumbing for gateway tests: real `sandfarm gateway` processes on loopback, tenants with
keys made through the real store, and a farm (tests.farmkit) behind them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from producer.protocol import FarmScripts, connect
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import Policy
from tests.farmkit import SANDFARM, Farm, free_port, make_farm, wait_for  # noqa: F401


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def launch_gateway(
    farm: Farm,
    address: str,
    port: int,
    launcher: list[str] | None = None,
    call: Callable[..., Any] | None = None,
) -> Gateway:
    """A real `sandfarm gateway` on ``address:port``, answering /readyz. ``launcher`` and
    ``call`` run it and ask it from elsewhere (a host of tests/netkit.py)."""
    log = farm.tmp / f"gateway-{address}-{port}.log"
    argv = [SANDFARM, "gateway", "--host", address, "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*(launcher or []), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **farm.env},
            start_new_session=True,
        )
    gateway = Gateway(f"http://{address}:{port}", proc, log)
    ask = call or (lambda fn, *args, **kwargs: fn(*args, **kwargs))

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return ask(httpx.get, f"{gateway.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 30, 0.1, "the gateway answers")
    return gateway


@dataclass
class TenantFarm:
    """A farm with gateways in front and a tenant store to make tenants in."""

    farm: Farm
    gateways: list[Gateway] = field(default_factory=list)

    @property
    def store(self) -> TenantStore:
        settings = self.farm.settings
        return TenantStore(connect(settings.redis_url), settings.keys)

    def start_gateway(self) -> Gateway:
        gateway = launch_gateway(self.farm, "127.0.0.1", free_port())
        self.gateways.append(gateway)
        return gateway

    def tenant(self, name: str, **policy: object) -> str:
        """Make a tenant with ``policy``; returns a fresh API key of its."""
        self.store.add(name, Policy.model_validate(policy))
        token, _ = self.store.create_key(name)
        return token

    def remove(self, name: str) -> tuple[int, int]:
        """Remove a tenant (its waiting jobs end cancelled): (cancelled, dispatched)."""
        store = self.store
        return store.remove(name, FarmScripts(store.redis, self.farm.settings))

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.stop()
        self.gateways.clear()


def api(gateway: Gateway, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=gateway.url, headers=headers, timeout=90)


def wait_final(client: httpx.Client, job_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = client.get(f"/v1/jobs/{job_id}", params={"wait": 10}).json()
        if reply.get("status") not in ("queued", "running"):
            return reply
    raise AssertionError(f"{job_id} not final after {timeout}s")


def exactly_once(r, keys, tenant: str, ids: list[str]) -> None:
    """Each job has its result, ran one attempt, and nothing is left queued or counted
    twice."""
    qids = [f"{tenant}/{i}" for i in ids]
    results = r.mget([keys.result(q) for q in qids])
    missing = [q for q, v in zip(qids, results, strict=True) if v is None]
    assert not missing, f"{len(missing)} accepted jobs have no result: {missing[:5]}"
    attempts = r.mget([keys.attempts(q) for q in qids])
    twice = [q for q, n in zip(qids, attempts, strict=True) if n is not None and int(n) != 1]
    assert not twice, f"jobs run more than once: {twice[:5]}"
    assert r.get(keys.duplicates) in (None, b"0")
    assert r.llen(keys.pending(tenant)) == 0
    assert r.zcard(keys.active(tenant)) == 0
    assert not r.keys(keys.message(f"{tenant}/*"))


@pytest.fixture
def tenant_farm(make_farm):  # noqa: F811
    """Factory of farms with gateways; gateways stop before the farm's workers do."""
    made: list[TenantFarm] = []

    def make(**env: str) -> TenantFarm:
        made.append(TenantFarm(make_farm(**env)))
        return made[-1]

    yield make
    for tf in made:
        tf.stop()
