#!/bin/sh
# The password reaches redis-server on stdin ("-": read more config there), never on
# its command line (visible in ps on the host) nor in a file in the data volume.
set -eu
if [ -z "${REDIS_PASSWORD:-}" ]; then
    echo "sandfarm-redis: REDIS_PASSWORD is empty; refusing to run without a password" >&2
    exit 1
fi
# A cap, so a flood of jobs or results makes Redis refuse writes (noeviction, redis.conf)
# instead of growing until the host's OOM killer ends it: REDIS_MAXMEMORY, else half of
# the container's memory limit, else half of the host's memory (as ops/start_redis.sh).
maxmemory=${REDIS_MAXMEMORY:-}
if [ -z "$maxmemory" ]; then
    limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo max)
    case "$limit" in
        '' | max | *[!0-9]*) maxmemory=$(awk '/^MemTotal:/ {print int($2 / 2) "kb"}' /proc/meminfo) ;;
        *) maxmemory=$((limit / 2)) ;;
    esac
fi
echo "sandfarm-redis: maxmemory $maxmemory (noeviction)" >&2
printf 'requirepass "%s"\nmaxmemory %s\n' "$REDIS_PASSWORD" "$maxmemory" |
    exec redis-server /etc/sandfarm/redis.conf - "$@"
