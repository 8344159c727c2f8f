#!/usr/bin/env bash
# Build the worker image (default sandfarm/worker:latest) from ops/images/worker/Dockerfile.
#
# The build context is what the image installs (CONTEXT_PATHS: the packages, their
# metadata, this image's directory), restricted to files git tracks or does not ignore
# (no .git, .venv, caches), streamed as a tar: an edit of the tests or docs keeps the
# image. Idempotent: the image carries the
# label sandfarm.inputs-hash over that file set; an image with the same hash is kept.
#
# Environment:
#   SANDFARM_WORKER_IMAGE   image to build (default sandfarm/worker:latest)
#   SANDFARM_SUITE          Debian suite of the base image (default bookworm)
#   SANDFARM_FORCE_REBUILD=1  build even when the hash matches
set -euo pipefail

log() { printf '[build_worker_image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"
ROOT=$(cd "$HERE/../.." && pwd)
IMAGE=${SANDFARM_WORKER_IMAGE:-sandfarm/worker:latest}
SUITE=${SANDFARM_SUITE:-bookworm}
BASE_IMAGE="sandfarm/base:$SUITE"
DOCKERFILE=ops/images/worker/Dockerfile

[ -f "$ROOT/pyproject.toml" ] || die "no $ROOT/pyproject.toml yet; nothing to install"

if ! timeout 10 docker info >/dev/null 2>&1; then
    log "docker engine not answering; running ops/install_docker.sh"
    "$ROOT/ops/install_docker.sh"
fi

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "$BASE_IMAGE missing; running build_sandbox_image.sh (it builds the base)"
    "$HERE/build_sandbox_image.sh"
fi

# NUL-separated list of the context files, relative to ROOT.
context_files() {
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
            while IFS= read -r -d '' f; do
                # tracked but deleted in the work tree
                if [ -e "$ROOT/$f" ]; then printf '%s\0' "$f"; fi
            done
    else
        (cd "$ROOT" && find . \( -name .git -o -name .venv -o -name __pycache__ \
            -o -name '*.egg-info' -o -name .pytest_cache \) -prune -o -type f -print0)
    fi
}

files=$(mktemp)
trap 'rm -f "$files"' EXIT
# What the image needs: pyproject.toml names README.md as the package's readme.
CONTEXT_PATHS='^(pyproject\.toml|README\.md|sandbox_core/|producer/|worker/|ops/images/worker/)'
context_files | grep -zE "$CONTEXT_PATHS" | LC_ALL=C sort -z >"$files"

inputs_hash=$(
    {
        (cd "$ROOT" && xargs -0 sha256sum <"$files" 2>/dev/null) || true  # tolerate races
        docker image inspect "$BASE_IMAGE" --format '{{.Id}}'
    } | sha256sum | cut -c1-16
)
up_to_date "$IMAGE" "$inputs_hash" && exit 0

# Stage the context: the repository's files plus a wheelhouse.
ctx=$(mktemp -d)
trap 'rm -f "$files"; rm -rf "$ctx"' EXIT
# --ignore-failed-read: a file deleted between `git ls-files` and here is not an error.
tar -C "$ROOT" --ignore-failed-read --null -T "$files" -c | tar -C "$ctx" -x
mkdir -p "$ctx/.wheels"

# Download every dependency (and the build backend) on the host, with the host's pip
# configuration (index mirrors, proxy CA), as cp311 manylinux wheels for the image's
# Debian python3. Then the image build needs no PyPI access at all.
pip_no_index=0
img_full=$(docker run --rm --network none "$BASE_IMAGE" python3 -c \
    'import platform; print(platform.python_version())')
pyver=${img_full%.*}
# pip evaluates environment markers (python_full_version < "3.11.3") with the interpreter
# it runs on, not with --python-version: prefer a host python of the image's exact
# version (Debian's /usr/bin/python3 on a host of the same release), then same minor.
pick_host_python() {
    local c v best=""
    for c in /usr/bin/python3 "$(command -v "python$pyver" || true)" "$(command -v python3 || true)"; do
        [ -n "$c" ] && [ -x "$c" ] || continue
        "$c" -m pip --version >/dev/null 2>&1 || continue
        v=$("$c" -c 'import platform; print(platform.python_version())' 2>/dev/null) || continue
        if [ "$v" = "$img_full" ]; then echo "$c"; return; fi
        if [ -z "$best" ] && [ "${v%.*}" = "$pyver" ]; then best=$c; fi
    done
    if [ -n "$best" ]; then
        log "no host python $img_full with pip; using $best (markers may differ)"
    fi
    echo "$best"
}
host_py=$(pick_host_python)
if [ -n "$host_py" ]; then
    "$host_py" - "$ROOT/pyproject.toml" >"$ctx/.wheels/requirements.txt" <<'PY'
import sys, tomllib
d = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(d["project"].get("dependencies", []) + d.get("build-system", {}).get("requires", [])))
PY
    plats=()
    for m in $(seq 40 -1 5); do plats+=(--platform "manylinux_2_${m}_x86_64"); done
    plats+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
    abi="cp${pyver/./}"
    log "pip download ($host_py -m pip, cp${pyver/./} wheels) -> build context"
    if "$host_py" -m pip download -q -d "$ctx/.wheels" --only-binary=:all: \
        --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
        "${plats[@]}" -r "$ctx/.wheels/requirements.txt" 2> >(grep -v 'is ignored' >&2); then
        pip_no_index=1
    else
        log "host pip download failed; the image build will use the package index itself"
        find "$ctx/.wheels" -name '*.whl' -delete
    fi
    rm -f "$ctx/.wheels/requirements.txt"
else
    log "no host python $pyver with pip; the image build will use the package index itself"
fi

log "docker build -t $IMAGE -f $DOCKERFILE ($(tr -cd '\0' <"$files" | wc -c) files, hash $inputs_hash)"
t0=$SECONDS
# --network host: apt at build time does not depend on the bridge/NAT setup.
build() {
    DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0} docker build -q --force-rm --network host \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --build-arg "PIP_NO_INDEX=$pip_no_index" \
        -f "$ctx/$DOCKERFILE" "$@" "$ctx" >/dev/null
}
# The legacy builder leaves the build stage as an untagged image (~700 MB) per build:
# tag the newest (it holds the dependencies' layer cache), prune the earlier ones.
build --target build -t "${IMAGE%:*}:build-stage"
build --label "sandfarm.inputs-hash=$inputs_hash" -t "$IMAGE"
docker image prune -f --filter "label=sandfarm.stage=worker-build" >/dev/null 2>&1 || true
built "$IMAGE" "$t0"
