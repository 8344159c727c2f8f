"""One sample as one farm job (the trusted harness as its step, the problem as a file,
the verdict nonce on stdin), and the verdict read back from its result."""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
from importlib.resources import files
from pathlib import Path
from typing import Any

from producer.eval.problems import Problem, Sample
from sandbox_core import SpecError

HARNESS = files("producer.eval").joinpath("harness.py").read_text(encoding="utf-8")
HARNESS_VERSION = hashlib.sha256(HARNESS.encode()).hexdigest()[:12]
RECORD_TAG = "SANDFARM-EVAL"  # harness.RECORD_TAG (the harness imports nothing of ours)
HARNESS_MARGIN_S = 10.0  # the job's wall limit over the sample's: the harness starts, forks
PASSED, TIMED_OUT = "passed", "timed out"
MAX_LABEL = 200


class Keyring:
    """The run's secret (a 0600 file beside the samples): job ids and verdict nonces are
    HMACs of it, the same on a rerun (resume), never guessable by a solution."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    @classmethod
    def at(cls, path: Path) -> Keyring:
        """The key at ``path``, made on first use. An existing one counts only as a
        regular file of this user's, private to it: whoever could plant or read the key
        could forge every verdict of the run (and its resumed results)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return cls(_read_private_key(path))
        key = secrets.token_bytes(32)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex() + "\n")
        return cls(key)

    def mac(self, *parts: object) -> str:
        return hmac.new(self.key, json.dumps(parts).encode(), hashlib.sha256).hexdigest()


def _read_private_key(path: Path) -> bytes:
    afresh = "(delete it, and its _farm.jsonl, to start the run afresh)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        reason = "a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise SpecError(str(path), f"{reason} {afresh}") from None
    with os.fdopen(fd) as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(str(path), f"not a regular file {afresh}")
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise SpecError(
                str(path),
                f"not private to this user (owner uid {info.st_uid},"
                f" mode {stat.S_IMODE(info.st_mode):o}) {afresh}",
            )
        text = fh.read(1000)
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise SpecError(str(path), f"not the hex key sandfarm wrote {afresh}") from None
    if len(key) < 16:
        raise SpecError(str(path), f"too short a key {afresh}")
    return key


def sample_spec(
    sample: Sample, problem: Problem, timeout: float, keys: Keyring, suite: str
) -> dict[str, Any]:
    """The JobSpec (as JSON) that evaluates ``sample``; its id names this exact sample."""
    job_id = (
        "eval-"
        + keys.mac(
            "id",
            HARNESS_VERSION,
            sample.line,
            sample.task_id,
            sample.completion,
            timeout,
            problem.test,
        )[:32]
    )
    task = {
        "prompt": problem.prompt,
        "completion": sample.completion,
        "test": problem.test,
        "entry_point": problem.entry_point,
        "style": problem.style,
        "timeout": timeout,
    }
    return {
        "id": job_id,
        "steps": [{"kind": "python", "code": HARNESS, "stdin": keys.mac("nonce", job_id) + "\n"}],
        "files": {"problem.json": json.dumps(task)},
        "limits": {"timeout_s": timeout + HARNESS_MARGIN_S},
        "labels": {"task": sample.task_id[:MAX_LABEL], "sample": str(sample.line), "suite": suite},
    }


def verdict(record: dict[str, Any], keys: Keyring) -> str:
    """``passed`` / ``timed out`` / ``failed: ...`` from a JobResult (as JSON). Only the
    harness's record with this job's nonce counts, and ``passed`` needs the job to have
    succeeded too: anything else (no record, a forged one, a killed harness) fails."""
    status = str(record.get("status"))
    nonce = keys.mac("nonce", str(record.get("id")))
    steps = record.get("steps") or [{}]
    stdout = str(steps[0].get("stdout") or "")
    genuine = [
        line.split(" ", 2)[2]
        for line in stdout.splitlines()
        if line.startswith(f"{RECORD_TAG} ") and line.split(" ", 2)[1:2] == [nonce]
    ]
    if len(genuine) == 1:
        try:
            result = json.loads(genuine[0])["result"]
        except (ValueError, KeyError, TypeError):
            result = None
        known = isinstance(result, str) and result.startswith(("passed", "timed out", "failed"))
        if known and (result != PASSED or status == "succeeded"):
            return str(result)
    if status == "timed_out":
        return TIMED_OUT
    message = record.get("message") or ""
    return f"failed: no verdict from the harness (job {status}{': ' if message else ''}{message})"
