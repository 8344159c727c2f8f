"""The network of docker jobs that may use one (``limits.network``, with the operator's
consent): a bridge of the farm's own where jobs reach the world but not each other,
nor the host.

Docker's default bridge lets containers talk to each other, so one tenant's network job
read what another's served (an attack review, 2026-12-04), and reaches every host
service listening beyond loopback through the bridge's gateway. Here the bridge has
inter-container traffic off (the engine's ``enable_icc``: a FORWARD rule dropping
bridge-to-bridge packets) and the host drops whatever comes in from it (an INPUT rule
of ours, added when missing). Without the engine's rule (a daemon started with
``--iptables=false``), bridged traffic filtered (br_netfilter) or ours, network jobs are
refused: the isolation is not there. IPv6 is off in their containers (containers.py).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, NoReturn

from sandbox_core.errors import ProtectionUnavailableError

NAME = "sandfarm-jobs"
BRIDGE = "sandfarm0"
_ICC = "com.docker.network.bridge.enable_icc"
_BRIDGE_NAME = "com.docker.network.bridge.name"
_OPTIONS = {_ICC: "false", _BRIDGE_NAME: BRIDGE}
_INPUT_RULE = ["INPUT", "-i", BRIDGE, "-j", "DROP"]
_ICC_RULE = f"-i {BRIDGE} -o {BRIDGE} -j DROP"
_BRIDGE_FILTER = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")  # br_netfilter's
_lock = threading.Lock()


def job_network(client: Any) -> str:
    """The network's name, made and checked if need be (raises
    ProtectionUnavailableError where its isolation cannot be had)."""
    with _lock:
        network = _get_or_create(client)
        attrs = network.attrs
        options = attrs.get("Options") or {}
        other = any(options.get(key) != value for key, value in _OPTIONS.items())
        if other or attrs.get("Driver") != "bridge" or attrs.get("EnableIPv6"):
            made = {k: attrs.get(k) for k in ("Driver", "EnableIPv6", "Options")}
            _refuse(f"the docker network {NAME} exists made otherwise {made}: remove it")
        _drop_input_from_bridge()
        if not _BRIDGE_FILTER.exists() or _BRIDGE_FILTER.read_text().strip() != "1":
            _refuse(f"{_BRIDGE_FILTER} is off: the engine's rule never sees bridged traffic")
        if _ICC_RULE not in _iptables("-S"):
            _refuse(
                "the engine keeps no iptables rules (--iptables=false): jobs would reach each other"
            )
        return NAME


def _get_or_create(client: Any) -> Any:
    from docker.errors import APIError, NotFound

    try:
        return client.networks.get(NAME)
    except NotFound:
        pass
    try:
        return client.networks.create(NAME, driver="bridge", options=_OPTIONS)
    except APIError:  # another worker made it first
        return client.networks.get(NAME)


def _drop_input_from_bridge() -> None:
    if shutil.which("iptables") is None:
        _refuse("no iptables here to keep jobs off the host")
    if subprocess.run(["iptables", "-w", "-C", *_INPUT_RULE], capture_output=True).returncode:
        _iptables("-I", *_INPUT_RULE)


def _iptables(*args: str) -> str:
    done = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True)
    if done.returncode != 0:
        _refuse(f"iptables {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _refuse(reason: str) -> NoReturn:
    raise ProtectionUnavailableError("network_isolation", f"network jobs' bridge: {reason}")
