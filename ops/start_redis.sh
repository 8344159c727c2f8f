#!/usr/bin/env bash
# Start a redis-server for the farm on 127.0.0.1:PORT with an append-only file, so a
# restarted Redis keeps the queued jobs: `ops/start_redis.sh PORT [DIR]`.
#
# Its data (every queued spec with its code and env secrets, every result) lives in
# DIR (default /var/lib/sandfarm-redis as root), a directory only its owner may enter,
# with files only its owner may read (umask 077): the process backend's jobs see the
# host's filesystem, as unprivileged slot uids. Existing data is made private too.
# SANDFARM_REDIS_PASSWORD, when set, becomes its requirepass (needed once Redis is
# reachable from a network: clients then use redis://:PASSWORD@host:port/0).
# Its memory is bounded (SANDFARM_REDIS_MAXMEMORY, e.g. 8gb; default half this host's
# memory) and, once full, it refuses writes (noeviction) rather than evict keys: eviction
# would lose queued jobs and stored results without a word.
set -euo pipefail
port=${1:?usage: ops/start_redis.sh PORT [DIR]}
dir=${2:-}
if [ -z "$dir" ]; then
  dir=/var/lib/sandfarm-redis
  [ "$(id -u)" = 0 ] || dir=${TMPDIR:-/tmp}/sandfarm-redis-$(id -u)
fi
# its parents as the caller's umask makes them (a 077 parent would hide what else is there)
mkdir -p "$(dirname "$dir")"
umask 077
mkdir -p "$dir"
chmod 0700 "$dir"
chmod -R go-rwx "$dir"
maxmemory=${SANDFARM_REDIS_MAXMEMORY:-$(awk '/^MemTotal:/ {print int($2 / 2) "kb"}' /proc/meminfo)}
echo "[start_redis] redis-server on 127.0.0.1:$port (AOF in $dir, mode 0700," \
  "maxmemory $maxmemory, noeviction)" >&2
auth=()
if [ -n "${SANDFARM_REDIS_PASSWORD:-}" ]; then
  # through a private config file, so the password is not on a command line (ps)
  printf 'requirepass "%s"\n' "$SANDFARM_REDIS_PASSWORD" >"$dir/auth.conf"
  auth=("$dir/auth.conf")
fi
redis-server "${auth[@]}" --daemonize yes --bind 127.0.0.1 --port "$port" --save "" \
  --appendonly yes --appendfsync everysec --dir "$dir" --logfile "$dir/redis.log" \
  --maxmemory "$maxmemory" --maxmemory-policy noeviction
