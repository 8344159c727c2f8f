"""The security suite checks itself: each of its tests first proves that its attack ran
(a positive control), so against do-nothing fake backends (tests/security/fakes.py:
rejected, error, an empty success, a failure) not one of them may pass.

The suite runs once per fake, the four runs at once, in subprocesses, with the
kernel-only tests (marked ``no_backend``) left out and ``--runxfail`` (a known-hole test
whose control never ran must not hide behind its xfail). Its own positive control: the
fake runs ran exactly the tests the real suite has (for one backend param), so a fake
run that collects or runs nothing cannot pass this test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import require
from tests.security.fakes import FAKE_ENV, FAKE_KINDS

ROOT = Path(__file__).resolve().parents[2]
SUITE = ["tests/security", "-m", "not no_backend", "-p", "no:cacheprovider", "-q"]
RUN_TIMEOUT_S = 600
# the backend param of a test id (real: process, bwrap, docker, docker-runsc; fake-KIND)
BACKEND_PARAM = re.compile(r"(?<=[\[-])(docker-runsc|process|bwrap|docker|fake-[a-z]+)(?=[\]-])")


def _env(fake: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (FAKE_ENV, "PYTEST_ADDOPTS")}
    if fake is not None:
        env[FAKE_ENV] = fake
    return env


def _pytest(args: list[str], fake: str | None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *SUITE, *args],
        cwd=ROOT,
        env=_env(fake),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _normalised(node_id: str) -> str:
    return BACKEND_PARAM.sub("BACKEND", node_id)


def _node_id(case: ET.Element) -> str:
    """The pytest node id of a junit testcase (tests.security.test_x + name)."""
    parts = (case.get("classname") or "").split(".")
    modules = [p for p in parts if not p[:1].isupper()]  # test classes start upper-case
    classes = [p for p in parts if p[:1].isupper()]
    return "::".join(["/".join(modules) + ".py", *classes, case.get("name") or ""])


def _outcomes(junit: Path) -> dict[str, str]:
    """node id -> passed, failed, error or 'skipped: reason'."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = f"skipped: {child.get('message', '')}"
        found[_node_id(case)] = outcome
    return found


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_no_security_test_passes_against_a_do_nothing_backend(tmp_path):
    require(os.geteuid() == 0, "the security suite's attacks need root (slot uids)")
    real = _pytest(["--collect-only"], fake=None)
    runs = {
        kind: _pytest(["--runxfail", f"--junitxml={tmp_path / kind}.xml"], fake=kind)
        for kind in FAKE_KINDS
    }
    real_out = real.communicate(timeout=RUN_TIMEOUT_S)[0]
    outputs = {kind: proc.communicate(timeout=RUN_TIMEOUT_S)[0] for kind, proc in runs.items()}

    # the control: the real suite collects, and each fake run ran exactly its tests
    assert real.returncode == 0, real_out[-3000:]
    expected = {_normalised(line) for line in real_out.splitlines() if "::" in line}
    assert len(expected) > 50, real_out[-3000:]
    offenders: list[str] = []
    for kind, proc in runs.items():
        # 1: tests ran and failed; anything else (usage, internal error, none collected) is
        # the run's own failure
        assert proc.returncode == 1, f"fake {kind}: exit {proc.returncode}\n{outputs[kind][-3000:]}"
        outcomes = _outcomes(tmp_path / f"{kind}.xml")
        ran = {_normalised(node_id) for node_id in outcomes}
        assert len(outcomes) == len(expected), (
            f"fake {kind} ran {len(outcomes)} tests, the real suite has {len(expected)}"
        )
        missing, extra = sorted(expected - ran)[:10], sorted(ran - expected)[:10]
        assert ran == expected, f"fake {kind}: missing {missing}, extra {extra}"
        offenders += [
            f"{kind}: {node_id} {outcome}"
            for node_id, outcome in sorted(outcomes.items())
            if outcome not in ("failed", "error")
        ]
    assert not offenders, (
        "security tests that do not fail against a backend that runs nothing (their attack"
        " never ran, so they prove nothing):\n  " + "\n  ".join(offenders)
    )
