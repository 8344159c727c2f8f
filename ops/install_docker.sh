#!/usr/bin/env bash
# Install (if missing) and start a Docker engine for sandfarm's docker backend, and
# register gVisor's runsc as an extra OCI runtime when Debian ships it.
#
# Idempotent and fast when already done: if `docker info` answers and runsc is either
# registered or not installable, it exits at once.
#
# Works without systemd (containers, firecracker VMs, CI): dockerd is started directly,
# detached with setsid, logging to $SANDFARM_DOCKERD_LOG.
#
# Environment:
#   SANDFARM_DOCKERD_LOG           dockerd log file (default /var/log/sandfarm-dockerd.log)
#   SANDFARM_DOCKER_WAIT           seconds to wait for `docker info` (default 60)
#   SANDFARM_DOCKERD_EXTRA_FLAGS   extra flags for dockerd, word-split (default empty)
#   SANDFARM_SKIP_RUNSC=1          do not install or register runsc
set -euo pipefail

log() { printf '[install_docker] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

LOG_FILE=${SANDFARM_DOCKERD_LOG:-/var/log/sandfarm-dockerd.log}
WAIT_S=${SANDFARM_DOCKER_WAIT:-60}
DAEMON_JSON=/etc/docker/daemon.json
RUNSC_NAME=runsc

# Debian's docker.io installs its client as /usr/bin/docker; an unrelated, newer client
# may sit earlier in PATH (/usr/local/bin/docker). Either works against this daemon (the
# client negotiates the API version down), so we use whichever PATH finds first and only
# fall back to Debian's when PATH has none.
docker_cli() {
    if command -v docker >/dev/null 2>&1; then docker "$@"; else /usr/bin/docker "$@"; fi
}
# `timeout` cannot run a shell function, so resolve the binary first.
docker_answers() {
    local cli
    cli=$(command -v docker 2>/dev/null || echo /usr/bin/docker)
    [ -x "$cli" ] && timeout 10 "$cli" info >/dev/null 2>&1
}

runsc_registered() {
    docker_cli info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$RUNSC_NAME\""
}

runsc_wanted() { [ "${SANDFARM_SKIP_RUNSC:-0}" != 1 ]; }

runsc_path() { command -v runsc 2>/dev/null || true; }

# ---------------------------------------------------------------------------- fast path
if docker_answers; then
    if ! runsc_wanted || runsc_registered || [ -f /var/lib/sandfarm/runsc-unavailable ]; then
        log "docker engine already answers; nothing to do"
        exit 0
    fi
fi

[ "$(id -u)" = 0 ] || die "must run as root (installs packages and starts dockerd)"

# ---------------------------------------------------------------------------- packages
apt_updated=0
apt_update_once() {
    [ "$apt_updated" = 1 ] && return 0
    log "apt-get update"
    # Unreachable third-party sources make apt-get update exit non-zero even though the
    # Debian lists were refreshed; what matters is whether the candidate exists after.
    apt-get update -qq >&2 || log "apt-get update reported errors (continuing)"
    apt_updated=1
}

has_candidate() {
    local cand
    cand=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')
    [ -n "$cand" ] && [ "$cand" != "(none)" ]
}

apt_install() {
    local missing_candidates=() p
    for p in "$@"; do has_candidate "$p" || missing_candidates+=("$p"); done
    if [ "${#missing_candidates[@]}" -gt 0 ]; then apt_update_once; fi
    log "apt-get install -y --no-install-recommends $*"
    # A policy-rc.d that refuses service starts keeps the package's init script from
    # launching a dockerd with default settings behind our back.
    local made_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0 apt_log=/var/log/sandfarm-apt.log
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" \
        >>"$apt_log" 2>&1 || rc=$?
    if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
    if [ "$rc" != 0 ]; then
        log "apt-get install $* failed (rc $rc); last lines of $apt_log:"
        tail -n 15 "$apt_log" >&2
    fi
    return "$rc"
}

if ! command -v dockerd >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "dockerd missing and no apt-get to install it"
    # iptables, containerd, runc and tini come as dependencies of docker.io.
    apt_install docker.io ca-certificates
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd still missing after installing docker.io"

mkdir -p /var/lib/sandfarm
if runsc_wanted && [ -z "$(runsc_path)" ]; then
    if has_candidate runsc || { apt_update_once; has_candidate runsc; }; then
        apt_install runsc || log "runsc: apt-get install failed; continuing without gVisor"
    else
        log "runsc: no Debian package candidate (apt-cache policy runsc); continuing without gVisor"
    fi
fi

# ---------------------------------------------------------------------------- daemon.json
# Merge (never clobber) the runsc runtime into daemon.json. --network=none: gVisor's own
# netstack is never needed, sandboxes run without network anyway.
write_daemon_json() {
    local runsc_bin
    runsc_bin=$(runsc_path)
    mkdir -p "$(dirname "$DAEMON_JSON")"
    local py
    py=$(command -v /usr/bin/python3 python3 2>/dev/null | head -n1 || true)
    if [ -z "$py" ]; then
        log "no python3 to merge $DAEMON_JSON; leaving it as is"
        return 0
    fi
    "$py" - "$DAEMON_JSON" "$RUNSC_NAME" "$runsc_bin" <<'PY'
import json, os, sys
path, name, runsc = sys.argv[1:4]
try:
    with open(path) as f:
        cfg = json.load(f)
except FileNotFoundError:
    cfg = {}
before = json.dumps(cfg, sort_keys=True)
# Bound what a chatty container can leave on the host disk.
cfg.setdefault("log-driver", "json-file")
cfg.setdefault("log-opts", {"max-size": "10m", "max-file": "2"})
if runsc:
    cfg.setdefault("runtimes", {})[name] = {"path": runsc, "runtimeArgs": ["--network=none"]}
after = json.dumps(cfg, sort_keys=True)
if after != before:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    print("changed")
PY
}

json_changed=$(write_daemon_json)
if [ -n "$json_changed" ]; then log "updated $DAEMON_JSON"; fi
if runsc_wanted && [ -z "$(runsc_path)" ]; then
    : >/var/lib/sandfarm/runsc-unavailable
else
    rm -f /var/lib/sandfarm/runsc-unavailable
fi

# ---------------------------------------------------------------------------- start dockerd
dockerd_pid() { pgrep -x dockerd | head -n1 || true; }

wait_for_docker() {
    local deadline=$((SECONDS + $1)) pid=$2
    while [ "$SECONDS" -lt "$deadline" ]; do
        docker_answers && return 0
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
        sleep 0.5
    done
    return 1
}

start_dockerd() {
    local -a flags=("$@")
    log "starting: dockerd${flags[*]:+ ${flags[*]}} (log: $LOG_FILE)"
    mkdir -p "$(dirname "$LOG_FILE")"
    printf '\n==== %s sandfarm: dockerd %s\n' "$(date -Is)" "${flags[*]}" >>"$LOG_FILE"
    # setsid: own session, so the daemon survives the shell that started it.
    setsid nohup dockerd "${flags[@]}" >>"$LOG_FILE" 2>&1 </dev/null &
    local pid=$!
    if wait_for_docker "$WAIT_S" "$pid"; then
        log "dockerd (pid $pid) answers"
        return 0
    fi
    log "dockerd did not come up with flags: ${flags[*]:-(none)}; from $LOG_FILE:"
    # dockerd's last words are the reason; the grpc chatter before them is not.
    awk '/^==== /{n=NR} {l[NR]=$0} END{for(i=n;i<=NR;i++) print l[i]}' "$LOG_FILE" |
        grep -E 'failed to start|level=(error|fatal)' | tail -n 5 >&2 || true
    kill "$pid" 2>/dev/null || true
    sleep 1
    return 1
}

if docker_answers; then
    # Running already; pick up the runtime we just registered. `runtimes` is one of
    # dockerd's live-reloadable options.
    if [ -n "$json_changed" ]; then
        pid=$(dockerd_pid)
        if [ -n "$pid" ]; then
            log "reloading dockerd (SIGHUP pid $pid) for $DAEMON_JSON changes"
            kill -HUP "$pid"
            sleep 1
        else
            log "a docker engine answers but is not a local dockerd; not touching it"
        fi
    fi
else
    pid=$(dockerd_pid)
    if [ -n "$pid" ]; then
        log "dockerd (pid $pid) is running but not answering yet; waiting"
        wait_for_docker "$WAIT_S" "$pid" || die "dockerd pid $pid does not answer; see $LOG_FILE"
    else
        # Remove a stale pidfile from a killed daemon; dockerd refuses to start otherwise.
        if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
            rm -f /var/run/docker.pid
        fi
        # shellcheck disable=SC2206  # intentional word splitting of extra flags
        extra=(${SANDFARM_DOCKERD_EXTRA_FLAGS:-})
        # Ladder of fallbacks: the defaults (overlay2, bridge with iptables NAT) work on
        # this project's reference hosts; the others only for kernels without nf_tables or
        # overlayfs. Sandboxes run with --network none, so they do not need the bridge.
        start_dockerd "${extra[@]}" \
            || start_dockerd "${extra[@]}" --iptables=false \
            || start_dockerd "${extra[@]}" --iptables=false --storage-driver=vfs \
            || die "dockerd failed to start with every fallback; see $LOG_FILE"
    fi
fi

info=$(docker_cli info --format 'server {{.ServerVersion}}, storage {{.Driver}}, cgroup {{.CgroupDriver}} v{{.CgroupVersion}}, default runtime {{.DefaultRuntime}}')
log "$info"
if runsc_wanted; then
    if runsc_registered; then
        log "runtime '$RUNSC_NAME' registered ($(runsc --version 2>/dev/null | head -n1))"
    else
        log "runtime '$RUNSC_NAME' not available (see messages above)"
    fi
fi
