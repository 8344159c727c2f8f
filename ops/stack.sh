#!/usr/bin/env bash
# The compose stack (docker-compose.yml): the whole farm as containers on this host.
#
#   ops/stack.sh up              build the images whose inputs changed, write the env file
#                                on first use, start everything, wait until all is healthy
#   ops/stack.sh down [--volumes]  remove containers and networks (and the named data
#                                volumes with --volumes)
#   ops/stack.sh ps | logs [SERVICE] | compose ARGS...   the compose CLI on this project
#   ops/stack.sh sandfarm ARGS...  the sandfarm CLI inside the stack (e.g. tenant add)
#
# Environment:
#   SANDFARM_STACK_ENV_FILE   the env file (default .stack.env beside docker-compose.yml):
#                             passwords, ports, bind addresses; made 0600 on first use
#   SANDFARM_STACK_WAIT       seconds to wait for health (default 240)
# Any variable of the env file set in the environment wins over the file.
set -euo pipefail

log() { printf '[stack] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
ENV_FILE=${SANDFARM_STACK_ENV_FILE:-$ROOT/.stack.env}
WAIT_S=${SANDFARM_STACK_WAIT:-240}

# ---------------------------------------------------------------------------- tools
ensure_docker() {
    if timeout 10 docker info >/dev/null 2>&1; then return; fi
    [ "$(id -u)" = 0 ] || die "no Docker engine answers; start one (ops/install_docker.sh as root)"
    "$HERE/install_docker.sh"
}

# The compose plugin where the client has it, else Debian's docker-compose (installed
# here when root): both read the same file.
COMPOSE=()
ensure_compose() {
    if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose); return; fi
    if ! command -v docker-compose >/dev/null 2>&1; then
        [ "$(id -u)" = 0 ] || die "no docker compose; install Debian's docker-compose"
        log "installing Debian's docker-compose"
        apt-cache policy docker-compose 2>/dev/null | grep -q 'Candidate: [0-9]' ||
            apt-get update -qq >&2 || log "apt-get update reported errors (continuing)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            docker-compose >/dev/null
    fi
    COMPOSE=(docker-compose)
}

# ---------------------------------------------------------------------------- env file
secret() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }  # 192 bits, URL-safe hex

# Add each missing KEY=VALUE (a new key of a newer stack lands in an old file too).
ensure_env_file() {
    local made=0
    if [ ! -f "$ENV_FILE" ]; then
        (umask 077 && : >"$ENV_FILE")
        made=1
    fi
    chmod 0600 "$ENV_FILE"
    local defaults=(
        "SANDFARM_STACK_PROJECT=sandfarm"
        "SANDFARM_REDIS_PASSWORD=$(secret)"
        "SANDFARM_FLOWER_USER=admin"
        "SANDFARM_FLOWER_PASSWORD=$(secret)"
        "SANDFARM_METRICS_TOKEN=$(secret)"
        "SANDFARM_STACK_BIND=127.0.0.1"
        "SANDFARM_STACK_REDIS_BIND=127.0.0.1"
        "SANDFARM_STACK_REDIS_PORT=6380"
        "SANDFARM_STACK_GATEWAY1_PORT=8001"
        "SANDFARM_STACK_GATEWAY2_PORT=8002"
        "SANDFARM_STACK_FLOWER_PORT=5555"
        "SANDFARM_STACK_PROMETHEUS_PORT=9090"
    )
    local kv
    for kv in "${defaults[@]}"; do
        grep -q "^${kv%%=*}=" "$ENV_FILE" || echo "$kv" >>"$ENV_FILE"
    done
    [ "$made" = 1 ] && log "wrote $ENV_FILE (0600): the stack's passwords, ports and binds"
    # The file's values, then the environment's over them (as compose does).
    local key value
    while IFS='=' read -r key value; do
        case "$key" in '' | \#*) continue ;; esac
        [ -n "${!key+x}" ] || export "$key=$value"
    done <"$ENV_FILE"
    case "$SANDFARM_STACK_REDIS_BIND" in  # the host-network workers' way to Redis
        0.0.0.0 | '' | '*') export SANDFARM_STACK_REDIS_HOST=127.0.0.1 ;;
        *) export SANDFARM_STACK_REDIS_HOST=$SANDFARM_STACK_REDIS_BIND ;;
    esac
}

compose() { "${COMPOSE[@]}" -p "$SANDFARM_STACK_PROJECT" -f "$ROOT/docker-compose.yml" \
    --env-file "$ENV_FILE" "$@"; }

shown() { printf '%s…' "${1:0:4}"; }  # never a whole password on a terminal or in a log

