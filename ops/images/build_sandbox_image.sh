#!/usr/bin/env bash
# Build the sandbox runtime image (default sandfarm/sandbox:latest) without a container
# registry:
#
#   debootstrap --variant=minbase (python3, pytest)  ->  slimmed rootfs tarball, cached in
#   $SANDFARM_CACHE_DIR  ->  `docker import` as sandfarm/base:<suite>  ->  `docker build`
#   of ops/images/sandbox/Dockerfile on top (unprivileged user, /workspace, labels).
#
# Idempotent: the final image carries the label sandfarm.inputs-hash (this script, the
# Dockerfile directory and the settings below); when the existing image has the same
# hash, nothing is done. The base image carries sandfarm.rootfs-key and the rootfs
# tarball is reused across rebuilds, so changing only the Dockerfile costs seconds.
#
# Environment:
#   SANDFARM_SANDBOX_IMAGE        image to build           (default sandfarm/sandbox:latest)
#   SANDFARM_SUITE                Debian suite             (default bookworm)
#   SANDFARM_DEBIAN_MIRROR        Debian mirror URL        (default: from /etc/apt/sources.list*)
#   SANDFARM_CACHE_DIR            rootfs/.deb cache        (default /var/cache/sandfarm)
#   SANDFARM_SANDBOX_PACKAGES     extra Debian packages, comma separated (default none)
#   SANDFARM_IMAGE_FROM_REGISTRY=1  build FROM python:3.11-slim instead (needs a registry)
#   SANDFARM_FORCE_REBUILD=1      ignore the caches (re-runs debootstrap, reusing .debs)
set -euo pipefail

log() { printf '[build_sandbox_image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OPS=$(dirname "$HERE")
CONTEXT="$HERE/sandbox"

IMAGE=${SANDFARM_SANDBOX_IMAGE:-sandfarm/sandbox:latest}
SUITE=${SANDFARM_SUITE:-bookworm}
BASE_IMAGE="sandfarm/base:$SUITE"
CACHE_DIR=${SANDFARM_CACHE_DIR:-/var/cache/sandfarm}
FROM_REGISTRY=${SANDFARM_IMAGE_FROM_REGISTRY:-0}
FORCE=${SANDFARM_FORCE_REBUILD:-0}
REGISTRY_BASE=python:3.11-slim

# What goes into the rootfs. bash, coreutils, passwd (useradd) are in minbase already.
# Bump ROOTFS_RECIPE whenever make_rootfs_tarball changes what it produces.
ROOTFS_RECIPE=1
VARIANT=minbase
PACKAGES="python3,python3-pytest${SANDFARM_SANDBOX_PACKAGES:+,$SANDFARM_SANDBOX_PACKAGES}"

sha256() { sha256sum | cut -c1-16; }

label_of() {  # label_of IMAGE LABEL -> value, or empty when the image is absent
    docker image inspect "$1" --format "{{ index .Config.Labels \"$2\" }}" 2>/dev/null || true
}

# ---------------------------------------------------------------------------- docker
if ! timeout 10 docker info >/dev/null 2>&1; then
    log "docker engine not answering; running ops/install_docker.sh"
    "$OPS/install_docker.sh"
fi

# ---------------------------------------------------------------------------- inputs hash
inputs_hash=$(
    {
        cat "${BASH_SOURCE[0]}"
        # every file of the build context, in a stable order, with its name
        (cd "$CONTEXT" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
        echo "suite=$SUITE packages=$PACKAGES registry=$FROM_REGISTRY"
    } | sha256
)

if [ "$FORCE" != 1 ] && [ "$(label_of "$IMAGE" sandfarm.inputs-hash)" = "$inputs_hash" ]; then
    log "$IMAGE is up to date (sandfarm.inputs-hash=$inputs_hash)"
    exit 0
fi

# ---------------------------------------------------------------------------- mirror
# First "deb" source of SUITE (not -updates/-security) in one-line or deb822 format.
detect_mirror() {  # detect_mirror SUITE DEFAULT
    local suite=$1 default=$2 m=""
    shopt -s nullglob
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list)
    local d822=(/etc/apt/sources.list.d/*.sources)
    shopt -u nullglob
    if [ "${#files[@]}" -gt 0 ]; then
        m=$(awk -v s="$suite" '
            $1 == "deb" { sub(/\[[^]]*\] */, ""); if ($3 == s) { print $2; exit } }
        ' "${files[@]}" 2>/dev/null || true)
    fi
    if [ -z "$m" ] && [ "${#d822[@]}" -gt 0 ]; then
        m=$(awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^Types:/)  { types = $i;  sub(/^Types:[ \t]*/, "", types) }
                    if ($i ~ /^URIs:/)   { uris = $i;   sub(/^URIs:[ \t]*/, "", uris) }
                    if ($i ~ /^Suites:/) { suites = $i; sub(/^Suites:[ \t]*/, "", suites) }
                }
                if (types !~ /(^| )deb( |$)/) next
                n = split(suites, a, /[ \t]+/)
                for (j = 1; j <= n; j++) if (a[j] == s) { split(uris, u, /[ \t]+/); print u[1]; exit }
            }' "${d822[@]}" 2>/dev/null || true)
    fi
    echo "${m:-$default}"
}

