"""Files in and out of a container as bounded tar/head/tail streams over exec.

The archive API cannot reach a tmpfs workspace under a read-only root, so the farm runs
small helper commands in the container (as the job's uid) and bounds what it reads of
their output by sizes it listed first.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass

from sandbox_core import defaults as d
from sandbox_core.backends.docker.containers import WORKSPACE
from sandbox_core.collectmatch import Matcher, OutOfTime
from sandbox_core.errors import CollectStoppedError
from sandbox_core.models import CollectedFile
from sandbox_core.output import HeadTailBuffer, json_size
from sandbox_core.workspace import encode_collected

MAX_LISTED_FILES = 10_000
# Run a helper command in the container: (argv, stdin, output budget) -> its stdout.
HelperRun = Callable[[list[str], bytes | None, int], bytes]


@dataclass
class CollectPlan:
    """Which matching files come whole (one tar), which by their head, how many not;
    ``stopped``: matching used its time (collectmatch.py) before the listing's end."""

    whole: list[str]
    partial: list[tuple[str, int]]
    omitted: int
    stopped: bool = False


def plan_collect(sizes: dict[str, int], patterns: list[str]) -> CollectPlan:
    """Plan from the listed sizes within the collect bounds (files, bytes per file, total)."""
    plan = CollectPlan([], [], 0)
    budget = d.COLLECT_MAX_TOTAL_BYTES
    matcher = Matcher(patterns)
    for name in sorted(sizes):
        try:
            if not matcher.matches(name):
                continue
        except OutOfTime:
            plan.stopped = True
            break
        limit = min(d.COLLECT_MAX_FILE_BYTES, budget)
        if len(plan.whole) + len(plan.partial) >= d.COLLECT_MAX_FILES or limit <= 0:
            plan.omitted += 1
        elif sizes[name] <= limit:
            plan.whole.append(name)
            budget -= sizes[name]
        else:
            plan.partial.append((name, limit))
            budget -= limit
    return plan


def _raw(path: str) -> bytes:
    """A listed name's bytes as the file system has them."""
    return path.encode("utf-8", "surrogateescape")


def tar_of(files: dict[str, bytes], uid: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid = len(content), 0o644, uid, uid
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def regular_members(data: bytes) -> dict[str, bytes]:
    """Regular files of a tar stream; what a torn stream lost is left out."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            for info in tar:
                handle = tar.extractfile(info) if info.isreg() else None
                if handle is not None:
                    found[info.name.removeprefix("./")] = handle.read()
    except tarfile.TarError:
        pass  # keep what was read; the rest is reported omitted
    return found


class FileTransfer:
    def __init__(self, run: HelperRun, uid: int) -> None:
        self._run = run
        self.uid = uid

    def put(self, files: dict[str, bytes], root: str = WORKSPACE) -> None:
        # tar refuses members that leave the directory and does not follow symlinks for
        # the final component unless told; --no-overwrite-dir keeps workspace modes.
        argv = ["tar", "-x", "--no-same-owner", "--no-overwrite-dir", "-C", root, "-f", "-"]
        self._run(argv, tar_of(files, self.uid), d.MIB)

    def list_files(self) -> dict[str, int]:
        """Regular files of the workspace -> size; NUL-separated, so any name survives."""
        # a directory the job made unreadable is left out, not an error that failed the
        # whole listing (an attack review: one `chmod 000` dir lost every file's collect)
        argv = ["find", ".", "-type", "d", "(", "!", "-readable", "-o", "!", "-executable", ")"]
        argv += ["-prune", "-o", "-type", "f", "-printf", "%s\\t%P\\0"]
        raw = self._run(argv, None, 4 * d.MIB)
        files: dict[str, int] = {}
        # every whole record ends in a NUL: what follows the last is a listing cut at its
        # budget mid-name (an attack review: that partial path failed the whole collect)
        for record in raw.split(b"\0")[:-1][:MAX_LISTED_FILES]:
            size, _, name = record.partition(b"\t")
            if name and size.isdigit():
                files[name.decode("utf-8", "surrogateescape")] = int(size)
        return files

    def head(self, path: str, count: int) -> bytes:
        if count <= 0:
            return b""
        return self._run(["head", "-c", str(count), "--", path], None, count)

    def read_into(self, path: str, buffer: HeadTailBuffer) -> None:
        path = os.path.normpath(path)
        size = self.list_files().get(path)
        if size is None:
            raise FileNotFoundError(f"{path} is not a regular file in the workspace")
        head = self.head(path, min(size, buffer.head_limit))
        buffer.write(head)
        rest = size - len(head)
        if rest > 0:  # the tail separately, bounded; what lies between is only counted
            want = min(rest, buffer.tail_limit)
            tail = self._run(["tail", "-c", str(want), "--", path], None, want)
            buffer.total += rest - len(tail)
            buffer.write(tail)

    def whole_files(self, paths: list[str], sizes: dict[str, int]) -> dict[str, bytes]:
        """Regular files among ``paths``, whole, in one tar stream sized from the listing."""
        if not paths:
            return {}
        # each member's header, and a name past 99 bytes its own header and blocks (GNU
        # LongLink: a review saw files of ~4 KB names omitted for lack of room)
        names_room = sum(1024 + 512 * (len(_raw(p)) // 512 + 1) for p in paths if len(p) > 99)
        budget = sum(sizes[p] for p in paths) + 2048 * (len(paths) + 4) + 10240 + names_room
        # Names go NUL-separated on stdin, verbatim: never parsed as options or escapes.
        names = b"".join(_raw(p) + b"\0" for p in paths)
        argv = ["tar", "-c", "-f", "-", "--null", "--verbatim-files-from", "-T", "-"]
        return regular_members(self._run(argv, names, budget))

    def collect(self, patterns: list[str]) -> tuple[list[CollectedFile], int]:
        sizes = self.list_files()
        plan = plan_collect(sizes, patterns)
        contents = self.whole_files(plan.whole, sizes)
        for name, limit in plan.partial:
            contents[name] = self.head(name, limit)
        # Each file within what is left of the budget as serialised, as L1's collect:
        # its raw size as the limit turned every text file with an escape into base64
        # of three quarters of it (a review).
        collected: list[CollectedFile] = []
        budget = d.COLLECT_MAX_TOTAL_BYTES
        for name in sorted(contents):
            limit = min(d.COLLECT_MAX_FILE_BYTES, budget)
            if name in sizes and limit > 0:  # else left out, counted below
                collected.append(encode_collected(name, sizes[name], contents[name], limit))
                budget -= json_size(collected[-1].content)
        wanted = len(plan.whole) + len(plan.partial)
        omitted = plan.omitted + wanted - len(collected)
        if plan.stopped:
            raise CollectStoppedError(collected, omitted)
        return collected, omitted
