"""The reaper: removes what dead workers left in sandbox slots, and beats for `status`.

Why a separate process: sweeping a slot means taking its flock, and a lock fd held by
a thread of the Celery main process while billiard forks a replacement pool child
would be inherited by that child and pin the slot forever.

Every ``reaper_interval_s`` it finds the slots of this host that hold leftovers
(processes of a slot uid, files in a slot workspace) and sweeps each one whose lock is
free, i.e. no live job runs there. That covers a pool process SIGKILLed mid-job (its
sandbox children already got PDEATHSIG SIGKILL; grandchildren that called setsid are
found by uid and cgroup) and a whole worker killed on a host where another worker, or
this reaper, is still alive. It runs in its own session so a signal to the worker's
process group leaves it to do a last sweep after its parent died; then it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

from producer.protocol import FarmScripts, Heartbeat, Settings, connect, get_settings, margins
from producer.protocol.records import redis_clock
from sandbox_core import defaults as d
from sandbox_core import slots
from sandbox_core.backends.docker.containers import WorkerAlive
from sandbox_core.errors import SlotBusyError
from sandbox_core.slots import slot_of_uid, slot_uid
from sandbox_core.sweep import process_uids
from worker.giveback import dead_here, give_back
from worker.heartbeat import beat, forget
from worker.lostworkers import LostWatch, others_round


def processes_by_slot() -> dict[int, list[int]]:
    """slot index -> pids running as that slot's uid."""
    found: dict[int, list[int]] = {}
    for pid, uid in process_uids().items():
        index = slot_of_uid(uid)
        if index is not None:
            found.setdefault(index, []).append(pid)
    return found


def dirty_slots(workspace_base: Path | None = None) -> set[int]:
    """Slots of this host holding leftovers: processes or workspace entries."""
    dirty = set(processes_by_slot()) if os.geteuid() == 0 else set()
    base = slots.workspace_base(workspace_base)
    try:
        for entry in os.scandir(base):
            if entry.name.startswith("slot-") and entry.name[5:].isdigit():
                index = int(entry.name[5:])
                if index < d.MAX_SLOTS and any(os.scandir(entry.path)):
                    dirty.add(index)
    except OSError:
        pass
    return dirty


def sweep_free(workspace_base: Path | None = None) -> list[int]:
    """Sweep every dirty slot whose lock is free; returns the slots swept."""
    swept = []
    for index in sorted(dirty_slots(workspace_base)):
        try:
            held = slots.acquire(index, timeout_s=0, workspace_dir=workspace_base)
        except SlotBusyError:
            continue  # a live job runs there: its own session cleans up
        held.release()  # acquire swept it
        swept.append(index)
    return swept


_docker: dict[str, Any] = {}


def worker_judge(client: redis.Redis | None, settings: Settings) -> WorkerAlive | None:
    """Judge farm workers by their heartbeats: alive while one is fresh, dead once it is
    stale or gone, unknown while Redis does not answer (never a reason to remove)."""
    if client is None:
        return None

    def alive(worker: str) -> bool | None:
        try:
            raw = client.hget(settings.keys.workers, worker)
        except redis.RedisError:
            return None
        if raw is None:
            return False
        beat = Heartbeat.model_validate_json(raw)
        try:
            now = redis_clock(client)
        except redis.RedisError:
            return None
        return now - beat.ts <= margins.heartbeat_stale_after(beat.interval_s)

    return alive


def reap_containers(judge: WorkerAlive | None = None, workspace_dir: Path | None = None) -> int:
    """Remove sandbox containers whose owner is known to be dead: a process of this pid
    namespace that is gone, or (with ``judge``) a worker whose heartbeat stopped.

    A no-op where no Docker engine answers; the engine is looked up once.
    """
    if "client" not in _docker:
        _docker["client"] = None
        if Path("/var/run/docker.sock").exists():
            with contextlib.suppress(Exception):
                import docker

                client = docker.from_env(timeout=10)
                client.ping()
                _docker["client"] = client
    client = _docker["client"]
    if client is None:
        return 0
    from sandbox_core.backends.docker import reap_orphans
    from sandbox_core.backends.docker.containers import pts_base

    return reap_orphans(client, judge, pts_base(workspace_dir))


def _parent_alive(pid: int) -> bool:
    return os.getppid() == pid


