"""The tenants and their API keys (hashes only) as a file, and back into a farm.

The farm's Redis keeps nothing on disk: restarted empty, it has forgotten every tenant
and key, and each tenant's users get 401 until the operator makes them again, with new
keys to hand out. An export taken before lets the operator put them back as they were:
the same policies, the same keys (a key is found by its hash, and the file holds only
that). The file is read as hostile: bounded, validated whole before anything is written.
"""

from __future__ import annotations

import os
import stat
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from producer.protocol.errors import TenantsFileError, first_problem
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import ApiKey, Policy, TenantName

FORMAT = "sandfarm-tenants/1"
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TENANTS = 100_000
MAX_KEYS_PER_TENANT = 1_000
# a chown or chmod leaves a handle opened before it writing (a review): a copy has none
COPY_IT = "copy it to a file of your own, check the copy, and import the copy"


class KeyRecord(BaseModel):
    """An API key as the farm keeps it: its id, first characters and hash, never the key."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(pattern=r"^[0-9a-f]{8}$")]
    created: AwareDatetime  # a naive one broke the sort of every listing of the tenant's keys
    shown: Annotated[str, Field(pattern=r"^sf_[A-Za-z0-9_-]{6}$")]
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class TenantRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: TenantName
    policy: Policy
    keys: list[KeyRecord] = Field(default_factory=list, max_length=MAX_KEYS_PER_TENANT)

    @model_validator(mode="after")
    def _unique_keys(self) -> TenantRecord:
        if len({k.id for k in self.keys}) != len(self.keys):
            raise ValueError("keys: a key id appears twice")
        return self


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["sandfarm-tenants/1"]
    exported_at: AwareDatetime
    tenants: list[TenantRecord] = Field(max_length=MAX_TENANTS)

    @model_validator(mode="after")
    def _unique(self) -> TenantsFile:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: a tenant appears twice")
        digests = [k.digest for t in self.tenants for k in t.keys]
        if len(set(digests)) != len(digests):
            raise ValueError("tenants: a key (its digest) appears twice")
        return self


class Restored(BaseModel):
    """What an import did, tenant by tenant."""

    restored: list[str] = Field(default_factory=list)
    keys: int = 0
    kept: list[str] = Field(default_factory=list)  # in the farm already: left as they are
    refused: dict[str, str] = Field(default_factory=dict)  # tenant -> why


def snapshot(store: TenantStore) -> TenantsFile:
    tenants = []
    for name in store.names():
        policy = store.get(name)
        if policy is None:  # removed meanwhile
            continue
        keys = [
            KeyRecord.model_validate(k.model_dump(exclude={"tenant"})) for k in store.keys_of(name)
        ]
        tenants.append(TenantRecord(name=name, policy=policy, keys=keys))
    return TenantsFile(format=FORMAT, exported_at=datetime.now(UTC), tenants=tenants)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner alone, whole or not at all (a
    temporary file beside it, renamed over it: a symlink there is replaced, never
    followed)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:  # mkstemp makes it 0600
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)  # the rename too survives a crash
    finally:
        os.close(directory)


def read(path: Path) -> TenantsFile:
    """The file, validated whole; TenantsFileError naming the field and the reason if not.
    Only a regular file of the importing user that no one else may write is read: its
    key hashes become working keys (an edited export let a review in as any tenant)."""
    where = str(path)
    try:
        # looked at before it is opened for reading (a device opened is a device acted
        # on), then opened through that very look: what is read is what was checked
        anchor = os.open(path, os.O_PATH)
        try:
            _check_owned(where, os.fstat(anchor))
            fd = os.open(f"/proc/self/fd/{anchor}", os.O_RDONLY | os.O_NOCTTY)
        finally:
            os.close(anchor)
        with os.fdopen(fd, "rb") as source:
            raw = source.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise TenantsFileError(where, exc.strerror or str(exc)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise TenantsFileError(where, f"over {MAX_FILE_BYTES // 2**20} MiB: not a tenants export")
    try:
        return TenantsFile.model_validate_json(raw)
    except ValidationError as exc:
        field, reason = first_problem(exc)
        raise TenantsFileError(where, f"{field}: {reason}" if field else reason) from None


def _check_owned(where: str, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise TenantsFileError(where, "not a regular file")
    if info.st_uid != os.geteuid():
        raise TenantsFileError(
            where,
            f"owned by uid {info.st_uid}, not by you (uid {os.geteuid()}): its keys would"
            f" let in whoever wrote it, who may hold it open to write it again: {COPY_IT}",
        )
    if info.st_mode & 0o022:
        raise TenantsFileError(
            where,
            f"writable by others (mode {stat.S_IMODE(info.st_mode):04o}): its keys would let"
            f" in whoever wrote it, who may hold it open to write it again: {COPY_IT}",
        )


def restore(store: TenantStore, backup: TenantsFile) -> Restored:
    """Put back each tenant the farm does not have, with its keys, each in one step. A
    tenant it has is left as it is (its policy and keys may have changed since the
    export: a key revoked since must not come back). A name a removed tenant's records
    still hold is refused, as `tenant add` refuses it; so is a key whose hash the farm
    already knows."""
    done = Restored()
    for record in backup.tenants:
        keys = [ApiKey(tenant=record.name, **key.model_dump()) for key in record.keys]
        outcome = store.restore(record.name, record.policy, keys)
        if outcome == "restored":
            done.restored.append(record.name)
            done.keys += len(keys)
        elif outcome == "kept":
            done.kept.append(record.name)
        elif outcome == "held":
            done.refused[record.name] = store.held_error(record.name).reason
        else:
            key_id = outcome.split()[1]
            done.refused[record.name] = f"its key {key_id} is another tenant's in this farm"
    return done
