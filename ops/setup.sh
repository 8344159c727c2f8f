#!/usr/bin/env bash
# Install the system packages sandfarm needs on Debian, when missing and when root:
# python3-venv (for the virtualenv), redis-server and redis-sentinel, bubblewrap, and the sandbox runtime
# (the system python3 with pytest, which L1/L2 jobs run), a C compiler for the exec
# helper, tini, and Debian's chromium for the browser tests.
set -euo pipefail
log() { echo "[setup] $*" >&2; }

want=()
command -v redis-server >/dev/null || want+=(redis-server)
# Sentinel (the failover test; Debian ships it apart from the server)
command -v redis-sentinel >/dev/null || want+=(redis-sentinel)
command -v bwrap >/dev/null || want+=(bubblewrap)
[ -x /usr/bin/python3 ] || want+=(python3)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || want+=(python3-pytest)
python3 -c 'import venv, ensurepip' 2>/dev/null || want+=(python3-venv)
command -v ip >/dev/null || want+=(iproute2)
command -v cc >/dev/null || want+=(gcc libc6-dev)  # the sandbox's exec helper
command -v tini >/dev/null || want+=(tini)  # bwrap's pid 1 where the exec helper is not built
command -v chromium >/dev/null || want+=(chromium)  # the browser tests (Flower's pages)

if [ ${#want[@]} -eq 0 ]; then
  log "system packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "missing ${want[*]}; run as root or install them yourself (apt-get install ${want[*]})"
  exit 0
fi
log "installing ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