# ---------------------------------------------------------------------------- rootfs
rootfs_key=$(printf 'recipe=%s variant=%s suite=%s packages=%s\n' \
    "$ROOTFS_RECIPE" "$VARIANT" "$SUITE" "$PACKAGES" | sha256)
tarball="$CACHE_DIR/rootfs-$SUITE-$rootfs_key.tar"

rootfs_dir=""
cleanup() {
    if [ -n "$rootfs_dir" ] && [ -d "$rootfs_dir" ]; then
        # debootstrap mounts proc/sys inside the target; an interrupted run can leave them.
        awk -v r="$rootfs_dir" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r |
            while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
        rm -rf --one-file-system "$rootfs_dir"
    fi
    rm -f "$tarball.tmp"
}
trap cleanup EXIT

make_rootfs_tarball() {
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap"
        apt-cache policy debootstrap 2>/dev/null | grep -q 'Candidate: [0-9]' ||
            apt-get update -qq >&2 || log "apt-get update reported errors (continuing)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            debootstrap >&2
    fi
    local mirror security
    mirror=$(detect_mirror "$SUITE" http://deb.debian.org/debian)
    security=$(detect_mirror "$SUITE-security" http://deb.debian.org/debian-security)
    mkdir -p "$CACHE_DIR/debs"
    rootfs_dir=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
    log "debootstrap --variant=$VARIANT --include=$PACKAGES $SUITE $rootfs_dir $mirror"
    local t0=$SECONDS
    # --cache-dir keeps the downloaded .debs, so a recipe change does not re-download.
    debootstrap --variant="$VARIANT" --include="$PACKAGES" --cache-dir="$CACHE_DIR/debs" \
        "$SUITE" "$rootfs_dir" "$mirror" >"$CACHE_DIR/debootstrap.log" 2>&1 ||
        { tail -n 30 "$CACHE_DIR/debootstrap.log" >&2; die "debootstrap failed"; }
    log "debootstrap took $((SECONDS - t0)) s"

    log "slimming rootfs (docs, man pages, locales, apt lists, logs)"
    local r=$rootfs_dir
    # Same trims as Debian's -slim images, and keep future `apt-get install`s slim too.
    cat >"$r/etc/dpkg/dpkg.cfg.d/sandfarm-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
    cat >"$r/etc/apt/apt.conf.d/sandfarm-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
EOF
    find "$r/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$r/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
        "$r"/usr/share/lintian/* "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin \
        "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/debconf/*-old \
        "$r"/var/lib/dpkg/*-old "$r"/tmp/* "$r"/var/tmp/*
    find "$r/var/log" -type f -delete
    : >"$r/etc/machine-id"
    # Docker bind-mounts these at run time; do not ship the build host's.
    rm -f "$r/etc/hostname" "$r/etc/resolv.conf"
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
        "$mirror" "$SUITE" "$mirror" "$SUITE" "$security" "$SUITE" >"$r/etc/apt/sources.list"

    log "writing $tarball"
    # /dev, /proc, /sys stay empty: the engine provides them.
    tar --numeric-owner --xattrs -C "$r" \
        --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* \
        -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf --one-file-system "$rootfs_dir"
    rootfs_dir=""
    # Older recipes' tarballs are dead weight.
    find "$CACHE_DIR" -maxdepth 1 -name "rootfs-$SUITE-*.tar" -not -name "$(basename "$tarball")" -delete
}

ensure_base_image() {
    if [ "$FORCE" != 1 ] && [ "$(label_of "$BASE_IMAGE" sandfarm.rootfs-key)" = "$rootfs_key" ]; then
        log "$BASE_IMAGE is up to date (sandfarm.rootfs-key=$rootfs_key)"
        return 0
    fi
    if [ "$FORCE" = 1 ] || [ ! -s "$tarball" ]; then
        make_rootfs_tarball
    else
        log "reusing cached rootfs $tarball"
    fi
    log "docker import $tarball $BASE_IMAGE"
    docker import \
        --change "LABEL sandfarm.rootfs-key=$rootfs_key" \
        --change "LABEL org.opencontainers.image.description=\"Debian $SUITE $VARIANT + $PACKAGES\"" \
        --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        "$tarball" "$BASE_IMAGE" >/dev/null
}

# ---------------------------------------------------------------------------- build
t_start=$SECONDS
if [ "$FROM_REGISTRY" = 1 ]; then
    base=$REGISTRY_BASE
    log "SANDFARM_IMAGE_FROM_REGISTRY=1: building FROM $base"
else
    ensure_base_image
    base=$BASE_IMAGE
fi

log "docker build -t $IMAGE (FROM $base, sandfarm.inputs-hash=$inputs_hash)"
# The legacy builder is used when the client has no buildx plugin; silence its banner.
DOCKER_BUILDKIT=${DOCKER_BUILDKIT:-0} docker build -q --force-rm \
    --build-arg "BASE_IMAGE=$base" \
    --label "sandfarm.inputs-hash=$inputs_hash" \
    --label "sandfarm.base=$base" \
    -t "$IMAGE" "$CONTEXT" >/dev/null

# Drop the image this build replaced, if nothing else uses it.
docker image prune -f --filter "label=sandfarm.inputs-hash" >/dev/null 2>&1 || true

size=$(docker image inspect "$IMAGE" --format '{{.Size}}')
log "built $IMAGE ($((size / 1024 / 1024)) MB) in $((SECONDS - t_start)) s"
