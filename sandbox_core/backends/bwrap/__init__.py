"""L2, the bubblewrap backend: host (the probe, the shared command line, per-job /etc)
and backend (sessions and the launch of each step)."""

from __future__ import annotations

from sandbox_core.backends.bwrap.backend import BwrapBackend, BwrapSession
from sandbox_core.backends.bwrap.host import Probe, probe

__all__ = ["BwrapBackend", "BwrapSession", "Probe", "probe"]
