"""The path guard: every workspace path a job names goes through here."""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from sandbox_core import defaults as d
from sandbox_core.errors import PathEscapeError


def check_relative_path(path: str) -> str:
    """Lexical checks that need no filesystem: relative, no '..', no NUL, bounded names."""
    if not path:
        raise PathEscapeError(path, "is empty")
    if "\x00" in path:
        raise PathEscapeError(path, "contains a NUL byte")
    if len(path.encode("utf-8", "surrogatepass")) > d.MAX_PATH_BYTES:
        raise PathEscapeError(path, f"is longer than {d.MAX_PATH_BYTES} bytes")
    if path.startswith("/") or path.startswith("~"):
        raise PathEscapeError(path, "is absolute; paths are relative to the workspace")
    parts = PurePosixPath(path).parts
    if ".." in parts:
        raise PathEscapeError(path, "contains '..'")
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > d.MAX_NAME_BYTES:
            raise PathEscapeError(path, f"has a component longer than {d.MAX_NAME_BYTES} bytes")
    return path


def resolve_inside(root: str | os.PathLike[str], path: str) -> str:
    """Resolve ``path`` under ``root``; refuse it if the real path (symlinks followed) leaves root.

    Callers must only use the answer while no job process can change the tree (between
    steps every job process is dead), and still open the file with O_NOFOLLOW.
    """
    check_relative_path(path)
    real_root = os.path.realpath(root)
    candidate = os.path.realpath(os.path.join(real_root, path))
    if os.path.commonpath([real_root, candidate]) != real_root:
        raise PathEscapeError(path, "leads outside the workspace")
    return candidate
