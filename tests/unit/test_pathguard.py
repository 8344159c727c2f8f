from __future__ import annotations

import pytest

from sandbox_core.errors import PathEscapeError
from sandbox_core.pathguard import check_relative_path, resolve_inside


@pytest.mark.parametrize(
    "path",
    ["", "/abs", "~/x", "../x", "a/../../b", "a/..", "x\x00y", "a/" + "n" * 300, "p/" * 600],
)
def test_refused(path):
    with pytest.raises(PathEscapeError) as info:
        check_relative_path(path)
    assert isinstance(info.value, PermissionError)  # subclasses the matching built-in
    assert info.value.reason


@pytest.mark.parametrize("path", ["a.py", "dir/sub/file.txt", "./x", ".hidden", "a..b"])
def test_accepted(path):
    assert check_relative_path(path) == path


def test_symlink_inside_is_fine_and_outside_is_not(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "in").symlink_to(tmp_path / "real")
    (tmp_path / "out").symlink_to("/")
    assert resolve_inside(tmp_path, "in/f").endswith("real/f")
    with pytest.raises(PathEscapeError):
        resolve_inside(tmp_path, "out/etc/passwd")


def test_sibling_prefix_is_not_inside(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (tmp_path / "ws2").mkdir()
    (root / "s").symlink_to(tmp_path / "ws2")
    with pytest.raises(PathEscapeError):
        resolve_inside(root, "s/x")