def run(
    parent: int,
    name: str,
    base: int,
    size: int,
    interval: float,
    beats: bool,
    reserved: int | None = None,
    instance: str = "",
) -> None:
    """``size``: the worker's slots for jobs (its concurrency); ``reserved``: its block of
    slots (its pool processes' spares too), which the sweeps and the heartbeat cover;
    ``instance``: the worker's (worker/instance.py)."""
    reserved = reserved or size
    settings = get_settings()
    # Impatient: a missing broker must never stall the sweeps; the beat is retried next tick.
    client = connect(settings.redis_url, patient=False) if beats else None
    info = Heartbeat(
        pid=parent,
        host=socket.gethostname(),
        slots=(base, base + reserved),
        uids=(slot_uid(base), slot_uid(base + reserved - 1)),
        concurrency=size,
        queues=(settings.queue,),
        backends=settings.served_backends,
        interval_s=interval,
        instance=instance,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _loop(parent, name, base, reserved, interval, settings, client, info)
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                forget(client, settings.keys.workers, name, info.instance)


def _loop(
    parent: int,
    name: str,
    base: int,
    size: int,
    interval: float,
    settings: Settings,
    client: redis.Redis | None,
    info: Heartbeat,
) -> None:
    orphaned_at: float | None = None
    orphaned = threading.Event()
    watch = LostWatch(interval=interval)
    if client is not None:  # a worker is online as soon as it starts
        threading.Thread(
            target=_beat_while_alive,
            args=(parent, name, interval, settings, client, info, orphaned, watch),
            name="sandfarm-beats",
            daemon=True,
        ).start()
    while True:
        alive = _parent_alive(parent)
        if not alive and orphaned_at is None:
            orphaned_at = time.monotonic()
            orphaned.set()
            if client is not None:
                with contextlib.suppress(Exception):
                    forget(client, settings.keys.workers, name, info.instance)
        swept = False
        try:
            sweep_free(settings.workspace_dir)
            reap_containers(worker_judge(client, settings), settings.workspace_dir)
            swept = True
        except Exception as exc:  # never let the reaper die of one bad slot
            print(f"sandfarm reaper: sweep failed: {exc!r}", flush=True)
        if orphaned_at is not None:
            ours = set(range(base, base + size))
            clean = not (dirty_slots(settings.workspace_dir) & ours)
            if clean and swept and client is not None:  # no process of its jobs is left
                _give_back(client, settings, name, info.instance)
            if (clean and swept) or time.monotonic() - orphaned_at > 60:
                return
            time.sleep(min(interval, 0.5))
            continue
        if client is not None and swept:
            try:
                for line in others_round(client, settings, name, info.instance, watch):
                    print(f"sandfarm reaper: {line}", flush=True)
            except Exception as exc:  # never let the reaper die of it: it writes the beat
                watch.clear()
                print(f"sandfarm reaper: give-back round failed: {exc!r}", flush=True)
        time.sleep(interval)


def _give_back(client: redis.Redis, settings: Settings, name: str, instance: str) -> None:
    """The dead worker's begun jobs go back to its queue now (worker/giveback.py)."""
    try:
        given = give_back(client, settings, dead_here(name, instance))
    except redis.RedisError as exc:  # kombu's restore sends them after the visibility timeout
        print(f"sandfarm reaper: could not give back {name}'s jobs: {exc!r}", flush=True)
        return
    if given:
        print(f"sandfarm reaper: {name} died; {given} of its jobs sent again", flush=True)


def _beat_while_alive(
    parent: int,
    name: str,
    interval: float,
    settings: Settings,
    client: redis.Redis,
    info: Heartbeat,
    orphaned: threading.Event,
    watch: LostWatch,
) -> None:
    """The heartbeat, every ``interval``, on a thread of its own: on the sweeps' loop, a
    sweep waiting up to a minute for a slow exit outlasted the 17 s after which a worker
    counts as gone (a review)."""
    first = True
    while not orphaned.is_set() and _parent_alive(parent):
        # Redis away: the broker reconnect logs it; keep beating.
        with contextlib.suppress(Exception):
            ttl = margins.heartbeat_ttl(interval)
            replaced = beat(client, settings.keys.workers, name, info, ttl)
            if watch.saw_twin(replaced, info.instance, first):
                print(
                    f"sandfarm reaper: another live worker is named {name}: neither gives"
                    " back what the other's earlier instances left",
                    flush=True,
                )
            first = False
            # Every worker dispatches now and then: no one process's death stops it (a
            # finished job dispatches the next one itself; this catches the rest).
            FarmScripts(client, settings).dispatch()
        orphaned.wait(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description="sandfarm slot reaper")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--base", type=int, required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--reserved", type=int, default=None)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--no-beats", action="store_true")
    parser.add_argument("--instance", default="")
    args = parser.parse_args()
    run(
        args.parent,
        args.name,
        args.base,
        args.size,
        args.interval,
        not args.no_beats,
        args.reserved,
        args.instance,
    )


if __name__ == "__main__":
    main()
