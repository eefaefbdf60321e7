#!/bin/sh
# Builds the operator and shim images offline into OCI archives under out/images/.
# Input: the repository (images/*.Containerfile); BASE=registry uses python:3.11-slim instead of
# the local Debian root filesystem. Output: out/images/{operator,shim}.oci.tar, each labelled
# with its stitchfleet version and pip freeze; build times and sizes printed.
# Tools: Debian's debootstrap and buildah (installed with apt-get when missing, as root),
# buildah with --storage-driver vfs --isolation chroot: no daemon, no registry needed.
set -eu
cd "$(dirname "$0")/.."
OUT=out/images
CACHE=${STITCHFLEET_IMAGE_CACHE:-out/cache}
TAG=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' stitchfleet/__init__.py)
BASE=${BASE:-local}
NICE="nice -n 10"
BUILDAH="$NICE buildah --storage-driver vfs"
mkdir -p "$OUT" "$CACHE"
# One build at a time (a test session and `make images` share out/): wait for the other.
exec 9>"$CACHE/.lock"
flock 9

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "== installing buildah and debootstrap (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null
fi

if [ "$BASE" = local ]; then
  # The debootstrap tarball is cached: a second build skips its minutes.
  if [ ! -f "$CACHE/rootfs.tar" ]; then
    start=$(date +%s)
    echo "== debootstrap bookworm root filesystem (cached in $CACHE/rootfs.tar)"
    # A directory of this run's own: debootstrap mounts /proc in it, and a failed run must
    # unmount before anything deletes the tree (rm -rf would walk into the live /proc).
    ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'umount "$ROOTFS/proc" "$ROOTFS/sys" 2>/dev/null || true; rm -rf --one-file-system "$ROOTFS"' EXIT
    $NICE debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
      bookworm "$ROOTFS" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$CACHE/debootstrap.log" \
      || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    umount "$ROOTFS/proc" "$ROOTFS/sys" 2>/dev/null || true
    rm -rf "$ROOTFS/var/cache/apt/archives/"*.deb "$ROOTFS/var/lib/apt/lists/"*
    tar -C "$ROOTFS" --one-file-system -cf "$CACHE/rootfs.tar.part" . && mv "$CACHE/rootfs.tar.part" "$CACHE/rootfs.tar"
    rm -rf --one-file-system "$ROOTFS"
    trap - EXIT
    echo "   debootstrap took $(( $(date +%s) - start )) s"
  fi
  # The cache directory is the base image's build context: it holds rootfs.tar.
  $BUILDAH bud --isolation chroot -q -f images/base.Containerfile -t localhost/stitchfleet-base:bookworm "$CACHE" >/dev/null
  BASE_IMAGE=localhost/stitchfleet-base:bookworm
else
  BASE_IMAGE=python:3.11-slim
fi

# The host's CA bundle, mounted for pip during the build only (not in the image): where a proxy
# re-signs TLS, the base image's own bundle fails to verify PyPI.
HOST_CA=${STITCHFLEET_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}
CA_ARGS=""
[ -f "$HOST_CA" ] && CA_ARGS="--volume $HOST_CA:/run/host-ca.crt:ro --build-arg PIP_CERT=/run/host-ca.crt"

for name in operator shim; do
  start=$(date +%s)
  image=ghcr.io/stitchfleet/stitchfleet
  [ "$name" = shim ] && image=ghcr.io/stitchfleet/stitchfleet-shim
  echo "== building $image:$TAG from $BASE_IMAGE"
  $BUILDAH bud --isolation chroot --layers=false -q --build-arg "BASE=$BASE_IMAGE" $CA_ARGS \
    -f "images/$name.Containerfile" -t "$image:$TAG" . >/dev/null
  # The content list goes into labels: a second commit of the built image with them added.
  ctr=$($BUILDAH from "$image:$TAG")
  freeze=$($BUILDAH run --isolation chroot "$ctr" -- /opt/venv/bin/pip freeze --disable-pip-version-check | tr '\n' ' ')
  version=$($BUILDAH run --isolation chroot "$ctr" -- /opt/venv/bin/stitchfleet --version)
  $BUILDAH config --label "io.stitchfleet.version=$version" --label "io.stitchfleet.pip-freeze=$freeze" \
    --label "org.opencontainers.image.version=$TAG" "$ctr"
  $BUILDAH commit -q "$ctr" "$image:$TAG" >/dev/null
  $BUILDAH rm "$ctr" >/dev/null
  rm -f "$OUT/$name.oci.tar"
  $BUILDAH push -q "$image:$TAG" "oci-archive:$OUT/$name.oci.tar:$image:$TAG"
  echo "   $name: $(( $(date +%s) - start )) s, archive $(du -m "$OUT/$name.oci.tar" | cut -f1) MiB ($OUT/$name.oci.tar)"
done
