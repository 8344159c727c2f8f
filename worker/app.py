"""The Celery app of a sandbox worker: every reliability setting in one place, with why.

Start it with ``sandfarm worker`` (or ``celery -A worker.app worker -O fair -E``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import threading
import warnings

from celery import Celery, bootsteps, signals
from celery.app import trace

from producer.protocol import (
    Settings,
    SlotReservationError,
    broker_config,
    get_settings,
    margins,
)
from sandbox_core import defaults as d
from worker import kombu_fixes, reservation
from worker.instance import INSTANCE  # made here, before the pool forks: one a worker

settings: Settings = get_settings()
kombu_fixes.apply()

# A sandbox worker must be root (cgroups, namespaces, the slot uids; jobs never are), and
# Celery's superuser warning is about pickled messages, which this worker never accepts.
warnings.filterwarnings("ignore", message="You're running the worker with superuser")


def worker_config(s: Settings) -> dict[str, object]:
    return {
        **broker_config(s),  # JSON only, visibility timeout, restore scans, no result backend
        # Ack after the job ran: a worker dying mid-job leaves the message to be redelivered.
        "task_acks_late": True,
        # A pool process killed mid-job (SIGKILL, OOM) requeues the message at once
        # instead of failing it; the attempt counter in the task stops poison jobs.
        "task_reject_on_worker_lost": True,
        # Our task never raises for job problems; if it raises anyway (a farm bug) or hits
        # Celery's hard limit, on_failure has stored an `error` result, so ack it.
        "task_acks_on_failure_or_timeout": True,
        # One job per slot: a prefetched job would wait behind a long one (and be lost
        # to nobody but delayed), and a dead worker would take extra jobs down with it.
        "worker_prefetch_multiplier": s.prefetch_multiplier,
        # Celery's limits sit above the sandbox's own (set per job when enqueued): the
        # sandbox, which kills its whole tree, ends a job; Celery only catches a hang.
        "task_soft_time_limit": margins.WORKER_SOFT_LIMIT_S,
        "task_time_limit": margins.WORKER_HARD_LIMIT_S,
        # Events for Flower: workers report received/started/succeeded with argsrepr.
        "worker_send_task_events": s.task_events,
        "task_send_sent_event": s.sent_events,
        # A running sandbox survives a broker blip; its message is redelivered after the
        # visibility timeout only if the ack was lost, and the duplicate result is dropped.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Rate limits are not used; skipping their bookkeeping makes dispatch cheaper.
        "worker_disable_rate_limits": True,
        # A worker with a dead broker keeps trying instead of exiting.
        "broker_connection_retry": True,
        # Remote control on: Flower's inspect/ping and `celery inspect` need it.
        "worker_enable_remote_control": True,
    }


# The worker log reads "Task sandfarm.execute[id] ran in 2.01s: timed_out 2.00s process",
# never "succeeded" for a job that did not: Celery's "succeeded" means the task returned.
trace.LOG_SUCCESS = "Task %(name)s[%(id)s] ran in %(runtime)ss: %(return_value)s"

app = Celery("sandfarm", set_as_current=True)
app.conf.update(worker_config(settings))
app.conf.imports = ("worker.tasks",)

# Set in the main process before the pool forks, read in each pool child.
_reservation: reservation.Reservation | None = None
_reaper: subprocess.Popen[bytes] | None = None
_reaper_argv: list[str] = []
_reaper_stopping = threading.Event()
REAPER_CHECK_S = 2.0  # how often the main process looks whether its reaper still runs


@signals.worker_init.connect
def _on_worker_init(sender: object = None, **_: object) -> None:
    """Reserve this worker's block of slots and start its reaper (main process)."""
    global _reservation, _reaper
    size = int(getattr(sender, "concurrency", None) or settings.concurrency)
    _reservation = _reserve(size)
    name = getattr(sender, "hostname", None) or f"pid{os.getpid()}"
    if settings.raise_pid_max:  # host-wide, as Debian's systemd does (tasklimits.py)
        from sandbox_core.tasklimits import raise_pid_max

        done = raise_pid_max()
        if done:
            print(f"sandfarm worker: kernel.pid_max {done}", flush=True)
    # Sweep what a previous, dead worker left in our slots before the first job.
    from worker.reaper import sweep_free

    sweep_free(settings.workspace_dir)
    _reaper_argv[:] = [
        sys.executable,
        "-m",
        "worker.reaper",
        "--parent",
        str(os.getpid()),
        "--name",
        name,
        "--base",
        str(_reservation.base),
        "--size",
        str(size),
        "--reserved",
        str(_reservation.size),
        "--interval",
        str(settings.reaper_interval_s),
        "--instance",
        INSTANCE,
    ]
    _reaper = _start_reaper()
    threading.Thread(target=_keep_reaper, name="sandfarm-reaper-watch", daemon=True).start()
    print(
        f"sandfarm worker {name}: slots {_reservation.base}..{_reservation.end - 1},"
        f" reaper pid {_reaper.pid}, visibility timeout {settings.visibility_timeout:g}s",
        flush=True,
    )


