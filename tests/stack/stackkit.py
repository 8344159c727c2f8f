"""Plumbing for the compose stack's tests: a stack of its own (project, env file, free
ports) brought up and down with the real ops/stack.sh, and what Docker says is left."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.gatewaykit import free_port

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "ops" / "stack.sh"
PROJECT_LABEL = "com.docker.compose.project"


@dataclass
class Stack:
    project: str
    env_file: Path
    up_log: str = ""  # what `ops/stack.sh up` printed (stdout and stderr)

    @property
    def env(self) -> dict[str, str]:
        """The env file's values (what ops/stack.sh and compose read)."""
        pairs = (line.split("=", 1) for line in self.env_file.read_text().splitlines())
        return {k: v for k, v in pairs if k and not k.startswith("#")}

    def url(self, port_key: str) -> str:
        return f"http://127.0.0.1:{self.env[port_key]}"

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """ops/stack.sh ARGS for this stack (``make ...`` for a make target); output
        captured (it never prints a secret)."""
        env = {**os.environ, "SANDFARM_STACK_ENV_FILE": str(self.env_file)}
        make = ["make", "-s", "-C", str(ROOT), *args[1:]]
        argv = make if args[0] == "make" else [str(STACK), *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)

    def check(self, *args: str, timeout: float = 600) -> str:
        done = self.run(*args, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(args)}:\n{done.stderr[-4000:]}"
        return done.stdout

    def key_for(self, tenant: str) -> str:
        """A new tenant and an API key of its, through the CLI inside the stack."""
        self.check("sandfarm", "tenant", "add", tenant, "--backends", "process")
        out = self.check("sandfarm", "tenant", "key", "create", tenant)
        keys = [line for line in out.splitlines() if line.startswith("sf_")]
        assert len(keys) == 1, "tenant key create printed no key"
        return keys[0]

    def leftovers(self) -> dict[str, list[str]]:
        """The project's containers, networks and volumes that Docker still has."""
        label = f"label={PROJECT_LABEL}={self.project}"
        found = {}
        for kind, cmd in {
            "containers": ["docker", "ps", "-a", "--filter", label, "--format", "{{.Names}}"],
            "networks": ["docker", "network", "ls", "--filter", label, "--format", "{{.Name}}"],
            "volumes": ["docker", "volume", "ls", "--filter", label, "--format", "{{.Name}}"],
        }.items():
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            found[kind] = out.split()
        return found

    def container(self, service: str) -> str:
        """The container id of one service."""
        out = self.check("compose", "ps", "-q", service).split()
        assert len(out) == 1, f"{service}: {out}"
        return out[0]


def new_stack(project: str, directory: Path) -> Stack:
    """A stack with its own project name and free loopback ports; ops/stack.sh adds the
    secrets (it only fills in the keys a file lacks)."""
    env_file = directory / f"{project}.env"
    ports = {
        "SANDFARM_STACK_REDIS_PORT": free_port(),
        "SANDFARM_STACK_GATEWAY1_PORT": free_port(),
        "SANDFARM_STACK_GATEWAY2_PORT": free_port(),
        "SANDFARM_STACK_FLOWER_PORT": free_port(),
        "SANDFARM_STACK_PROMETHEUS_PORT": free_port(),
    }
    lines = [f"SANDFARM_STACK_PROJECT={project}", *(f"{k}={v}" for k, v in ports.items())]
    env_file.write_text("\n".join(lines) + "\n")
    env_file.chmod(0o600)
    return Stack(project, env_file)
