#!/usr/bin/env bash
# Start the services the tests and the demo use, when they do not answer yet.
# Redis: the one at SANDFARM_REDIS_URL (default redis://127.0.0.1:6379/0).
# Docker: installed and started by ops/install_docker.sh when root (CI).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "[services] $*" >&2; }

# The Redis of SANDFARM_REDIS_URL: started here when it is on this machine and silent;
# a remote one must already answer.
url=${SANDFARM_REDIS_URL:-redis://127.0.0.1:6379/0}
hostport=${url#*://}
hostport=${hostport#*@}
hostport=${hostport%%/*}
host=${hostport%%:*}
port=${hostport##*:}
[ "$port" = "$hostport" ] && port=6379
if ! redis-cli -u "$url" ping >/dev/null 2>&1; then
  case "$host" in
    127.0.0.1 | localhost | "") "$here/start_redis.sh" "$port" ;;
    *) log "no Redis answers at $url (not on this machine: start it there)"; exit 1 ;;
  esac
fi
if [ "$(id -u)" = 0 ] && [ -x "$here/install_docker.sh" ] && [ "${SANDFARM_SKIP_DOCKER:-0}" != 1 ]; then
  "$here/install_docker.sh"
  [ -x "$here/images/build_sandbox_image.sh" ] && "$here/images/build_sandbox_image.sh"
fi
exit 0
