# Sourced by scripts/container-images.sh and scripts/compose-test.sh: podman
# as the container engine, on a machine with no Docker engine and no systemd.
#
#   podman_install        Debian's podman, runc, debootstrap, docker-compose,
#                         when missing
#   podman_api_start DIR  the Docker API on DIR/podman.sock (a private
#                         socket: nothing else on the machine is touched);
#                         exports DOCKER_HOST for docker-compose
#   podman_api_stop       stops what podman_api_start started
#
# podman reads deploy/test/containers.conf (runc, cgroupfs, no default
# rlimits: crun refuses this machine's hybrid cgroups and the default
# rlimits), not /etc/containers.

FS_ROOT=${FS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export CONTAINERS_CONF="$FS_ROOT/deploy/test/containers.conf"

podman_install() {
  local missing=()
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  # The pods' pause process (`podman kube play`): only recommended by
  # Debian's podman, so missing where recommends are not installed.
  command -v catatonit >/dev/null 2>&1 || missing+=(catatonit)
  if ((${#missing[@]})); then
    echo "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

PODMAN_API_PID=
podman_api_start() { # state dir
  local dir=$1
  mkdir -p "$dir"
  rm -f "$dir/podman.sock"
  podman system service --time=0 "unix://$dir/podman.sock" >"$dir/podman-api.log" 2>&1 &
  PODMAN_API_PID=$!
  export DOCKER_HOST="unix://$dir/podman.sock"
  for _ in $(seq 1 100); do
    if [ -S "$dir/podman.sock" ] && curl -sf --unix-socket "$dir/podman.sock" http://d/_ping >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  echo "podman's API did not answer on $dir/podman.sock (log: $dir/podman-api.log)" >&2
  return 1
}

podman_api_stop() {
  if [ -n "$PODMAN_API_PID" ]; then
    kill "$PODMAN_API_PID" 2>/dev/null || true
    wait "$PODMAN_API_PID" 2>/dev/null || true
    PODMAN_API_PID=
  fi
}
