"""One typed configuration per backend, told apart by ``type``; unknown fields are errors.

Everything a backend needs from its host comes in here (a worker fills it from its
settings, ``sandfarm run`` from its flags): sandbox_core reads no environment variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from sandbox_core import defaults as d


class CommonConfig(BaseModel):
    """What every backend takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_weaker: bool = Field(
        False, description="run jobs even where a required protection is missing (tests only)"
    )
    allow_network: bool = Field(
        False, description="let jobs ask for limits.network (only an operator turns it on)"
    )
    worker: str | None = Field(None, description="name put in each result's `worker`")
    slot: int | None = Field(
        None, ge=0, lt=d.MAX_SLOTS, description="sandbox slot (and uid) to run in; None: any free"
    )
    workspace_dir: Path | None = Field(
        None,
        description="parent of the slots' workspaces (docker: of its containers' devpts"
        " instances, which the process backend hides from its jobs); None:"
        " /var/lib/sandfarm/work as root",
    )


class LocalConfig(CommonConfig):
    """What the host-process backends (process, bwrap) take."""

    python: str = Field("python3", description="interpreter of python steps, on the clean PATH")
    exec_helper: str = Field(
        d.EXEC_HELPER_AUTO,
        description="sandfarm-exec to start steps with: a path, 'auto' (beside the running"
        " interpreter, else on PATH) or '' (Python child setup)",
    )
    favor_dynmods: bool = Field(
        True,
        description="as root, remount cgroup2 with favordynmods (host-wide) so attaching a"
        " step to its cgroups skips an RCU wait of ~8 ms; False leaves the host untouched",
    )
    prewarm: bool = Field(
        True,
        description="set up the next job's sandbox before it arrives and tear the last one"
        " down after its result (sandbox_core.backends.prewarm)",
    )
    spare_slot: int | None = Field(
        None,
        ge=0,
        lt=d.MAX_SLOTS,
        description="with `slot`: a second slot (and uid) used in turn with it, so the next"
        " job's sandbox is set up in one while a job runs in the other",
    )


class ProcessConfig(LocalConfig):
    type: Literal["process"] = "process"


class BwrapConfig(LocalConfig):
    type: Literal["bwrap"] = "bwrap"


class DockerConfig(CommonConfig):
    type: Literal["docker"] = "docker"
    image: str = Field(d.DOCKER_IMAGE, description="default image of jobs that name none")
    allowed_images: tuple[str, ...] = Field((), description="images jobs may name; () : image")
    runtime: str = Field("runc", description="OCI runtime (runsc: gVisor)")
    cpus: float = Field(1.0, gt=0, description="CPU cap of each container")
    warm_pool: int = Field(0, ge=0, le=64, description="started containers kept ready")

    @property
    def images(self) -> tuple[str, ...]:
        return self.allowed_images or (self.image,)


BackendConfig = Annotated[ProcessConfig | BwrapConfig | DockerConfig, Field(discriminator="type")]
_ADAPTER: TypeAdapter[ProcessConfig | BwrapConfig | DockerConfig] = TypeAdapter(BackendConfig)


def backend_config(name: str, **fields: object) -> ProcessConfig | BwrapConfig | DockerConfig:
    """Validate ``fields`` into the config of backend ``name`` (pydantic names the field)."""
    return _ADAPTER.validate_python({**fields, "type": name})
