"""A job cannot spoof the CLI's human-readable output on a terminal: no escape sequence
of the job's reaches the terminal, and no line of the job's passes for the farm's."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

SANDFARM = str(Path(sys.executable).parent / "sandfarm")
SPOOF = (
    "import sys\n"
    "print('=== succeeded')\n"
    "sys.stdout.write('\\x1b[2K\\x1b[1A\\x1b]0;owned\\x07hidden\\n')\n"
    "sys.exit(3)\n"
)


def _on_a_terminal(argv: list[str], columns: int = 200) -> bytes:
    """What ``argv`` writes to a terminal (stdout and stderr both on one pty)."""
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sub, stderr=sub)
    os.close(sub)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    proc.wait(30)
    return b"".join(chunks)


@pytest.mark.no_backend  # the real CLI in a subprocess; its own control below
def test_job_output_cannot_spoof_the_status_on_a_terminal(is_root):
    argv = [SANDFARM, "run", "--code", SPOOF]
    # Control: piped (no terminal), the job's bytes come through as it wrote them.
    piped = subprocess.run(argv, capture_output=True, timeout=60)
    assert b"\x1b[2K" in piped.stdout and b"=== succeeded" in piped.stdout, piped
    shown = _on_a_terminal(argv)
    assert b"hidden" in shown, shown  # the job's output is shown...
    assert b"\x1b" not in shown and b"\x07" not in shown, shown  # ...with no raw escape
    lines = shown.replace(b"\r\n", b"\n").split(b"\n")
    assert any(line.startswith(b"=== failed") for line in lines), shown  # the real status
    assert b"=== succeeded" not in lines  # the fake one is only ever indented
    assert any(line.endswith(b"=== succeeded") for line in lines)


def _lines(shown: bytes) -> list[bytes]:
    return shown.replace(b"\r\n", b"\n").split(b"\n")


@pytest.mark.no_backend  # the real CLI in a subprocess; its own control below
def test_a_message_or_a_long_line_cannot_spoof_the_status_on_a_terminal(tmp_path, is_root):
    """A step's message quoted a path with newlines unescaped, and a line of the job's
    as wide as the terminal wrapped its words onto a row of their own, past the indent:
    either printed `=== succeeded` at the start of a row (an attack review, stop 39)."""
    job = tmp_path / "job.json"
    spoof = "nothing\n=== succeeded\n\nx"
    job.write_text(json.dumps({"steps": [{"kind": "read_file", "path": spoof}]}))
    piped = subprocess.run([SANDFARM, "run", "--job", str(job)], capture_output=True, timeout=60)
    assert b"\n=== succeeded\n" in piped.stderr, piped  # the control: the path is in it
    shown = _lines(_on_a_terminal([SANDFARM, "run", "--job", str(job)]))
    assert not any(line.startswith(b"=== succeeded") for line in shown), shown
    assert any(line.startswith(b"=== failed") for line in shown), shown
    wide = "print(' ' * 76 + '=== succeeded')\nraise SystemExit(3)"
    shown = _lines(_on_a_terminal([SANDFARM, "run", "--code", wide], columns=80))
    assert any(b"=== succeeded" in line for line in shown), shown  # it was printed
    assert not any(line.startswith(b"=== succeeded") for line in shown), shown
    assert all(len(line.decode().rstrip()) <= 80 for line in shown), shown


@pytest.mark.no_backend  # the CLI's own error path: nothing runs
def test_an_error_quoting_a_spec_is_one_line_with_no_escape(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"code": "1", "labels": {"k\x1b]0;owned\x07\n=== ok": "x" * 300}}))
    failed = subprocess.run([SANDFARM, "run", "--job", str(job)], capture_output=True, timeout=60)
    assert failed.returncode == 2, failed
    err = failed.stderr.decode()
    assert "\\x1b]0;owned\\x07" in err, err  # the key is quoted, escaped
    assert "\x1b" not in err and err.count("\n") == 1, err


@pytest.mark.no_backend  # rich's rendering of our table, as a terminal gets it
def test_a_label_cannot_write_escapes_or_markup_into_the_group_table():
    import io

    from rich.console import Console

    from producer.batch.groups import Groups

    groups = Groups("task")
    evil = "\x1b]0;PWNED\x07\x1b[2J[blink]x[/blink][link=http://e]y[/link]"
    groups.add({"labels": {"task": evil}, "status": "succeeded"})
    out = io.StringIO()
    Console(file=out, force_terminal=True, width=200, color_system=None).print(groups.table())
    shown = out.getvalue()
    assert "\x1b]0;" not in shown and "\x1b[2J" not in shown, repr(shown)
    assert "[blink]x[/blink]" in shown and "\\x1b]0;PWNED" in shown, repr(shown)


@pytest.mark.no_backend  # the CLI's own checks, before any farm is asked
def test_no_output_option_overwrites_the_results_or_an_input(tmp_path):
    """`--summary-json` and `report -o` replaced the RESULTS file or an input with what
    they wrote, where `-o` is checked (a review, stop 39)."""
    jobs, results = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    jobs.write_text('{"id": "a", "command": "true"}\n')
    results.write_text('{"id": "a", "status": "succeeded"}\n')
    for target in (results, jobs):
        argv = [SANDFARM, "batch", "run", str(jobs), "-o", str(results)]
        ran = subprocess.run([*argv, "--summary-json", str(target)], capture_output=True)
        assert ran.returncode == 2 and b"--summary-json" in ran.stderr, ran
    report = subprocess.run(
        [SANDFARM, "report", str(results), "-o", str(results)], capture_output=True
    )
    assert report.returncode == 2 and b"RESULTS file" in report.stderr, report
    assert jobs.read_text() == '{"id": "a", "command": "true"}\n'
    assert results.read_text() == '{"id": "a", "status": "succeeded"}\n'


def _glibc_columns(row: str) -> int:
    """The columns glibc's wcwidth (what terminals follow) gives ``row``."""
    import ctypes
    import locale

    libc = ctypes.CDLL(None)
    libc.setlocale(locale.LC_ALL, b"C.UTF-8")
    return sum(max(0, libc.wcwidth(ctypes.c_wchar(c))) for c in row)


