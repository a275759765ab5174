#!/usr/bin/env bash
# The README's first command on a fresh machine: a container from the
# debootstrap bookworm base of scripts/container-images.sh (nothing
# installed; curl and openssl added, as the machine of issue 68 had them
# beside gcc, git and rust), on podman's default
# network (its own: the host's Redis and MariaDB out of reach, Debian's
# mirror within), with
#
#   1. this checkout's scripts/stores.sh: Debian's Redis and MariaDB
#      installed and started in the container (as root, as a fresh Debian
#      install is);
#   2. the release binary built outside (FLASHSALE_BIN, or this tree's:
#      cargo build --release --locked, nothing to do after compose-test.sh),
#      `AUTH=none flashsale serve` with an ADMIN_TOKEN and every other setting
#      at its default (DATABASE_URL mysql://root@127.0.0.1:3306/flashsale:
#      the service's own driver signs in as stores.sh left root);
#   3. a sale created and opened through the admin API, an order placed
#      (202), and its row in tb_order, confirmed by the workers.
#
# The container is removed on exit, whatever happens; each step is bounded
# in time (25 s in all here with the images cached, most of it apt; about
# 11 minutes at most, when every bound is hit).
set -euo pipefail
FS_ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/podman.sh
. "$FS_ROOT/scripts/podman.sh"
cd "$FS_ROOT"

