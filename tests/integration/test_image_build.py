"""The sandbox image builds from scratch where no registry is reachable: debootstrap,
`docker import`, Dockerfile; then a hardened job runs pytest in it."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import require
from tests.security.conftest import docker_status

SCRIPT = Path(__file__).resolve().parents[2] / "ops" / "images" / "build_sandbox_image.sh"


@pytest.mark.timeout(900)
def test_sandbox_image_builds_from_scratch(tmp_path, is_root):
    require(is_root, "debootstrap and the Docker engine need root")
    ok, reason = docker_status()
    require(ok, reason)
    import docker

    client = docker.from_env()
    tag = f"sandfarm/sandbox-buildtest:{uuid.uuid4().hex[:8]}"
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "SANDFARM_SANDBOX_IMAGE": tag,
        "SANDFARM_CACHE_DIR": str(tmp_path / "cache"),  # no rootfs, no .debs: from scratch
        "SANDFARM_FORCE_REBUILD": "1",
        "SANDFARM_SKIP_RUNSC": "1",
    }
    try:
        build = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=840
        )
        assert build.returncode == 0, build.stderr[-3000:]
        assert "debootstrap" in build.stderr  # it really bootstrapped a root filesystem
        out = client.containers.run(
            tag,
            ["python3", "-c", "import pytest, os; print(pytest.__version__, os.getuid())"],
            remove=True,
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user="1000:1000",
        ).decode()
        version, uid = out.split()
        assert version and uid == "1000"
        again = subprocess.run(
            ["bash", str(SCRIPT)],
            env={**env, "SANDFARM_FORCE_REBUILD": "0"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0 and "up to date" in again.stderr  # cached by inputs hash
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(tag, force=True)