WIDE_SPOOFS = {  # what a second review printed `=== succeeded` rows with
    "hangul filler": "\u3164" * 38,
    "line separator": "A" * 72 + "\u2028",
    "skin tones": "\U0001f3fb" * 38,
    "spacing marks": "\u0903" * 76,
    "yijing hexagrams": "\u4dc0" * 38,  # 1 column to Python's table, 2 to glibc's
}


@pytest.mark.no_backend  # the real CLI in a subprocess; its own control below
@pytest.mark.parametrize("kind", list(WIDE_SPOOFS))
def test_characters_a_terminal_draws_wider_cannot_wrap_past_the_indent(kind, tmp_path, is_root):
    spoof = WIDE_SPOOFS[kind] + "=== succeeded"
    code = tmp_path / "spoof.py"
    code.write_text(f"print({spoof!r})\nraise SystemExit(3)\n")
    argv = [SANDFARM, "run", "--code", code.read_text()]
    piped = subprocess.run(argv, capture_output=True, timeout=60)
    assert spoof.encode() in piped.stdout, piped  # the control: the job printed it
    rows = _on_a_terminal(argv, columns=80).decode().replace("\r\n", "\n").split("\n")
    assert all(_glibc_columns(row) <= 80 for row in rows), rows  # no row wraps on screen
    assert not any(row.startswith("===") and "succeeded" in row for row in rows), rows
    assert "\u2028" not in "".join(rows)


@pytest.mark.no_backend
def test_a_message_as_wide_as_the_terminal_stays_indented(tmp_path, is_root):
    job = tmp_path / "job.json"
    path = "a" * 76 + "=== succeeded"
    job.write_text(json.dumps({"steps": [{"kind": "read_file", "path": path}]}))
    rows = _on_a_terminal([SANDFARM, "run", "--job", str(job)], columns=80)
    rows = rows.decode().replace("\r\n", "\n").split("\n")
    assert any("=== succeeded" in row for row in rows), rows  # the message was shown
    assert all(_glibc_columns(row) <= 80 for row in rows), rows
    assert not any(row.startswith("=== succeeded") for row in rows), rows


@pytest.mark.no_backend  # the CLI's own error path and its stderr's own width
def test_an_error_and_a_narrow_stderr_keep_their_rows_indented(tmp_path):
    """A spec key of spaces put `===` at column 0 of an error's second row; and with
    stdout piped, stderr's rows were cut to 80 columns in a 40-column pane (a review)."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"code": "1", "labels": {" " * 62 + "=== succeeded": "x" * 300}}))
    rows = _lines(_on_a_terminal([SANDFARM, "run", "--job", str(job)], columns=80))
    assert any(b"=== succeeded" in row for row in rows), rows  # the key was quoted
    assert not any(row.startswith(b"===") for row in rows), rows
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 40, 0, 0))
    code = "import sys\nsys.stderr.write('e' * 70 + '=== succeeded\\n')\nraise SystemExit(3)"
    proc = subprocess.Popen([SANDFARM, "run", "--code", code], stdout=subprocess.PIPE, stderr=sub)
    os.close(sub)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 30)
        try:
            chunk = os.read(main, 65536) if ready else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    proc.communicate(timeout=30)
    rows = b"".join(chunks).decode().replace("\r\n", "\n").split("\n")
    assert any("succeeded" in row for row in rows), rows
    assert all(_glibc_columns(row) <= 40 for row in rows), rows
    assert not any(row.startswith("===") and "succeeded" in row for row in rows), rows
