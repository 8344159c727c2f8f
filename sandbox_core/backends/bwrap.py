"""L2: the bubblewrap sandbox. The process sandbox's slot, uid, rlimits and cgroup, plus
fresh user, pid, mount, network, IPC, UTS and cgroup namespaces around every step.

The job sees a read-only /usr, a handful of /etc files (passwd, group and hosts are
written per job, never the host's), its workspace at /workspace, a private /tmp and
/dev/shm, minimal /dev and /proc, and nothing else of the host: no /home, /root, /run,
host /tmp or worker files. Everything outside /workspace, /tmp and /dev/shm is
read-only. bwrap runs unprivileged (it is not setuid on Debian): ChildSetup drops to the
slot uid and sets no_new_privs first, and bwrap builds the namespaces in a user namespace.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import subprocess
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sandbox_core import slots
from sandbox_core.backends.base import Protection
from sandbox_core.backends.local import Launch, LocalBackend, LocalSession, SandboxPaths
from sandbox_core.childsetup import ChildSetup, bytes_memfd
from sandbox_core.errors import ProtectionUnavailableError
from sandbox_core.models import ExecStep, JobSpec
from sandbox_core.runner import ExecOutcome, signal_from_init_status

WORK = "/workspace"
TMP = "/tmp"
SCRIPTS = "/.sandfarm/scripts"
HOSTNAME = "sandbox"
# An unprivileged uid for the one-off probe, so it runs bwrap as the jobs will.
PROBE_UID = 65534

# System trees, bound read-only; on a merged-/usr host /bin etc. are symlinks into /usr.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Host /etc entries a program may need and that hold no secret, shown read-only if present.
# Each bind costs bwrap a mount, so the list stays short; links into /usr cost nothing.
ETC_ENTRIES = (
    "ld.so.cache",
    "alternatives",
    "localtime",
    "timezone",
    "services",
    "protocols",
    "os-release",
)
# Only useful with network access.
ETC_NETWORK_ENTRIES = ("resolv.conf", "gai.conf", "ssl/certs", "ssl/openssl.cnf")
# Written per job, never the host's: /etc/<name> links to SANDBOX_ETC/<name>.
SANDBOX_ETC = "/.sandfarm/etc"


@dataclass(frozen=True)
class Probe:
    """Whether bwrap runs here as an unprivileged uid would run it, and with which options."""

    path: str | None
    ok: bool
    detail: str
    options: tuple[str, ...] = ()  # --disable-userns, --as-pid-1 where they work
    init: tuple[str, ...] = ()  # the pid 1 the job runs under, when not bwrap's own

    @property
    def disable_userns(self) -> bool:
        return "--disable-userns" in self.options


def _etc_args(entries: tuple[str, ...]) -> list[str]:
    """Bind each host /etc entry read-only, or copy it as a link when it points into /usr."""
    args: list[str] = []
    for entry in entries:
        host = f"/etc/{entry}"
        if os.path.islink(host):
            target = os.path.realpath(host)
            if target.startswith("/usr/") and os.path.exists(target):
                args += ["--symlink", target, host]
                continue
        if os.path.exists(host):
            args += ["--ro-bind", host, host]
    return args


def _system_args() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


@cache
def network_etc_args() -> tuple[str, ...]:
    return tuple(_etc_args(ETC_NETWORK_ENTRIES))


@cache
def static_args() -> tuple[str, ...]:
    """The part of the command line every job shares (computed once per process)."""
    args = [
        "--unshare-all",
        "--unshare-user",  # explicit: fail rather than silently skip the user namespace
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into a terminal the worker might hold
        "--cap-drop",
        "ALL",
        "--hostname",
        HOSTNAME,
        *_system_args(),
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--dir",
        "/var",
        "--symlink",
        TMP,
        "/var/tmp",
    ]
    python_config = tuple(p.name for p in sorted(Path("/etc").glob("python3.*")))  # Debian's
    args += _etc_args(ETC_ENTRIES + python_config)  # sitecustomize, which site.py imports
    for name in ETC_WRITTEN:
        args += ["--symlink", f"{SANDBOX_ETC}/{name}", f"/etc/{name}"]
    return tuple(args)


def _tini() -> tuple[str, ...]:
    """tini as the job's pid 1, if installed under /usr (which the sandbox sees).

    bwrap's own init outlives bwrap by a moment, so every step would leave it to the
    host's init to reap, counted against the slot uid's process limit until then (for a
    second or more on some hosts). With --as-pid-1 bwrap waits for tini itself, and tini
    exits only once everything in the namespace is gone: no orphan, no zombie.
    """
    path = shutil.which("tini", path="/usr/bin:/usr/sbin")
    if path is None or not os.path.realpath(path).startswith("/usr/"):
        return ()
    return (path, "--")


def _run_probe(bwrap: str, probe: Probe) -> subprocess.CompletedProcess[bytes]:
    argv = [bwrap, *static_args(), *probe.options, "--remount-ro", "/", "--"]
    argv += [*probe.init, "true"]
    root = os.geteuid() == 0
    setup = ChildSetup(uid=PROBE_UID, gid=PROBE_UID) if root else ChildSetup()
    return subprocess.run(
        argv, capture_output=True, timeout=30, preexec_fn=setup, env={"PATH": "/usr/bin:/bin"}
    )


@cache
def probe() -> Probe:
    """Run bwrap once with the jobs' namespaces, as an unprivileged uid; cached.

    Tries the strongest setup first, then without the parts an older bubblewrap or a
    host without tini lacks; reports why bwrap cannot run at all if it cannot.
    """
    path = shutil.which("bwrap")
    if path is None:
        return Probe(None, False, "bwrap not found on PATH (apt-get install bubblewrap)")
    tini = _tini()
    candidates = [
        Probe(path, True, "bwrap works unprivileged" + note, options + init_options, init)
        for options, note in [
            (("--disable-userns",), ""),
            ((), " (bubblewrap < 0.8: no --disable-userns)"),
        ]
        for init, init_options in ([(tini, ("--as-pid-1",))] if tini else []) + [((), ())]
    ]
    result = None
    for candidate in candidates:
        try:
            result = _run_probe(path, candidate)
        except (OSError, subprocess.SubprocessError) as exc:
            return Probe(path, False, f"{path} failed to start: {exc}")
        if result.returncode == 0:
            return candidate
    assert result is not None
    reason = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
    return Probe(path, False, f"{path} cannot build its namespaces here: {reason}")


class BwrapSession(LocalSession):
    """A LocalSession with the per-job files only the sandbox sees: /etc and /dev/shm."""

    def __init__(self, backend: LocalBackend, spec: JobSpec, slot: slots.Slot) -> None:
        super().__init__(backend, spec, slot)
        try:
            self.etc = self.ws.root / "etc"  # worker-owned: the job reads, never edits
            self.etc.mkdir(mode=0o755)
            uid = self.slot.uid if self.slot.uid is not None else os.getuid()
            gid = self.slot.gid if self.slot.gid is not None else os.getgid()
            for name, text in _etc_files(uid, gid).items():
                (self.etc / name).write_text(text)
                (self.etc / name).chmod(0o644)
            self.shm = self.ws.root / "shm"
            self.shm.mkdir(mode=0o700)
            if self.slot.uid is not None:
                os.chown(self.shm, uid, gid)
        except BaseException:
            self.close()
            raise

    def exec(
        self, step: ExecStep, index: int, deadline: float, cancel: threading.Event | None
    ) -> ExecOutcome:
        outcome = super().exec(step, index, deadline, cancel)
        # bwrap reports a child killed by signal N as exit status 128+N; give the signal
        # back so classification matches the other backends (a program that itself
        # exits with 129..192 is read as killed by that signal: bwrap cannot tell).
        signal_from_init_status(outcome)
        return outcome


def _etc_files(uid: int, gid: int) -> dict[str, str]:
    """passwd, group, hosts, nsswitch.conf and hostname naming only the sandbox's own."""
    return {
        "passwd": (
            "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"sandbox:x:{uid}:{gid}:sandbox:{WORK}:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        "hostname": f"{HOSTNAME}\n",
    }


ETC_WRITTEN = tuple(_etc_files(0, 0))


class BwrapBackend(LocalBackend):
    name = "bwrap"
    session_class = BwrapSession
    helper_processes = 2  # bwrap outside, and the init (tini or bwrap's) as pid 1 inside

    def protections(self) -> list[Protection]:
        found = probe()
        common = self.common_protections()
        if not found.ok:
            off = found.detail
            return [
                *common,
                Protection("tree_kill", False, off),
                Protection("network_isolation", False, off),
                Protection("pid_namespace", False, off),
                Protection("filesystem_isolation", False, off),
                Protection("nested_userns_blocked", False, off),
            ]
        host_kill = self.tree_kill_protection()
        init = os.path.basename(found.init[0]) if found.init else "bwrap"
        pid_ns = f"pid namespace: its init ({init}) takes every process down with it"
        kill_detail = f"{host_kill.detail}; {pid_ns}" if host_kill.active else pid_ns
        return [
            *common,
            Protection("tree_kill", True, kill_detail),
            Protection(
                "network_isolation",
                True,
                "the slot's loopback-only network namespace, where the job holds no capability"
                if self.is_root
                else "bwrap's own network namespace, loopback only",
            ),
            Protection(
                "pid_namespace",
                True,
                "the job sees and signals only its own processes"
                + ("" if found.init else "; no tini: the host's init reaps bwrap's init"),
            ),
            Protection(
                "filesystem_isolation",
                True,
                "read-only /usr and a few /etc files; private /workspace, /tmp, /dev/shm;"
                " no /home, /root, /run, host /tmp or worker files",
            ),
            Protection(
                "nested_userns_blocked",
                found.disable_userns,
                "--disable-userns: no namespaces inside the sandbox"
                if found.disable_userns
                else "bubblewrap < 0.8: the job may create user namespaces",
            ),
        ]

    def required_protections(self, spec: JobSpec) -> list[str]:
        return [*super().required_protections(spec), "pid_namespace", "filesystem_isolation"]

    def check(self, spec: JobSpec) -> None:
        found = probe()
        if not found.ok:  # even allow_weaker cannot run a sandbox without bwrap
            raise ProtectionUnavailableError("filesystem_isolation", found.detail)
        super().check(spec)

    def sandbox_paths(self, session: LocalSession) -> SandboxPaths:
        return SandboxPaths(work=WORK, tmp=TMP, scripts=SCRIPTS)

    def wrap(self, session: LocalSession, argv: list[str], env: dict[str, str]) -> Launch:
        assert isinstance(session, BwrapSession)
        found = probe()
        ws, slot = session.ws, session.slot
        # The options (the job's environment among them) reach bwrap through --args, a
        # memfd: never on its command line, which other uids can read in /proc. bwrap
        # itself runs with a fixed environment, so the job's LD_PRELOAD cannot subvert it.
        args = [*static_args(), *found.options, "--clearenv"]
        for name, value in env.items():
            args += ["--setenv", name, value]
        if session.spec.limits.network:
            args += ["--share-net", *network_etc_args()]
        elif self.joins_slot_network(session):
            args.append("--share-net")  # the slot's namespace, joined in child_setup
        if slot.uid is not None:
            args += ["--uid", str(slot.uid), "--gid", str(slot.gid)]
        args += [
            "--ro-bind",
            str(session.etc),
            SANDBOX_ETC,
            "--bind",
            str(ws.work),
            WORK,
            "--bind",
            str(ws.tmp),
            TMP,
            "--bind",
            str(session.shm),
            "/dev/shm",
            "--ro-bind",
            str(session.scripts),
            SCRIPTS,
            "--chdir",
            WORK,
            "--remount-ro",  # last: / and /dev read-only, the binds above stay as they are
            "/",
            "--remount-ro",
            "/dev",
        ]
        fd = bytes_memfd("sandfarm-bwrap-args", b"".join(a.encode() + b"\0" for a in args))
        command = [found.path or "bwrap", "--args", str(fd), "--", *found.init, *argv]
        return Launch(command, {"PATH": "/usr/bin:/bin"}, [fd])

    def joins_slot_network(self, session: LocalSession) -> bool:
        """As root, a job without network joins its slot's pinned loopback-only namespace
        (as the process backend does) rather than paying for a new one per step."""
        return self.is_root and not session.spec.limits.network

    def child_setup(self, session: LocalSession) -> ChildSetup:
        setup = self.base_child_setup(session, private_net=False)
        if self.joins_slot_network(session):
            setup = dataclasses.replace(setup, netns_fd=session.slot.network_namespace())
        # RLIMIT_NPROC counts bwrap's own processes too.
        rlimits = [
            (res, soft + self.helper_processes, hard + self.helper_processes)
            if res == resource.RLIMIT_NPROC
            else (res, soft, hard)
            for res, soft, hard in setup.rlimits
        ]
        return dataclasses.replace(setup, rlimits=rlimits)
