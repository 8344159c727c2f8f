"""Expected-output checks (what Judge0 users do): a step's stdout against the output it
must print. A mismatch is ``wrong_answer``; the message says where they first differ."""

from __future__ import annotations

from sandbox_core.models import Compare

_SHOWN = 40  # characters of each side shown in the message


def mismatch(stdout: str, truncated: bool, expected: str, compare: Compare) -> str | None:
    """None when ``stdout`` is what was expected, else why not (one line, bounded)."""
    if truncated:  # expected_stdout fits output_bytes (spec check): a longer stdout differs
        return "stdout was longer than limits.output_bytes, so not the expected output"
    if compare == "whitespace":
        got, want = stdout.split(), expected.split()
        if got == want:
            return None
        for index, (a, b) in enumerate(zip(got, want, strict=False)):
            if a != b:
                return f"word {index + 1}: got {_clip(a)}, expected {_clip(b)}"
        return f"got {len(got)} words, expected {len(want)}"
    if stdout == expected:
        return None
    got_lines, want_lines = stdout.split("\n"), expected.split("\n")
    for index, (a, b) in enumerate(zip(got_lines, want_lines, strict=False)):
        if a != b:
            return f"line {index + 1}: got {_clip(a)}, expected {_clip(b)}"
    return f"got {len(got_lines)} lines, expected {len(want_lines)} (newlines count)"


def _clip(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")
