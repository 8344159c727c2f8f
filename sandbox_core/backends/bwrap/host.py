"""What bwrap is given on this host: the probe of what it can do, the command line every
job shares, and the /etc files written per job."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sandbox_core.childsetup import ChildSetup

WORK = "/workspace"
TMP = "/tmp"
SCRIPTS = "/.sandfarm/scripts"
INIT = "/.sandfarm/init"  # sandfarm-exec, bound in as the sandbox's pid 1
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
    options: tuple[str, ...] = ()  # --disable-userns where it works
    as_pid_1: bool = False  # --as-pid-1 works: an init of ours (or tini) can be pid 1

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


@cache
def tini() -> tuple[str, ...]:
    """tini as the job's pid 1 where the exec helper (our own init) is not built, if
    installed under /usr (which the sandbox sees).

    bwrap's own init outlives bwrap by a moment, so every step would leave it to the
    host's init to reap, counted against the slot uid's process limit until then (for a
    second or more on some hosts). With --as-pid-1 bwrap waits for the init itself,
    which exits only once everything in the namespace is gone: no orphan, no zombie.
    """
    path = shutil.which("tini", path="/usr/bin:/usr/sbin")
    if path is None or not os.path.realpath(path).startswith("/usr/"):
        return ()
    return (path, "--")


def _run_probe(bwrap: str, options: tuple[str, ...]) -> subprocess.CompletedProcess[bytes]:
    argv = [bwrap, *static_args(), *options, "--remount-ro", "/", "--", "true"]
    root = os.geteuid() == 0
    setup = ChildSetup(uid=PROBE_UID, gid=PROBE_UID) if root else ChildSetup()
    return subprocess.run(
        argv, capture_output=True, timeout=30, preexec_fn=setup, env={"PATH": "/usr/bin:/bin"}
    )


@cache
def probe() -> Probe:
    """Run bwrap once with the jobs' namespaces, as an unprivileged uid; cached.

    Tries the strongest setup first, then without what an older bubblewrap lacks; reports
    why bwrap cannot run at all if it cannot.
    """
    path = shutil.which("bwrap")
    if path is None:
        return Probe(None, False, "bwrap not found on PATH (apt-get install bubblewrap)")
    result = None
    for options, note in [
        (("--disable-userns",), ""),
        ((), " (bubblewrap < 0.8: no --disable-userns)"),
    ]:
        try:
            result = _run_probe(path, options)
            if result.returncode != 0:
                continue
            as_pid_1 = _run_probe(path, (*options, "--as-pid-1")).returncode == 0
        except (OSError, subprocess.SubprocessError) as exc:
            return Probe(path, False, f"{path} failed to start: {exc}")
        return Probe(path, True, "bwrap works unprivileged" + note, options, as_pid_1)
    assert result is not None
    reason = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
    return Probe(path, False, f"{path} cannot build its namespaces here: {reason}")


def etc_files(uid: int, gid: int) -> dict[str, str]:
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


ETC_WRITTEN = tuple(etc_files(0, 0))
