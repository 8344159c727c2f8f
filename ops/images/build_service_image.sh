#!/usr/bin/env bash
# Build one of the stack's service images (redis, prometheus) as sandfarm/NAME:latest
# from ops/images/NAME/Dockerfile, FROM the registry-free Debian base that
# build_sandbox_image.sh makes (Debian packages come through apt inside the build).
#
# Idempotent: the image carries sandfarm.inputs-hash over this script, the NAME
# directory and the base image's id (common.sh); an image with the same hash is kept.
#
# Usage: build_service_image.sh NAME     (SANDFARM_FORCE_REBUILD=1 builds anyway)
set -euo pipefail

log() { printf '[build_service_image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"
NAME=${1:?usage: build_service_image.sh NAME}
CONTEXT="$HERE/$NAME"
IMAGE="sandfarm/$NAME:latest"
BASE_IMAGE="sandfarm/base:${SANDFARM_SUITE:-bookworm}"
[ -f "$CONTEXT/Dockerfile" ] || die "no $CONTEXT/Dockerfile"

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "$BASE_IMAGE missing; running build_sandbox_image.sh (it builds the base)"
    "$HERE/build_sandbox_image.sh"
fi

inputs_hash=$(
    {
        cat "${BASH_SOURCE[0]}"
        (cd "$CONTEXT" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        docker image inspect "$BASE_IMAGE" --format '{{.Id}}'
    } | sha256sum | cut -c1-16
)
up_to_date "$IMAGE" "$inputs_hash" && exit 0

log "docker build -t $IMAGE (FROM $BASE_IMAGE, sandfarm.inputs-hash=$inputs_hash)"
t0=$SECONDS
# --network host: apt at build time does not depend on the bridge/NAT setup.
DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0} docker build -q --force-rm --network host \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --label "sandfarm.inputs-hash=$inputs_hash" \
    -t "$IMAGE" "$CONTEXT" >/dev/null
built "$IMAGE" "$t0"
