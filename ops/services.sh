#!/usr/bin/env bash
# Start the services the tests and the demo use, when they do not answer yet.
# Redis: the one at SANDFARM_REDIS_URL (default 127.0.0.1:6379), else a private one.
# Docker: installed and started by ops/install_docker.sh when root (CI).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { echo "[services] $*" >&2; }

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  "$here/start_redis.sh" 6379
fi
if [ "$(id -u)" = 0 ] && [ -x "$here/install_docker.sh" ] && [ "${SANDFARM_SKIP_DOCKER:-0}" != 1 ]; then
  "$here/install_docker.sh"
  [ -x "$here/images/build_sandbox_image.sh" ] && "$here/images/build_sandbox_image.sh"
fi
exit 0
