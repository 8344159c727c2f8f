"""Every default and every farm-wide maximum, in one documented place.

A job asking for more than a maximum is rejected by validation, never clamped.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# Limits: (default, maximum). Minimums live next to the fields in models.py.
TIMEOUT_S = (30.0, 3600.0)  # wall clock for the whole job, all steps together
CPU_S = (30, 3600)  # RLIMIT_CPU per process
MEMORY_MB = (512, 16384)  # address space per process, and the job's cgroup where available
PROCESSES = (64, 4096)  # RLIMIT_NPROC per slot uid, and the job's pids cgroup
OPEN_FILES = (256, 4096)  # RLIMIT_NOFILE
FILE_SIZE_MB = (64, 4096)  # RLIMIT_FSIZE: the largest file a job may write
OUTPUT_BYTES = (64 * KIB, 4 * MIB)  # head + tail kept per stream per step
HEAD_RATIO = 0.5  # share of OUTPUT_BYTES given to the head
FLOOD_KILL_BYTES = (64 * MIB, 8 * GIB)  # a step writing more than this (both streams) is killed
WORKSPACE_MB = (256, 8192)  # tmpfs size of the workspace where the backend can mount one
CPUS = (1.0, 64.0)  # CPU time per wall second (cores) for all the job's processes together
PTYS = (16, 256)  # pseudo-terminals the job may hold at once (its own devpts instance)

# All of a worker's jobs together (its parent memory cgroup) may hold the host's RAM
# less this reserve, kept for the worker, Redis and the OS: the maximums above are per
# job, and jobs at them overcommit any host (tmpfs pages belong to no process, so a
# host-wide OOM would kill a host service first). The larger of the two, at most half.
FARM_MEMORY_RESERVE_BYTES = 2 * GIB
FARM_MEMORY_RESERVE_SHARE = 0.10  # of MemTotal

# A job's TCP socket buffers, at most (and never above its memory limit): cgroup v1
# leaves them out of the memory limit, and the kernel's tcp_mem is one pool for every
# socket on the host, so a job that filled it stalled the workers' Redis traffic (an
# attack review). Several loopback connections' full buffers (cgroup v2 charges them to
# the memory limit instead).
TCP_BUFFERS_BYTES = 64 * MIB
# A job's loopback MTU and GSO size (loopback.py): the kernel lets each socket queue about
# a packet past that bound, so packets of 8 KiB, not 64, quarter what many sockets pass it
# by; a job's loopback still moves ~0.9 GB/s (4.9 at 64 KiB).
LOOPBACK_PACKET_BYTES = 8 * 1024
# TCP memory the kernel lets a job hold past that bound (tcpwatch.py), checked every
# TCP_WATCH_S of a step: its TCP charge past TCP_BUFFERS_BYTES by more than
# TCP_OVERSHOOT_BYTES (connections accepted after they filled are charged past any
# limit) stops it; so do connections waiting in its listeners (charged to no cgroup)
# that could hold more than WAITING_CONNECTIONS_BYTES.
TCP_OVERSHOOT_BYTES = 64 * MIB
WAITING_CONNECTIONS_BYTES = 128 * MIB
TCP_WATCH_S = 0.1

# Spec size caps: keep one job's spec and result small enough for Redis.
MAX_STEPS = 128
MAX_SOURCE_BYTES = 1 * MIB  # code / command / write_file content, each
MAX_SEED_FILES = 256
MAX_SEED_BYTES = 8 * MIB  # all seeded files together
MAX_ENV_VARS = 128
MAX_ENV_VALUE_BYTES = 32 * KIB
# All of it (names, values, '=' and NUL each): what every exec of a step carries (an
# attack review: 128 x 32 KiB, past what execve takes, copied into each docker exec)
MAX_ENV_BYTES = 64 * KIB
MAX_LABELS = 32
MAX_LABEL_BYTES = 256
MAX_COLLECT_PATTERNS = 32
MAX_PATH_BYTES = 1024  # a relative workspace path
MAX_NAME_BYTES = 255  # one path component

# Collection of workspace files into the result.
COLLECT_MAX_FILES = 64
COLLECT_MAX_FILE_BYTES = 256 * KIB
COLLECT_MAX_TOTAL_BYTES = 1 * MIB
COLLECT_MAX_VISITED = 10_000  # directory entries looked at, whatever the workspace holds
# A collect pattern's length, and the worker's time matching patterns against names: a
# pattern's regex costs up to its length times the path's a name, and a crafted one cost
# the worker ~2 ms a name, 23 s for one pattern over 10,000 names, past the job's timeout
# and on no job's CPU (an attack review). Past the time, collect stops and says so.
COLLECT_MAX_PATTERN_BYTES = 256
COLLECT_MATCH_S = 1.0
# A workspace holding more than this is removed before its job's result, in the job's own
# time (its slot time, its tenant's fair share), not after it in the next job's: ~1 s to
# remove 7 GB in 2 million files here, and a job makes that in seconds; 60 MB in 4,000
# files took ~25 ms, what is under these bounds a few ms.
TEARDOWN_INLINE_BYTES = 16 * MIB
TEARDOWN_INLINE_FILES = 1000

# Whole-result bound: steps * 2 streams * output_bytes + collected files must fit.
MAX_RESULT_BYTES = 32 * MIB

# Process backend: slot i runs as uid/gid SLOT_UID_BASE + i when the worker is root.
SLOT_UID_BASE = 61000
MAX_SLOTS = 256
# The Docker backend's keeper process (holds a container open between steps): a uid of
# its own, so no job (a slot uid) can signal it. Like the slot uids, no host account.
KEEPER_UID = SLOT_UID_BASE - 1
# The Docker backend's jobs: slot i runs them as DOCKER_UID_BASE + i, a range no host
# backend uses, so no process or standby of a host job shares a uid (its /proc view,
# signals, per-uid limits) with a container's processes or its armed launchers.
DOCKER_UID_BASE = SLOT_UID_BASE + MAX_SLOTS
# After the main process of a step exits, how long daemonised leftovers may keep
# writing before the step's process tree is killed.
EXIT_DRAIN_S = 0.2
# How long a network job's TCP sockets on L1/L2 may go on sending once its step's
# processes are gone (what it sent reaches its peer) before the farm ends them, within
# the job's time (sweep.end_sockets).
SOCKET_DRAIN_S = 1.0
# How long a slot's kill waits for its group to empty, in the killed job's own time: a
# killed process leaves the group only at the end of its exit, which tears down what
# it held last (its tmpfs mounts' inodes: seconds at the largest workspace). A session
# is never opened in a group not yet empty (an attack review: the next jobs ended
# `error`, EBUSY on the memory limit, or `memory_exceeded` under the leftover's charge).
SLOT_KILL_WAIT_S = 60.0

# Docker backend: the image jobs run in unless they name another (built by ops/images/).
DOCKER_IMAGE = "sandfarm/sandbox:latest"

# Local backends: find the sandfarm-exec helper beside the interpreter, else on PATH.
EXEC_HELPER_AUTO = "auto"

# The clean environment: only these names pass from the host, then the job's env.
ENV_ALLOWLIST = ("LANG", "LC_ALL", "TZ")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
