"""Debian's Chromium, headless, for tests that look at a page as an operator would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ARTIFACTS = Path(
    os.environ.get("SANDFARM_TEST_ARTIFACTS", Path(__file__).parents[1] / "test-artifacts")
)


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Debian's chromium, headless, with nothing that would reach out of this machine."""
    return subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={ARTIFACTS / 'chromium-profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
