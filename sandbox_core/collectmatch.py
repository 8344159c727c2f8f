"""Which workspace paths a job's collect patterns name, within the worker's time for it.

A pattern is fnmatch's (case-sensitive; ``*`` also crosses ``/``), compiled to a regex
whose match costs up to the pattern's length times the path's: a crafted pattern cost
the worker ~2 ms a name, 23 s of its CPU for one pattern over 10,000 names, on no job's
account and past the job's timeout (an attack review). So patterns are short
(defaults.COLLECT_MAX_PATTERN_BYTES, checked with the spec) and matching stops once
defaults.COLLECT_MATCH_S has passed.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable

from sandbox_core import defaults as d

PATH_MAX = 4096  # linux/limits.h, in bytes; characters are at least as few


class OutOfTime(Exception):
    """Matching used up its time (the caller says what it found before)."""


class Matcher:
    def __init__(self, patterns: Iterable[str], budget_s: float = d.COLLECT_MATCH_S) -> None:
        self._compiled = [re.compile(fnmatch.translate(p)) for p in patterns]
        self._deadline = time.monotonic() + budget_s

    def matches(self, path: str) -> bool:
        """Whether any pattern matches ``path``; OutOfTime once the time is up. A path
        longer than PATH_MAX never does: it could not be opened to collect it, and one
        of 4 MB in a container's listing cost 17 s over 32 patterns (a review)."""
        if len(path) > PATH_MAX:
            return False
        for pattern in self._compiled:
            if time.monotonic() > self._deadline:
                raise OutOfTime
            if pattern.match(path):
                return True
        return False
