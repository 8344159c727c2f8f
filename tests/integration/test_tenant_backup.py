"""`sandfarm tenant export` / `import`: the tenants and their keys back after Redis lost
them, through the real CLI, a real gateway over HTTP and a private redis-server emptied
as a restart of the farm's Redis (which keeps nothing on disk) empties it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from producer.protocol import FarmScripts, connect
from producer.protocol.tenant_store import TenantStore
from producer.protocol.tenants import Policy, key_hash
from tests.farmkit import SANDFARM, Farm
from tests.gatewaykit import TenantFarm, api
from tests.rediskit import fill, oom_errors, private_redis

pytestmark = pytest.mark.timeout(120)


def sandfarm(farm: Farm, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDFARM, *args],
        env={**os.environ, **farm.env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_export_gives_tenants_their_keys_back_after_redis_lost_them(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        farm = Farm(server.url, tmp_path)
        tenants = TenantFarm(farm)
        try:
            gateway = tenants.start_gateway()
            key = tenants.tenant("team-a", weight=3, max_running=2, caps={"memory_mb": 512})
            revoked = tenants.tenant("team-b")
            store = tenants.store
            store.revoke_key("team-b", store.key_ids("team-b")[0])
            assert api(gateway, key).get("/v1/usage").status_code == 200
            backup = tmp_path / "tenants.json"
            out = sandfarm(farm, "tenant", "export", str(backup))
            assert out.returncode == 0, out.stderr
            assert "2 tenants and 1 keys written" in out.stdout
            assert stat.S_IMODE(backup.stat().st_mode) == 0o600
            text = backup.read_text()
            assert key not in text and revoked not in text  # hashes only, never a key
            assert key_hash(key) in text and key_hash(revoked) not in text

            connect(server.url).flushall()  # Redis restarted empty
            assert api(gateway, key).get("/v1/usage").status_code == 401  # the loss is real

            out = sandfarm(farm, "tenant", "import", str(backup))
            assert out.returncode == 0, out.stderr
            assert "2 tenants restored with 1 keys" in out.stdout
            reply = api(gateway, key).get("/v1/usage")
            assert reply.status_code == 200 and reply.json()["tenant"] == "team-a"
            assert api(gateway, revoked).get("/v1/usage").status_code == 401
            policy = tenants.store.policy("team-a")
            assert (policy.weight, policy.max_running, policy.caps) == (3, 2, {"memory_mb": 512})
        finally:
            tenants.stop()


def test_a_key_revoked_since_the_export_stays_revoked(tmp_path: Path) -> None:
    """Import leaves a tenant the farm has as it is: an old export never brings back a
    key revoked since (a leaked one, say), nor undoes a policy change."""
    with private_redis(tmp_path) as server:
        farm = Farm(server.url, tmp_path)
        tenants = TenantFarm(farm)
        try:
            gateway = tenants.start_gateway()
            key = tenants.tenant("team-a", weight=2)
            backup = tmp_path / "tenants.json"
            assert sandfarm(farm, "tenant", "export", str(backup)).returncode == 0
            store = tenants.store
            store.revoke_key("team-a", store.key_ids("team-a")[0])
            store.update("team-a", weight=5)
            assert api(gateway, key).get("/v1/usage").status_code == 401

            out = sandfarm(farm, "tenant", "import", str(backup))
            assert out.returncode == 0, out.stderr
            assert "0 tenants restored with 0 keys; 1 already in the farm" in out.stdout
            assert api(gateway, key).get("/v1/usage").status_code == 401
            assert store.policy("team-a").weight == 5 and store.key_ids("team-a") == []
        finally:
            tenants.stop()


def _export(store: TenantStore, path: Path, *names: str) -> dict:
    for name in names:
        store.add(name, Policy())
        store.create_key(name)
    from producer.protocol import tenant_backup

    path.write_text(tenant_backup.snapshot(store).model_dump_json())
    return json.loads(path.read_text())


def test_import_refuses_a_name_or_a_key_the_farm_holds_for_someone_else(tmp_path: Path) -> None:
    with private_redis(tmp_path) as server:
        farm = Farm(server.url, tmp_path)
        r, settings = connect(server.url), farm.settings
        store, scripts = TenantStore(r, settings.keys), FarmScripts(r, settings)
        backup = tmp_path / "tenants.json"
        data = _export(store, backup, "owner", "gone", "thief")
        named = {t["name"]: t for t in data["tenants"]}
        owner_key = named["owner"]["keys"][0]
        # "gone" is removed since: its records hold the name, as from `tenant add`
        store.remove("gone", scripts)
        store.remove("thief", scripts, purge=True)
        # a file edited to give "thief" the owner's key (its hash)
        named["thief"]["keys"][0]["digest"] = owner_key["digest"]
        data["tenants"].remove(named["owner"])
        backup.write_text(json.dumps(data))

        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 1, out
        assert "0 tenants restored with 0 keys; 0 already in the farm" in out.stdout
        assert "'gone' not restored: a removed tenant's job records" in out.stderr
        assert "'thief' not restored: its key" in out.stderr
        assert "is another tenant's in this farm" in out.stderr
        assert store.get("gone") is None and store.get("thief") is None
        lookup = r.get(settings.keys.api_key(owner_key["digest"]))
        assert lookup == f"owner {owner_key['id']}".encode()


def test_a_full_redis_refuses_an_import_in_one_line_and_it_runs_again(tmp_path: Path) -> None:
    """Redis refusing the import (full, here) is one line, exit 1, never a traceback; each
    tenant is whole or absent, so the same import runs again once there is room."""
    with private_redis(tmp_path) as server:
        farm = Farm(server.url, tmp_path)
        r = connect(server.url)
        store = TenantStore(r, farm.settings.keys)
        backup = tmp_path / "tenants.json"
        _export(store, backup, "team-a", "team-b")
        r.flushall()
        fill(r)
        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 1, out
        assert oom_errors(r) > 0  # Redis did refuse it
        (line,) = out.stderr.strip().splitlines()
        assert line.endswith(
            "error: the farm's Redis is full (maxmemory): each tenant is whole or absent:"
            " import again once there is room"
        ), line
        assert store.get("team-a") is None and store.get("team-b") is None
        r.config_set("maxmemory", 0)
        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 0 and "2 tenants restored with 2 keys" in out.stdout, out
        assert store.key_ids("team-a") and store.key_ids("team-b")


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda d: d.update(format="other/2"), "format: Input should be 'sandfarm-tenants/1'"),
        (lambda d: d.update(extra=1), "extra: Extra inputs are not permitted"),
        (lambda d: d["tenants"][0].update(name="../x"), "tenants.0.name: String should match"),
        (lambda d: d["tenants"][0]["keys"][0].update(digest="*"), "keys.0.digest: String"),
        (
            lambda d: d["tenants"][0]["keys"][0].update(created="2020-01-01T00:00:00"),
            "keys.0.created: Input should have timezone info",
        ),
        (lambda d: d["tenants"][0]["policy"].update(weight=-1), "policy.weight: Input should"),
        (
            lambda d: d["tenants"][0]["policy"].update(caps={"memory_mb": 10**9}),
            "caps.memory_mb: 1e+09 is outside",
        ),
        (lambda d: d["tenants"].append(d["tenants"][0]), "tenants: a tenant appears twice"),
        (
            lambda d: d["tenants"][1].update(keys=d["tenants"][0]["keys"]),
            "tenants: a key (its digest) appears twice",
        ),
    ],
)
def test_import_refuses_a_bad_file_whole_naming_the_field(
    tmp_path: Path, redis_url: str, edit, named: str
) -> None:
    from tests.farmkit import private_db

    with private_db(redis_url) as url:
        farm = Farm(url, tmp_path)
        store = TenantStore(connect(url), farm.settings.keys)
        backup = tmp_path / "tenants.json"
        data = _export(store, backup, "one", "two")
        for name in ("one", "two"):
            store.remove(name, FarmScripts(store.redis, farm.settings), purge=True)
        edit(data)
        backup.write_text(json.dumps(data))
        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 2, out
        assert named in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert store.names() == []  # nothing of it was written


def test_import_refuses_what_is_not_an_export(tmp_path: Path, redis_url: str) -> None:
    farm = Farm(redis_url, tmp_path)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as out:
        out.truncate(64 * 1024 * 1024 + 1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a read of it never ended (a review)
    for path, named in [
        (huge, "over 64 MiB"),
        (tmp_path / "missing.json", "No such file"),
        (Path("/etc/passwd"), "Invalid JSON"),
        (fifo, "not a regular file"),
        (Path("/dev/null"), "not a regular file"),
        (tmp_path, "is a directory"),
    ]:
        out = sandfarm(farm, "tenant", "import", str(path))
        assert out.returncode == 2 and named in out.stderr, out


def test_import_reads_only_an_export_no_one_else_could_have_written(
    tmp_path: Path, redis_url: str
) -> None:
    """An export's key hashes become working keys: an edited one let a review in as any
    tenant. So import reads only a file of its own user that no one else may write."""
    from tests.farmkit import private_db

    with private_db(redis_url) as url:
        farm = Farm(url, tmp_path)
        store = TenantStore(connect(url), farm.settings.keys)
        backup = tmp_path / "tenants.json"
        _export(store, backup, "team-a")
        store.remove("team-a", FarmScripts(store.redis, farm.settings), purge=True)
        backup.chmod(0o666)
        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 2 and "writable by others (mode 0666)" in out.stderr, out
        backup.chmod(0o600)
        os.chown(backup, 65534, 65534)
        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 2 and "owned by uid 65534, not by you" in out.stderr, out
        # a chown would leave a handle its writer holds open writing it (a review)
        assert "copy it to a file of your own" in out.stderr
        assert store.names() == []
        os.chown(backup, os.geteuid(), os.getegid())
        out = sandfarm(farm, "tenant", "import", str(backup))
        assert out.returncode == 0 and store.names() == ["team-a"], out  # the file was good


def test_a_tenant_is_restored_whole_or_not_at_all(redis_url: str) -> None:
    """An import cut off between a tenant's policy and its keys left it keyless, and the
    next import kept it so (a review): each tenant is one step now. Its second key's hash
    already some key's here: nothing of it is written, its first key included."""
    from producer.protocol import Settings
    from producer.protocol.tenants import ApiKey
    from tests.farmkit import private_db

    with private_db(redis_url) as url:
        settings = Settings(redis_url=url, key_prefix="whole:")
        r = connect(url)
        store = TenantStore(r, settings.keys)
        store.add("owner", Policy())
        _, taken = store.create_key("owner")
        first = ApiKey(
            id="0000aaaa",
            tenant="team-a",
            created=taken.created,
            shown="sf_abcdef",
            digest="1" * 64,
        )
        second = taken.model_copy(update={"tenant": "team-a", "id": "0000bbbb"})
        assert store.restore("team-a", Policy(weight=2), [first, second]) == "clash 0000bbbb"
        assert store.get("team-a") is None and store.names() == ["owner"]
        assert not r.exists(settings.keys.api_key("1" * 64), settings.keys.tenant_keys("team-a"))
        assert store.restore("team-a", Policy(weight=2), [first]) == "restored"
        assert store.policy("team-a").weight == 2 and store.key_ids("team-a") == ["0000aaaa"]
        assert r.get(settings.keys.api_key("1" * 64)) == b"team-a 0000aaaa"
        assert store.restore("team-a", Policy(), []) == "kept"
