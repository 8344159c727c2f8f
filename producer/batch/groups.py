"""Per-group pass counts and pass@k for any batch: jobs grouped by a label (``--group-by
labels.task``); a job passes when it succeeded, and each group's n jobs are its samples."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from producer.batch.passk import DEFAULT_KS, pass_at_k
from producer.terminal import plain
from sandbox_core import SpecError

NO_GROUP = "(none)"  # jobs without the label
SHOWN_GROUPS = 20  # rows in the printed table; the JSON summary has every group


def label_of(group_by: str) -> str:
    """The label a ``--group-by`` names: ``labels.task`` (or just ``task``)."""
    name = group_by.removeprefix("labels.")
    if not name or "." in name:
        raise SpecError("--group-by", f"{group_by!r}: give a label, e.g. labels.task")
    return name


@dataclass
class Groups:
    label: str
    ks: Sequence[int] = DEFAULT_KS
    counts: dict[str, list[int]] = field(default_factory=dict)  # group -> [jobs, passed]

    def add(self, record: dict[str, Any], passed: bool | None = None) -> None:
        """Count ``record``; it passed if it succeeded, unless ``passed`` says (eval)."""
        group = str((record.get("labels") or {}).get(self.label) or NO_GROUP)
        row = self.counts.setdefault(group, [0, 0])
        row[0] += 1
        row[1] += record.get("status") == "succeeded" if passed is None else passed

    def pass_at_k(self) -> dict[str, float]:
        rows = list(self.counts.values())
        return pass_at_k([n for n, _ in rows], [c for _, c in rows], self.ks)

    def as_json(self) -> dict[str, Any]:
        rows = []
        for group, (n, c) in sorted(self.counts.items()):
            rows.append({"group": group, "jobs": n, "passed": c, **pass_at_k([n], [c], self.ks)})
        return {"by": f"labels.{self.label}", "groups": rows, "pass_at_k": self.pass_at_k()}

    def table(self) -> Table:
        data = self.as_json()
        ks = [k for k in data["pass_at_k"]]
        table = Table(title=f"by labels.{self.label}", title_justify="left", show_edge=False)
        for name in ("group", "jobs", "passed", *ks):
            if name == "group":  # a label: cut, never wrapped onto a row of its own
                table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=48)
            else:
                table.add_column(name, justify="right")
        for row in data["groups"][:SHOWN_GROUPS]:
            values = [f"{row[k]:.3f}" if k in row else "-" for k in ks]
            table.add_row(plain(row["group"]), str(row["jobs"]), str(row["passed"]), *values)
        if len(data["groups"]) > SHOWN_GROUPS:
            table.add_row(f"... {len(data['groups']) - SHOWN_GROUPS} more", "", "")
        table.add_section()
        overall = [f"{data['pass_at_k'][k]:.3f}" for k in ks]
        jobs = sum(n for n, _ in self.counts.values())
        passed = sum(c for _, c in self.counts.values())
        table.add_row(f"all {len(self.counts)} groups", str(jobs), str(passed), *overall)
        return table