def _start_reaper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _reaper_argv,
        start_new_session=True,  # survives a signal to our process group: last sweep
        close_fds=True,
    )


def _keep_reaper() -> None:
    """Start the reaper again whenever it ends while the worker runs: it alone writes the
    heartbeat, so a killed reaper left a healthy worker looking gone and every job
    waiting for it, with no line in its log (a review)."""
    global _reaper
    while not _reaper_stopping.wait(REAPER_CHECK_S):
        if _reaper is not None and _reaper.poll() is not None and not _reaper_stopping.is_set():
            print(
                f"sandfarm worker: reaper exited ({_reaper.returncode}), starting another",
                flush=True,
            )
            _reaper = _start_reaper()


def _reserve(size: int) -> reservation.Reservation:
    """Slots for ``size`` pool processes: each with a spare where the host has room for
    one (prewarm), else one each."""
    lanes = lanes_per_process(size)
    if lanes > 1:
        with contextlib.suppress(SlotReservationError):
            return reservation.reserve(size * lanes, settings.slot_base, processes=size)
    return reservation.reserve(size, settings.slot_base, processes=size)


@signals.worker_shutdown.connect
def _on_worker_shutdown(**_: object) -> None:
    _reaper_stopping.set()
    if _reaper is not None and _reaper.poll() is None:
        _reaper.terminate()
        try:
            _reaper.wait(5)
        except subprocess.TimeoutExpired:
            _reaper.kill()


# Set by the main process when a warm shutdown starts, read by the pool processes (one
# shared page, made before the pool forks): a chain then stops at its current job, so a
# shutdown waits for one job per slot, not for a chain (worker/chain.py).
_stopping = mmap.mmap(-1, 1)


class StopChains(bootsteps.StartStopStep):
    """Every way a warm shutdown starts (a signal, or `celery control shutdown`, which
    raises WorkerShutdown and sends no worker_shutting_down) ends in the worker's
    blueprint closing every step before it stops the first: this runs before the pool
    waits for its tasks."""

    def close(self, parent: object) -> None:
        _stopping[0] = 1


app.steps["worker"].add(StopChains)


def stopping() -> bool:
    return _stopping[0] == 1


def lanes_per_process(concurrency: int) -> int:
    """Slots per pool process: with prewarm, a spare, so the next job's sandbox is set up
    in one while a job runs in the other (sandbox_core.slots.SlotPool)."""
    return 2 if settings.prewarm and 2 * concurrency <= d.MAX_SLOTS else 1


def slot_index() -> int:
    """This pool process's slot: the worker's block base + billiard's process index."""
    from billiard.process import current_process

    index = getattr(current_process(), "index", None) or 0
    base = _reservation.base if _reservation is not None else (settings.slot_base or 0)
    return base + int(index)


def spare_slot_index() -> int | None:
    """This pool process's spare slot, after every pool process's first (or None)."""
    if _reservation is None or _reservation.size < 2 * _reservation.processes:
        return None
    return slot_index() + _reservation.processes
