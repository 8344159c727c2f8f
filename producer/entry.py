"""The `sandfarm` executable: the CLI, started and ended cheaply.

A short command (`batch run` of a few hundred jobs, `status`, `--help`) spends a good
share of its time in Python's start and end (a fifth of a 164-job `batch run`;
ops/bench/RESULTS.md):

- The CLI's imports build some 40,000 objects the cyclic collector tracks, next to none
  of them garbage; it scans them some 120 times while they load (~10% of the import,
  here). It is off until they are in, and what they built is then frozen (later
  collections skip it).
- Interpreter teardown frees every module and object one by one (~0.1 s here) although
  the process is about to end. So once the command has returned, its atexit handlers
  run, stdout and stderr are flushed, and the process ends at once (os._exit). Where
  that would lose or change something, Python's own exit is kept: a non-daemon thread
  still running (Python waits for it), a stream that cannot be flushed (a closed pipe:
  Python reports it as it always has), an exit message or a code outside 0-255.

Only the installed `sandfarm` script ends so: `python -m producer.cli` keeps Python's
exit, for the profilers and debuggers that wrap it.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    import click


def main() -> NoReturn:
    """The console script."""
    gc.disable()
    try:
        from producer.cli import main as command
    finally:
        gc.enable()
    gc.freeze()
    finish(command)


def finish(command: click.Command) -> NoReturn:
    """Run ``command`` as a standalone click program, then end the process."""
    try:
        command.main()
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code
    else:  # standalone click always exits; a command that returns means success
        code = 0
    # Python's exit where ours could differ: a message to print (sys.exit("text")), a
    # code the OS would truncate, a thread Python would wait for.
    if not isinstance(code, int) or not 0 <= code <= 255 or _others_running():
        sys.exit(code)
    atexit._run_exitfuncs()  # what Python's exit would run: logging's flush, temp dirs
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # a closed pipe: Python's exit reports it as it would
        sys.exit(code)
    os._exit(code)


def _others_running() -> bool:
    """A non-daemon thread besides this one is alive (Python's exit would wait for it)."""
    main_thread = threading.main_thread()
    return any(
        t is not main_thread and not t.daemon and t.is_alive() for t in threading.enumerate()
    )
