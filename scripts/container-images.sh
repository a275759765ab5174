#!/usr/bin/env bash
# The images the compose test needs and no registry here can give, made once
# per machine and reused: a Debian bookworm base from debootstrap
# (localhost/debian:bookworm), and from it the stand-ins for the public
# images compose.yaml names (Redis, MariaDB, Prometheus: Debian's packages),
# recipes in deploy/test/stand-ins/. Each image is tagged with a hash of its
# recipe; one whose tag exists is not made again, so a changed recipe makes
# a new image and an unchanged one costs nothing.
#
#   scripts/container-images.sh          make what is missing; print the tag
#                                        (FS_STANDIN_TAG=...) on the last line
#   scripts/container-images.sh --prune  also remove bases and stand-ins of
#                                        other recipes
set -euo pipefail
FS_ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/podman.sh
. "$FS_ROOT/scripts/podman.sh"
cd "$FS_ROOT"

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The base's recipe: what debootstrap is asked for and what is set after it.
BASE_RECIPE="debootstrap --variant=minbase bookworm $MIRROR; policy-rc.d 101; slim's apt and dpkg settings; v2"
hash() { sha256sum | cut -c1-12; }
BASE_TAG=$(printf '%s' "$BASE_RECIPE" | hash)
STANDIN_TAG=$( (echo "$BASE_TAG"; cat deploy/test/stand-ins/*) | hash)

podman_install

if podman image exists "localhost/debian:bookworm-$BASE_TAG"; then
  echo "base image localhost/debian:bookworm-$BASE_TAG: cached"
else
  echo "making the base image (debootstrap bookworm, a few minutes)"
  root=$(mktemp -d /var/tmp/fs-debootstrap.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  # Services are not started by packages' scripts inside an image build.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$root/etc/apt/apt.conf.d/90no-recommends"
  # As debian:bookworm-slim is made: no apt caches kept, no documentation,
  # manuals or translations installed (copyrights kept), so an image made
  # from this base is about the size it is from slim.
  cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
  cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
DPKG
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/cache/apt/*.bin
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import -q \
    --change 'CMD ["/bin/bash"]' --change "LABEL flashsale.recipe=$BASE_TAG" \
    - "localhost/debian:bookworm-$BASE_TAG" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi
podman tag "localhost/debian:bookworm-$BASE_TAG" localhost/debian:bookworm

for name in redis mariadb prometheus; do
  image="localhost/flashsale-test/$name:$STANDIN_TAG"
  if podman image exists "$image"; then
    echo "$image: cached"
    continue
  fi
  echo "making $image"
  # The host's network for the build: apt reaches Debian's mirror as the
  # host does.
  podman build -q --network host --build-arg "BASE=localhost/debian:bookworm-$BASE_TAG" \
    --label "flashsale.recipe=$STANDIN_TAG" \
    -f "deploy/test/stand-ins/$name.Containerfile" -t "$image" deploy/test/stand-ins >/dev/null
done

if [ "${1:-}" = --prune ]; then
  podman images --format '{{.Repository}}:{{.Tag}}' \
    | grep -E '^localhost/flashsale-test/(redis|mariadb|prometheus):' \
    | grep -v ":$STANDIN_TAG\$" | xargs -r podman rmi >/dev/null || true
  podman images --format '{{.Repository}}:{{.Tag}}' | grep -E '^localhost/debian:bookworm-' \
    | grep -v ":bookworm-$BASE_TAG\$" | xargs -r podman rmi >/dev/null || true
fi
echo "FS_STANDIN_TAG=$STANDIN_TAG"
