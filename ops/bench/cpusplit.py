"""Where a benchmark's CPU goes, by process: read from /proc before and after a run.

A worker's main process (Celery's consumer: BRPOP, hand-off, acks, events), its pool
processes (our task: the scripts, the backend's Python), what they reaped (the jobs and
their sandbox helpers), the worker's reaper, Redis, and this process (the client). On a
2-core host running 2 slots the farm is CPU-bound, so CPU per job is the throughput.
The kernel's own threads (children of kthreadd: its workers tearing down each session's
network and mount namespaces and cgroups, RCU) are summed as ``kthreads``, host-wide,
so a run's other work counts too. The whole host's CPU (/proc/stat) adds what no
process is charged for (interrupts) and the time it sat idle.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _times(pid: int) -> tuple[float, float]:
    """(own CPU ms, reaped children's CPU ms) of a process; zeros once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) * _TICK_MS, (cutime + cstime) * _TICK_MS


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(v) for v in text.split()]


Snapshot = dict[str, float]  # part -> CPU ms so far

KTHREADD = 2  # the parent of every kernel thread


def _kthreads() -> float:
    """CPU ms so far of the kernel's threads now alive (one that ended takes its time)."""
    return sum(_times(pid)[0] for pid in _children(KTHREADD))


def snapshot(worker_pid: int, redis_pid: int | None) -> Snapshot:
    """CPU ms so far: the worker's main process, its pool (own and reaped), Redis, us."""
    parts: dict[str, float] = {}
    main_own, _ = _times(worker_pid)
    parts["worker_main"] = main_own
    pool_own = reaped = 0.0
    for child in _children(worker_pid):
        own, theirs = _times(child)
        # the reaper is a `python -m worker.reaper` child; the rest are pool processes
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"worker.reaper" in cmdline:
            parts["reaper"] = own
            continue
        pool_own += own
        reaped += theirs
    parts["pool_python"] = pool_own
    parts["jobs"] = reaped
    if redis_pid:
        parts["redis"] = _times(redis_pid)[0]
    parts["client"] = _times(os.getpid())[0]
    parts["kthreads"] = _kthreads()
    return parts


def this_process() -> Snapshot:
    """CPU ms so far of this process and of the children it reaped (a bare run's jobs)."""
    own, reaped = _times(os.getpid())
    return {"client": own, "jobs": reaped, "kthreads": _kthreads()}


def per_job(before: Snapshot, after: Snapshot, jobs: int) -> str:
    """One line: CPU ms per job by part, and their total."""
    items = [(name, (after.get(name, 0.0) - before.get(name, 0.0)) / jobs) for name in after]
    total = sum(v for _, v in items)
    text = " ".join(f"{name}={value:.2f}" for name, value in items)
    return f"cpu_per_job_ms: {text} total={total:.2f}"


_HOST_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def host() -> Snapshot:
    """The whole host's CPU ms so far, by /proc/stat's first line (all CPUs)."""
    with open("/proc/stat") as stat:
        ticks = stat.readline().split()[1 : 1 + len(_HOST_FIELDS)]
    return {name: int(value) * _TICK_MS for name, value in zip(_HOST_FIELDS, ticks, strict=True)}


def host_per_job(before: Snapshot, after: Snapshot, jobs: int) -> str:
    """One line: the host's busy and idle CPU ms per job, and the busy share."""
    spent = {name: (after[name] - before[name]) / jobs for name in after}
    idle = spent["idle"] + spent["iowait"]
    busy = sum(spent.values()) - idle
    kernel = spent["system"] + spent["irq"] + spent["softirq"]
    share = busy / (busy + idle) if busy + idle else 0.0
    return (
        f"host_cpu_per_job_ms: busy={busy:.2f} (user={spent['user'] + spent['nice']:.2f}"
        f" kernel={kernel:.2f} steal={spent['steal']:.2f}) idle={idle:.2f} busy_share={share:.2f}"
    )
