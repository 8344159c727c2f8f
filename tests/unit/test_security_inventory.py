"""SECURITY.md's inventory: every row names a test, and every test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def table_rows(text: str) -> list[list[str]]:
    """The body rows of every Markdown table whose header has a ``test`` column."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif set(line) <= set("|-: "):
            continue
        elif header[-1] == "test":
            rows.append(cells)
    return rows


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_row_names_an_existing_test() -> None:
    rows = table_rows((ROOT / "SECURITY.md").read_text())
    assert len(rows) >= 40, "the inventory lost its rows"  # the parser sees the tables
    problems = []
    for row in rows:
        nodes = NODE.findall(row[-1])
        if not nodes:
            problems.append(f"no test for: {row[0]}")
        for file, name in nodes:
            path = ROOT / file
            if not path.exists() or name not in defined_tests(path):
                problems.append(f"{row[0]}: {file}::{name} does not exist")
    assert problems == []


def test_the_checker_catches_a_row_without_a_test() -> None:
    sample = "| thing | a | b | c | d | test |\n|---|---|---|---|---|---|\n| x | | | | | none |\n"
    rows = table_rows(sample)
    assert rows == [["x", "", "", "", "", "none"]]
    assert NODE.findall(rows[0][-1]) == []