BIN=${FLASHSALE_BIN:-${CARGO_TARGET_DIR:-$FS_ROOT/target}/release/flashsale}
T0=$(date +%s)
step() { echo "== [$(($(date +%s) - T0))s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "images"
podman_install
scripts/container-images.sh >/dev/null   # cached after the first run; tags localhost/debian:bookworm
BASE=$(podman image inspect localhost/debian:bookworm --format '{{.Id}}')
if [ -z "${FLASHSALE_BIN:-}" ]; then
  step "cargo build --release --locked --bin flashsale"
  cargo build --release --locked --bin flashsale
fi
[ -x "$BIN" ] || fail "no binary at $BIN"

NAME=fs-fresh-machine-$$
STATE=$(mktemp -d /tmp/fs-fresh-machine.XXXXXX)
cleanup() {
  local rc=$?
  set +e
  if [ $rc -ne 0 ]; then
    if podman exec "$NAME" cat /tmp/serve.log >"$STATE/serve.log" 2>/dev/null; then
      tail -20 "$STATE/serve.log" >&2
      echo "the service's log: $STATE/serve.log" >&2
    fi
  fi
  podman rm -f -t 0 "$NAME" >/dev/null 2>&1
  [ $rc -eq 0 ] && rm -rf "$STATE"
  step "done (exit $rc)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# inside SECONDS COMMAND...: a command in the container, as root, bounded.
inside() { local secs=$1; shift; timeout -k 5 "$secs" podman exec "$NAME" "$@"; }

step "a fresh machine: $NAME (localhost/debian:bookworm, podman's default network)"
podman run -d --init --name "$NAME" --label flashsale.check=fresh-machine \
  -v "$FS_ROOT/scripts/stores.sh:/flashsale/scripts/stores.sh:ro" \
  -v "$BIN:/usr/local/bin/flashsale:ro" \
  "$BASE" sleep infinity >/dev/null
# Nothing answers on the stores' ports before stores.sh: the host's are not
# this machine's.
inside 10 bash -c '! (exec 3<>/dev/tcp/127.0.0.1/3306) 2>/dev/null && ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null' \
  || fail "something answers on 127.0.0.1:3306 or :6379 in a fresh container"
# The binary's libraries are the base's (both bookworm).
if inside 10 ldd /usr/local/bin/flashsale | grep 'not found'; then
  fail "the binary needs libraries the base lacks"
fi

step "curl and openssl (the README's commands use them; a machine with git and rustup has both)"
inside 180 bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl openssl >/dev/null' \
  || fail "apt-get install curl openssl (Debian's mirror from podman's default network)"

step "scripts/stores.sh (Debian's Redis and MariaDB, installed and started)"
inside 300 bash -c 'cd /flashsale && scripts/stores.sh' || fail "scripts/stores.sh"

step "AUTH=none flashsale serve (every other setting its default)"
# The README's command, the binary for cargo run's: the token kept for the
# admin calls below.
podman exec -d "$NAME" bash -c 'echo $$ >/tmp/serve.pid && cd /flashsale \
  && export ADMIN_TOKEN=$(openssl rand -hex 24) && echo "$ADMIN_TOKEN" >/tmp/admin-token \
  && AUTH=none exec flashsale serve >/tmp/serve.log 2>&1' >/dev/null
ready=
deadline=$((SECONDS + 60))
while [ $SECONDS -lt $deadline ]; do
  if inside 5 curl -sf -o /dev/null --max-time 2 localhost:8080/readyz; then ready=1; break; fi
  # shellcheck disable=SC2016 # the container's shell expands it
  inside 5 bash -c '[ ! -e /tmp/serve.pid ] || kill -0 "$(cat /tmp/serve.pid)"' 2>/dev/null \
    || fail "the service exited"
  sleep 1
done
[ -n "$ready" ] || fail "the service not ready within 60 s (/readyz)"
step "ready: $(inside 5 curl -s localhost:8080/readyz)"

# The sale and the order, as docs/operations.md ("Try it by hand") makes them.
SKU=fm-$(date +%s)
# shellcheck disable=SC2016 # the container's shell expands them
out=$(inside 30 bash -c '
set -e
admin() { curl -s --max-time 10 -w "\n%{http_code}" -H "authorization: Bearer $(cat /tmp/admin-token)" "$@"; }
now=$(($(date +%s) * 1000))
admin -X POST localhost:8080/api/admin/products -H "content-type: application/json" \
  -d "{\"product_id\":\"$1\",\"title\":\"Phone\",\"price\":\"4999.00\",\"available_qty\":3,
       \"start_time\":$now,\"end_time\":$((now + 3600000)),\"limit_per_user\":1}"; echo
admin -X POST "localhost:8080/api/admin/products/$1/open"; echo
curl -s --max-time 10 -w "\n%{http_code}" -X POST localhost:8080/api/orders -H "content-type: application/json" \
  -d "{\"user_id\":1,\"product_id\":\"$1\",\"quantity\":1}"; echo
' _ "$SKU")
echo "$out"
codes=$(awk 'NR % 2 == 0' <<<"$out" | tr '\n' ' ')
[ "$codes" = "201 200 202 " ] || fail "create, open, order: HTTP $codes (wanted 201 200 202)"
ORDER_ID=$(tail -2 <<<"$out" | head -1 | sed -n 's/.*"order_id":"\([^"]*\)".*/\1/p')
[ -n "$ORDER_ID" ] || fail "no order_id in the order's answer"
step "order $ORDER_ID accepted (202); waiting for its row in tb_order"

row=
deadline=$((SECONDS + 30))
while [ $SECONDS -lt $deadline ]; do
  row=$(inside 10 mariadb -uroot -N -e \
    "SELECT order_id, user_id, status FROM flashsale.tb_order WHERE product_id = '$SKU'" 2>/dev/null || true)
  [ -n "$row" ] && break
  sleep 1
done
[ -n "$row" ] || fail "no row for $SKU in tb_order within 30 s"
echo "tb_order: $row"
read -r db_id db_user db_status <<<"$row"
if [ "$db_id" != "$ORDER_ID" ] || [ "$db_user" != 1 ] || [ "$db_status" != confirmed ]; then
  fail "tb_order holds ($row), wanted ($ORDER_ID 1 confirmed)"
fi
step "PASS: stores.sh, serve on its defaults, a sale, an order in tb_order, on a fresh machine"
