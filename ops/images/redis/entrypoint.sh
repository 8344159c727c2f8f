#!/bin/sh
# The password reaches redis-server on stdin ("-": read more config there), never on
# its command line (visible in ps on the host) nor in a file in the data volume.
set -eu
if [ -z "${REDIS_PASSWORD:-}" ]; then
    echo "sandfarm-redis: REDIS_PASSWORD is empty; refusing to run without a password" >&2
    exit 1
fi
printf 'requirepass "%s"\n' "$REDIS_PASSWORD" | exec redis-server /etc/sandfarm/redis.conf - "$@"
