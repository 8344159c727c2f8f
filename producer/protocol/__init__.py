"""The farm contract: the one home of everything producer, worker and gateway share
through Redis — settings, keys, the task name, typed records, Lua scripts, the Redis
connection and its retry policy, time margins, the farm's errors.

It imports only sandbox_core, pydantic and redis; the worker imports nothing else of
``producer`` (tests/unit/test_layering.py reads the imports to keep it so).
"""

from __future__ import annotations

from producer.protocol.broker import TASK_NAME, broker_config
from producer.protocol.connection import connect
from producer.protocol.errors import (
    AuthError,
    FarmError,
    FarmUnavailableError,
    IdConflictError,
    InputChangedError,
    JobsLostError,
    LateStepError,
    QuotaError,
    SlotReservationError,
    TenantError,
    TenantsFileError,
)
from producer.protocol.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, Keys
from producer.protocol.records import Heartbeat, JobState, MessageMeta, RunningRecord
from producer.protocol.scripts import FarmScripts
from producer.protocol.settings import Settings, get_settings

__all__ = [
    "KOMBU_UNACKED",
    "KOMBU_UNACKED_INDEX",
    "TASK_NAME",
    "AuthError",
    "FarmError",
    "FarmScripts",
    "FarmUnavailableError",
    "Heartbeat",
    "IdConflictError",
    "InputChangedError",
    "JobState",
    "JobsLostError",
    "Keys",
    "LateStepError",
    "MessageMeta",
    "QuotaError",
    "RunningRecord",
    "Settings",
    "SlotReservationError",
    "TenantError",
    "TenantsFileError",
    "broker_config",
    "connect",
    "get_settings",
]
