"""The `sandfarm` executable's quick exit (producer/entry.py) loses nothing Python's own
exit would keep: exit codes, buffered output, atexit handlers, a running thread's work, a
closed pipe's report. Each case runs a real interpreter, since the exit ends it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from producer import entry


def _program(body: str) -> str:
    """A click command ``c`` defined by ``body``, run through the executable's end."""
    head = "import sys, click\nfrom producer.entry import finish\n\n@click.command()\n"
    return head + textwrap.dedent(body) + "\nfinish(c)\n"


def _run(body: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _program(body)],
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,  # type: ignore[call-overload]
    )


def test_the_console_script_is_the_quick_entry():
    script = Path(sys.executable).parent / "sandfarm"
    assert "from producer.entry import main" in script.read_text()
    proc = subprocess.run([str(script), "schema"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "JobSpec" in json.dumps(json.loads(proc.stdout))  # all of it, parsed


@pytest.mark.parametrize(
    ("body", "code", "stderr"),
    [
        ("def c():\n    click.echo('done')\n", 0, ""),
        ("def c():\n    sys.exit(3)\n", 3, ""),
        ("def c():\n    sys.exit('went wrong')\n", 1, "went wrong"),
        ("def c():\n    raise click.UsageError('bad --flag')\n", 2, "bad --flag"),
        ("def c():\n    raise RuntimeError('a bug')\n", 1, "RuntimeError: a bug"),
        ("def c():\n    sys.exit(-1)\n", 255, ""),
        ("def c():\n    sys.exit(2**31)\n", 0, ""),  # as the OS truncates it, no traceback
    ],
)
def test_exit_codes_and_messages_are_pythons(body: str, code: int, stderr: str):
    proc = _run(body)
    assert proc.returncode == code, proc.stderr
    assert stderr in proc.stderr


def test_buffered_output_and_atexit_handlers_are_not_lost(tmp_path: Path):
    marker = tmp_path / "atexit"
    proc = _run(
        f"""
        def c():
            import atexit
            atexit.register(lambda: open({str(marker)!r}, "w").write("ran"))
            sys.stdout.write("x" * 5000)  # below the pipe's buffer: only the exit flushes it
            sys.stderr.write("to stderr")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "x" * 5000
    assert proc.stderr == "to stderr"
    assert marker.read_text() == "ran"


def test_a_running_thread_is_waited_for(tmp_path: Path):
    marker = tmp_path / "thread"
    proc = _run(
        f"""
        def c():
            import threading, time
            def work():
                time.sleep(0.5)
                open({str(marker)!r}, "w").write("finished")
            threading.Thread(target=work).start()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "finished"


def test_a_closed_pipe_ends_as_without_the_quick_exit():
    body = "def c():\n    import time\n    time.sleep(1)\n    sys.stdout.write('late')\n"
    ends = []
    for program in (_program(body), _program(body).replace("finish(c)", "c()")):
        proc = subprocess.Popen(
            [sys.executable, "-c", program],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the command writes
        ends.append((proc.wait(timeout=60), proc.stderr.read()))
    assert ends[0] == ends[1]
    assert ends[0][0] != 0  # the output was lost, and the exit code says so


def test_usage_names_the_program_as_invoked(tmp_path: Path):
    alias = tmp_path / "sf"
    alias.symlink_to(Path(sys.executable).parent / "sandfarm")
    proc = subprocess.run([str(alias), "nosuch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Usage: sf " in proc.stderr


def test_python_m_keeps_pythons_exit_for_profilers(tmp_path: Path):
    stats = tmp_path / "cli.prof"
    argv = [sys.executable, "-m", "cProfile", "-o", str(stats), "-m", "producer.cli", "--version"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stats.stat().st_size > 0  # the profiler got to write its results


def test_no_other_thread_means_quick_exit():
    assert entry._others_running() is False
