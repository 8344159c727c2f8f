"""The breakdown of a benchmark's jobs by phase (JobResult.timings.phases and each
step's spawn and run): medians of each, so a run shows where the time goes."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from sandbox_core import JobResult
from sandbox_core.models import Phases

FARM = ("dispatch_ms", "delivery_ms")
SANDBOX = ("slot_wait_ms", "setup_ms", "steps_ms", "collect_ms", "teardown_ms")
STORE = ("store_ms",)


def breakdown(results: Iterable[JobResult], label: str) -> str:
    """One line: the median of every phase measured, in ms, in the order a job meets
    them (the first step's spawn and run within steps)."""
    results = list(results)
    parts = []
    for name in (*FARM, *SANDBOX, *STORE):
        assert name in Phases.model_fields
        values = [v for r in results if (v := getattr(r.timings.phases, name)) is not None]
        if values:
            parts.append(f"{name.removesuffix('_ms')}={statistics.median(values):.2f}")
            if name == "steps_ms":
                stepped = [r.steps[0] for r in results if r.steps]
                spawn = statistics.median(s.spawn_ms for s in stepped)
                run = statistics.median(s.duration_ms for s in stepped)
                parts.append(f"(spawn={spawn:.2f} run={run:.2f})")
    total = statistics.median(r.timings.run_ms or 0 for r in results)
    warm = sum(1 for r in results if r.timings.phases.prewarmed)
    return (
        f"phases.{label} (median ms, n={len(results)}): {' '.join(parts)} sandbox_total={total:.2f}"
        f" prewarmed={warm}/{len(results)}"
    )
