"""A fresh private directory per job: seeded, guarded, collected, and always removed."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sandbox_core import defaults as d
from sandbox_core.collectmatch import Matcher, OutOfTime
from sandbox_core.errors import CollectStoppedError
from sandbox_core.models import CollectedFile
from sandbox_core.output import HeadTailBuffer, _complete_prefix_length, json_size
from sandbox_core.pathguard import resolve_inside

_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def mount_tmpfs(target: str, size_mb: int) -> None:
    # Root-owned and 0711: the job owns only work/ and tmp/ inside, so it can never
    # rename or replace what the worker writes here as root (step scripts).
    inodes = max(4096, size_mb * 256)  # bounds file count, not only bytes
    opts = f"size={size_mb}m,nr_inodes={inodes},mode=0711,uid=0,gid=0".encode()
    if _libc.mount(b"tmpfs", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {target}: {os.strerror(err)}")


def unmount(target: str) -> None:
    _libc.umount2(target.encode(), _MNT_DETACH)


@dataclass
class Workspace:
    """``root`` holds ``work`` (the job's cwd and HOME) and ``tmp`` (its TMPDIR)."""

    root: Path
    uid: int | None
    gid: int | None
    mounted: bool = False

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @classmethod
    def create(
        cls, base: Path, size_mb: int, uid: int | None = None, gid: int | None = None
    ) -> Workspace:
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o711)  # others may pass through to their own job dir, not list it
        root = base / f"job-{secrets.token_hex(8)}"
        root.mkdir(mode=0o700)
        ws = cls(root, uid, gid)
        try:
            if os.geteuid() == 0 and uid is not None:
                # A tmpfs bounds the workspace size and is removed in one unmount.
                mount_tmpfs(str(root), size_mb)
                ws.mounted = True
            for sub in (ws.work, ws.tmp):
                sub.mkdir(mode=0o700)
                ws._chown(sub)
            if not ws.mounted:
                os.chmod(root, 0o711)
        except BaseException:
            ws.remove()
            raise
        return ws

    def _chown(self, path: Path | int) -> None:
        if self.uid is not None and os.geteuid() == 0:
            if isinstance(path, int):
                os.fchown(path, self.uid, self.gid if self.gid is not None else self.uid)
            else:
                os.chown(path, self.uid, self.gid if self.gid is not None else self.uid)

    def heavy(self) -> bool:
        """Whether removing it takes long: a tmpfs holding much data or many files."""
        if not self.mounted:
            return False
        try:
            st = os.statvfs(self.root)
        except OSError:  # not there to measure: the teardown says why, in the background
            return False
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        return used > d.TEARDOWN_INLINE_BYTES or st.f_files - st.f_ffree > d.TEARDOWN_INLINE_FILES

    def remove(self) -> None:
        if self.mounted:
            unmount(str(self.root))
            self.mounted = False
            # the tmpfs held everything: its mount point is empty once it is gone
            with contextlib.suppress(OSError):
                os.rmdir(self.root)
                return
        shutil.rmtree(self.root, ignore_errors=True)

    # --- files in and out; only call while no job process is alive -----------------

    def write_file(self, path: str, content: bytes) -> None:
        target = resolve_inside(self.work, path)
        parent = Path(target).parent
        missing = [p for p in [parent, *parent.parents] if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(mode=0o755)
            self._chown(directory)
        with contextlib.suppress(FileNotFoundError):
            mode = os.lstat(target).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(f"{path} is a directory")
            if not stat.S_ISREG(mode):  # a FIFO, socket or device the job left: replace it
                os.unlink(target)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(target, flags, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            os.set_blocking(fd, True)
            self._chown(fd)
            with os.fdopen(fd, "wb", closefd=False) as fh:
                fh.write(content)
        finally:
            os.close(fd)

    def read_into(self, path: str, buffer: HeadTailBuffer) -> None:
        """A workspace file into ``buffer``: its head, and its tail read from the end, the
        middle counted, not read (an attack review: 4 GB sparse files read whole cost the
        worker seconds of CPU the job's use never counts); refuses links and non-regular
        files. Every job process is dead between steps: the file holds still."""
        fd = os.open(resolve_inside(self.work, path), _READ_FLAGS)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise IsADirectoryError(f"{path} is not a regular file")
            kept = buffer.head_limit + buffer.tail_limit
            if info.st_size > kept:
                buffer.write(os.pread(fd, buffer.head_limit, 0))
                buffer.skip(info.st_size - kept)
                os.lseek(fd, info.st_size - buffer.tail_limit, os.SEEK_SET)
            while chunk := os.read(fd, 1 << 16):
                buffer.write(chunk)
        finally:
            os.close(fd)

    def _regular_files(self, max_entries: int = d.COLLECT_MAX_VISITED) -> Iterator[str]:
        """Regular files under work/ (never a symlink, FIFO or device), depth first in
        name order; stops after ``max_entries`` directory entries whatever the tree."""
        stack = [str(self.work)]
        seen = 0
        while stack:
            directory = stack.pop()
            try:
                with os.scandir(directory) as it:
                    entries = []
                    for entry in it:
                        seen += 1
                        if seen > max_entries:
                            break
                        entries.append(entry)
            except OSError:
                continue
            entries.sort(key=lambda e: e.name)
            subdirs = []
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    yield os.path.relpath(entry.path, self.work)
            stack.extend(reversed(subdirs))
            if seen > max_entries:
                return

    def collect(
        self,
        patterns: Iterable[str],
        max_files: int = d.COLLECT_MAX_FILES,
        max_file_bytes: int = d.COLLECT_MAX_FILE_BYTES,
        max_total_bytes: int = d.COLLECT_MAX_TOTAL_BYTES,
    ) -> tuple[list[CollectedFile], int]:
        """Files matching any pattern (collectmatch.py), bounded.

        Returns the files and how many matching files were left out;
        CollectStoppedError (carrying both) once matching has used its time.
        """
        patterns = list(patterns)
        if not patterns or not self.work.is_dir():
            return [], 0
        collected: list[CollectedFile] = []
        omitted = 0
        budget = max_total_bytes
        matcher = Matcher(patterns)
        try:
            for rel in self._regular_files():
                if not matcher.matches(rel):
                    continue
                if len(collected) >= max_files or budget <= 0:
                    omitted += 1
                    continue
                try:
                    collected.append(self._read_collected(rel, min(max_file_bytes, budget)))
                except OSError:  # gone meanwhile, or a path too long to open: left out
                    omitted += 1
                    continue
                budget -= json_size(collected[-1].content)
        except OutOfTime:
            raise CollectStoppedError(collected, omitted) from None
        return collected, omitted

    def _read_collected(self, rel: str, limit: int) -> CollectedFile:
        fd = os.open(resolve_inside(self.work, rel), _READ_FLAGS)
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, limit)
        finally:
            os.close(fd)
        return encode_collected(rel, size, data, limit)


def encode_collected(path: str, size: int, data: bytes, limit: int) -> CollectedFile:
    """A collected file whose content serialises in at most ``limit`` bytes: text when it
    is UTF-8 and escapes little, else base64 (a file of control bytes would grow sixfold
    as JSON text, base64 only by 4/3). A name that is not UTF-8 (any bytes are legal on
    Linux) gets U+FFFD where it breaks."""
    path = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    data = data[:limit]
    truncated = size > len(data)
    try:
        text = data[: _complete_prefix_length(data)].decode() if truncated else data.decode()
        if json_size(text) > limit:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "escapes past the budget")
        return CollectedFile(path=path, size=size, content=text, truncated=truncated)
    except UnicodeDecodeError:
        raw = data[: limit * 3 // 4]  # base64 grows by 4/3; stay inside the budget
        return CollectedFile(
            path=path,
            size=size,
            encoding="base64",
            content=base64.b64encode(raw).decode(),
            truncated=size > len(raw),
        )