# ---------------------------------------------------------------------------- up
build_images() {
    "$HERE/images/build_sandbox_image.sh"  # the base image, and the docker jobs' image
    "$HERE/images/build_worker_image.sh"   # gateway, workers, Flower, CLI
    "$HERE/images/build_service_image.sh" redis
    "$HERE/images/build_service_image.sh" prometheus
}

# The docker backend mounts a devpts per job container under this directory (its
# fixed place, as on a host worker); the engine (the host's mount namespace) must see
# those mounts: a shared bind mount of the directory onto itself. It stays after
# `down` (harmless; another stack's or a host worker's containers may use it).
PTS_DIR=/var/lib/sandfarm/work/docker-pts
prepare_host_dirs() {
    mkdir -p "$PTS_DIR" /run/sandfarm
    mountpoint -q "$PTS_DIR" || mount --bind "$PTS_DIR" "$PTS_DIR"
    mount --make-rshared "$PTS_DIR"
}

health_of() {  # health_of CONTAINER -> healthy|unhealthy|starting|running|exited...
    docker inspect "$1" --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}'
}

wait_healthy() {
    local deadline=$((SECONDS + WAIT_S)) ids id state waiting
    while :; do
        mapfile -t ids < <(compose ps -q)
        [ "${#ids[@]}" -gt 0 ] || die "no container of project $SANDFARM_STACK_PROJECT"
        waiting=()
        for id in "${ids[@]}"; do
            state=$(health_of "$id")
            case "$state" in
                healthy) ;;
                unhealthy | exited | dead)
                    docker logs --tail 30 "$id" >&2 || true
                    die "$(docker inspect "$id" --format '{{.Name}}') is $state" ;;
                *) waiting+=("$(docker inspect "$id" --format '{{.Name}}'):$state") ;;
            esac
        done
        [ "${#waiting[@]}" -eq 0 ] && return 0
        [ "$SECONDS" -lt "$deadline" ] || die "not healthy after ${WAIT_S}s: ${waiting[*]}"
        sleep 2
    done
}

# docker-compose 1.29 fails to recreate a container on Docker >= 25 (KeyError
# 'ContainerConfig'): remove the containers whose image was rebuilt before `up`.
remove_stale_containers() {
    local id image current stale=()
    while read -r id; do
        [ -n "$id" ] || continue
        image=$(docker inspect "$id" --format '{{.Config.Image}}')
        current=$(docker image inspect "$image" --format '{{.Id}}' 2>/dev/null || true)
        [ "$(docker inspect "$id" --format '{{.Image}}')" = "$current" ] || stale+=("$id")
    done < <(compose ps -q)
    if [ "${#stale[@]}" -gt 0 ]; then
        log "removing ${#stale[@]} container(s) whose image was rebuilt"
        docker rm -f "${stale[@]}" >/dev/null
    fi
}

up() {
    [ "$(id -u)" = 0 ] || die "the stack needs root (privileged workers, host mounts)"
    local t0=$SECONDS
    build_images
    prepare_host_dirs
    remove_stale_containers
    compose up -d --remove-orphans
    wait_healthy
    local b=$SANDFARM_STACK_BIND
    log "up and healthy in $((SECONDS - t0)) s (project $SANDFARM_STACK_PROJECT)"
    log "gateways   http://$b:$SANDFARM_STACK_GATEWAY1_PORT  http://$b:$SANDFARM_STACK_GATEWAY2_PORT"
    log "flower     http://$b:$SANDFARM_STACK_FLOWER_PORT  ($SANDFARM_FLOWER_USER / $(shown "$SANDFARM_FLOWER_PASSWORD"))"
    log "prometheus http://$b:$SANDFARM_STACK_PROMETHEUS_PORT"
    log "redis      $SANDFARM_STACK_REDIS_BIND:$SANDFARM_STACK_REDIS_PORT  (password $(shown "$SANDFARM_REDIS_PASSWORD"))"
    log "passwords: $ENV_FILE; a tenant: ops/stack.sh sandfarm tenant add NAME"
}

down() {
    local volumes=()
    [ "${1:-}" = --volumes ] && volumes=(--volumes)
    compose down --remove-orphans "${volumes[@]}"
    log "down${volumes:+ (volumes removed)}"
}

# ---------------------------------------------------------------------------- main
cmd=${1:-up}
[ $# -gt 0 ] && shift
ensure_docker
ensure_compose
ensure_env_file
case "$cmd" in
    up) up ;;
    down) down "$@" ;;
    ps) compose ps ;;
    logs) compose logs --tail 100 "$@" ;;
    compose) compose "$@" ;;
    sandfarm) compose exec -T gateway-1 sandfarm "$@" ;;
    *) die "unknown command $cmd (up, down [--volumes], ps, logs, compose, sandfarm)" ;;
esac
