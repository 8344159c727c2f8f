# Shared by the image build scripts (sourced): each image carries the label
# sandfarm.inputs-hash over its inputs, and a build is skipped while it matches.

# up_to_date IMAGE HASH: true (and says so) when IMAGE has HASH and no rebuild is forced.
up_to_date() {
    local current
    current=$(docker image inspect "$1" \
        --format '{{ index .Config.Labels "sandfarm.inputs-hash" }}' 2>/dev/null || true)
    [ "${SANDFARM_FORCE_REBUILD:-0}" != 1 ] && [ "$current" = "$2" ] || return 1
    log "$1 is up to date (sandfarm.inputs-hash=$2)"
}

# built IMAGE T0: drop the images this build replaced, say its size and time.
built() {
    docker image prune -f --filter "label=sandfarm.inputs-hash" >/dev/null 2>&1 || true
    local size
    size=$(docker image inspect "$1" --format '{{.Size}}')
    log "built $1 ($((size / 1024 / 1024)) MB) in $((SECONDS - $2)) s"
}
