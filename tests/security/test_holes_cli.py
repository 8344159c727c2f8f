"""A job cannot spoof the CLI's human-readable output on a terminal: no escape sequence
of the job's reaches the terminal, and no line of the job's passes for the farm's."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

SANDFARM = str(Path(sys.executable).parent / "sandfarm")
SPOOF = (
    "import sys\n"
    "print('=== succeeded')\n"
    "sys.stdout.write('\\x1b[2K\\x1b[1A\\x1b]0;owned\\x07hidden\\n')\n"
    "sys.exit(3)\n"
)


def _on_a_terminal(argv: list[str]) -> bytes:
    """What ``argv`` writes to a terminal (stdout and stderr both on one pty)."""
    main, sub = pty.openpty()
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
