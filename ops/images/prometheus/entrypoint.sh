#!/bin/sh
# Prometheus reads the gateways' bearer token from a file (its config expands no
# environment): write it readable only by the prometheus user, then drop root.
set -eu
umask 077
printf '%s' "${SANDFARM_METRICS_TOKEN:-}" >/run/metrics_token
chown prometheus:prometheus /run/metrics_token /prometheus
exec setpriv --reuid=prometheus --regid=prometheus --init-groups \
    /usr/bin/prometheus --config.file=/etc/prometheus/prometheus.yml \
    --storage.tsdb.path=/prometheus --web.listen-address=0.0.0.0:9090 "$@"
