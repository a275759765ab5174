#!/usr/bin/env bash
# compose.yaml run for real, as users run it, under podman (Docker's API on a
# private socket) and Debian's docker-compose 1.29, with the images of
# scripts/container-images.sh standing in for the public ones
# (deploy/test/compose.test.yaml):
#
#   1. the service's image: the Dockerfile's runtime around a release binary
#      (FLASHSALE_BIN, or this tree's: cargo build --release --locked)
#   2. Redis, the database, the API and two workers up; health waited for
#      (the image's HEALTHCHECK included)
#   3. a sale created and opened through the admin API on the published port
#   4. a burst of orders (a JWT each, signed with the compose file's
#      JWT_SECRET, and an Idempotency-Key); a worker's process killed (kill -9)
#      in the middle: its restart policy brings it back
#   5. --scale worker=3: three consumers in the sale's group (XINFO CONSUMERS)
#   6. a second burst; the API stopped (SIGTERM, compose's stop) in the middle
#   7. every order answered 202 is in the database once, none other than
#      those in flight at the stop; the keys replayed answer the same orders
#   8. the monitoring profile's Prometheus: the alert rules loaded, the API
#      (with the admin token) and the three workers scraped, a rule's query
#      answered with data
#  8b. the upgrade runbook (docs/operations.md "Upgrading", compose), as
#      written, under a burst of orders on a new sale: the fleet rolled back
#      to the previous release's image (scripts/previous-release.sh's binary)
#      one process at a time, then forward to this one; every 202 of the
#      burst in the database once, the books balanced, every container on
#      the image it should run
#   9. compose down -v leaves no container, volume or network of the project
#
# Everything the test starts is stopped on exit, whatever happens; requests
# go only to 127.0.0.1. ORDERS (default 2000) sets the bursts' size.
set -euo pipefail
FS_ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/podman.sh
. "$FS_ROOT/scripts/podman.sh"
cd "$FS_ROOT"

ORDERS=${ORDERS:-2000}
RATE=${ORDER_RATE:-150}   # orders a second: under the API's per-address limit (200)
# FLASHSALE_BIN: a release binary built elsewhere; without it, this tree's
# (cargo build --release, CARGO_TARGET_DIR honoured).
BIN=${FLASHSALE_BIN:-${CARGO_TARGET_DIR:-$FS_ROOT/target}/release/flashsale}
T0=$(date +%s)
step() { echo "== [$(($(date +%s) - T0))s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
client() { python3 scripts/compose_test_client.py "$@"; }

# 1. The images.
step "images"
podman_install
FS_STANDIN_TAG=$(scripts/container-images.sh | tail -1 | sed 's/^FS_STANDIN_TAG=//')
export FS_STANDIN_TAG
if [ -z "${FLASHSALE_BIN:-}" ]; then
  # The binary of this tree, as the Dockerfile's build stage makes it
  # (nothing to do when it is up to date; about 10 minutes on 2 cores when not).
  step "cargo build --release --locked --bin flashsale"
  cargo build --release --locked --bin flashsale
fi
[ -x "$BIN" ] || fail "no binary at $BIN"
# The binary as the Dockerfile's build stage leaves it: stripped.
install -D -m 755 "$BIN" target/prebuilt/flashsale
strip target/prebuilt/flashsale

STATE=$(mktemp -d /tmp/fs-compose-test.XXXXXX)
PROJECT=fsct$$
TICKER_PID=
BURST=
# compose builds through the API itself, not the docker CLI (none on a
# machine with only podman; where one is, it would take the legacy builder).
export COMPOSE_DOCKER_CLI_BUILD=0
dc() { docker-compose -p "$PROJECT" -f compose.yaml -f deploy/test/compose.test.yaml "$@"; }
cleanup() {
  local rc=$?
  set +e
  if [ -n "${DOCKER_HOST:-}" ]; then
    if [ $rc -ne 0 ]; then
      dc --profile monitoring logs --no-color >"$STATE/compose.log" 2>&1
      echo "the containers' logs: $STATE/compose.log" >&2
    fi
    dc --profile monitoring down -v --remove-orphans -t 10 >/dev/null 2>&1
  fi
  [ -n "$TICKER_PID" ] && kill "$TICKER_PID" 2>/dev/null && wait "$TICKER_PID" 2>/dev/null
  [ -n "$BURST" ] && kill "$BURST" 2>/dev/null && wait "$BURST" 2>/dev/null
  podman_api_stop
  # Whatever compose could not remove (the API gone first, say).
  podman ps -aq --filter "label=com.docker.compose.project=$PROJECT" | xargs -r podman rm -f >/dev/null 2>&1
  podman volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | xargs -r podman volume rm -f >/dev/null 2>&1
  podman network ls -q --filter "label=com.docker.compose.project=$PROJECT" | xargs -r podman network rm -f >/dev/null 2>&1
  [ $rc -eq 0 ] && rm -rf "$STATE"
  step "done (exit $rc)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free ports on 127.0.0.1 for what compose publishes (the machine's own
# Redis, MariaDB and any 8080 stay as they are).
read -r FLASHSALE_PORT REDIS_PORT DB_PORT PROMETHEUS_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
export FLASHSALE_PORT REDIS_PORT DB_PORT PROMETHEUS_PORT
ADMIN_TOKEN=$(openssl rand -hex 24)
JWT_SECRET=$(openssl rand -hex 32)
export ADMIN_TOKEN JWT_SECRET

podman_api_start "$STATE"
# podman runs health checks from systemd timers; without systemd nothing
# runs them, and a container stays "starting" for ever. This loop is that
# timer: every 2 s, each running container of the project is checked.
(
  while :; do
    for c in $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null); do
      podman healthcheck run "$c" >/dev/null 2>&1 || true
    done
    sleep 2
  done
) &
TICKER_PID=$!

step "building the service's image (Dockerfile, target runtime-prebuilt)"
IMAGE=localhost/flashsale-test/flashsale:compose-test
OLD_IMAGE=$(podman image inspect "$IMAGE" --format '{{.Id}}' 2>/dev/null || true)
dc build -q flashsale
# The image of an earlier binary is not kept (its layers under it are, as
# the build's cache).
NEW_IMAGE=$(podman image inspect "$IMAGE" --format '{{.Id}}')
if [ -n "$OLD_IMAGE" ] && [ "$OLD_IMAGE" != "$NEW_IMAGE" ]; then
  podman rmi "$OLD_IMAGE" >/dev/null 2>&1 || true
fi
podman image inspect "$IMAGE" --format \
  'image: {{.Size}} bytes, user {{.Config.User}}, healthcheck {{json .Config.Healthcheck.Test}}'
[ "$(podman image inspect "$IMAGE" --format '{{.Config.User}}')" = flashsale ] || fail "the image runs as root"

# 2. Up: Redis, the database, the API, two workers.
step "up: redis, db, flashsale, worker x2 (API on 127.0.0.1:$FLASHSALE_PORT)"
dc up -d --scale worker=2 flashsale worker
ready() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$FLASHSALE_PORT/readyz"; }
wait_until() { # seconds, what, command...
  local secs=$1 what=$2; shift 2
  for _ in $(seq 1 "$secs"); do "$@" && return 0; sleep 1; done
  fail "$what: not within ${secs}s"
}
wait_until 120 "the API ready" ready
health() { podman inspect "${PROJECT}_$1" --format '{{.State.Health.Status}}'; }
healthy_all() {
  local c
  for c in redis_1 db_1 flashsale_1 worker_1 worker_2; do
    [ "$(health "$c")" = healthy ] || return 1
  done
}
wait_until 60 "every container healthy" healthy_all
step "healthy: redis, db, flashsale, worker_1, worker_2"

# 3. A sale, through the admin API; and an upcoming one, which only a
# scrape with the admin token sees.
SKU=ct-$(date +%s)
NOW=$(($(date +%s) * 1000))
client admin "$FLASHSALE_PORT" POST /api/admin/products \
  "{\"product_id\":\"$SKU\",\"title\":\"Compose test\",\"price\":\"10.00\",\"available_qty\":$((ORDERS * 3 / 4)),\"start_time\":$((NOW - 1000)),\"end_time\":$((NOW + 3600000)),\"limit_per_user\":1}" >/dev/null
client admin "$FLASHSALE_PORT" POST "/api/admin/products/$SKU/open" >/dev/null
client admin "$FLASHSALE_PORT" POST /api/admin/products \
  "{\"product_id\":\"$SKU-later\",\"title\":\"Upcoming\",\"price\":\"10.00\",\"available_qty\":10,\"start_time\":$((NOW + 3600000)),\"end_time\":$((NOW + 7200000))}" >/dev/null
client admin "$FLASHSALE_PORT" POST "/api/admin/products/$SKU-later/open" >/dev/null
step "sale $SKU open ($((ORDERS * 3 / 4)) units), $SKU-later upcoming"

# 4. The first burst; a worker killed in its middle.
ORDERS_OUT=$STATE/orders.jsonl
HALF=$((ORDERS / 2))
step "burst 1: users 1-$HALF at ${RATE}/s; kill -9 of worker_1's process after 3 s"
client burst "$FLASHSALE_PORT" "$SKU" 1 "$HALF" "$RATE" "$ORDERS_OUT" &
BURST=$!
sleep 3
W1=${PROJECT}_worker_1
PID_BEFORE=$(podman inspect "$W1" --format '{{.State.Pid}}')
RESTARTS_BEFORE=$(podman inspect "$W1" --format '{{.RestartCount}}')
kill -9 "$PID_BEFORE"
wait $BURST
BURST=
restarted() {
  [ "$(podman inspect "$W1" --format '{{.State.Running}} {{.RestartCount}}')" = "true $((RESTARTS_BEFORE + 1))" ]
}
wait_until 30 "worker_1 restarted by its policy" restarted
step "worker_1 came back: pid $PID_BEFORE -> $(podman inspect "$W1" --format '{{.State.Pid}}'), restarts $RESTARTS_BEFORE -> $((RESTARTS_BEFORE + 1)) (policy $(podman inspect "$W1" --format '{{.HostConfig.RestartPolicy.Name}}'))"

# 5. Three workers, three consumers.
step "--scale worker=3; the monitoring profile's Prometheus up"
dc up -d --no-recreate --scale worker=3 worker
dc --profile monitoring up -d --no-recreate prometheus
consumers() {
  podman exec "${PROJECT}_redis_1" redis-cli XINFO CONSUMERS "fs:{$SKU}:orders" persist \
    | awk 'prev == "name" { print } { prev = $0 }' | sort
}
three_consumers() {
  local hosts c
  hosts=$(for i in 1 2 3; do podman inspect "${PROJECT}_worker_$i" --format '{{.Config.Hostname}}'; done)
  [ "$(consumers | wc -l)" -eq 3 ] || return 1
  for c in $(consumers); do grep -qx "${c%-*}" <<<"$hosts" || return 1; done
}
wait_until 60 "three consumers, one per worker container" three_consumers
step "consumers of fs:{$SKU}:orders: $(consumers | tr '\n' ' ')"

# 6. The second burst; the API stopped (SIGTERM) in its middle.
step "burst 2: users $((HALF + 1))-$ORDERS at ${RATE}/s; compose stop of the API after 3 s"
client burst "$FLASHSALE_PORT" "$SKU" $((HALF + 1)) "$ORDERS" "$RATE" "$ORDERS_OUT" &
BURST=$!
sleep 3
STOP0=$(date +%s.%N)
dc stop flashsale   # compose's stop timeout (10 s), then SIGKILL
STOP1=$(date +%s.%N)
wait $BURST
BURST=
EXIT=$(podman inspect "${PROJECT}_flashsale_1" --format '{{.State.ExitCode}}')
step "the API stopped in $(python3 -c "print(f'{$STOP1 - $STOP0:.1f}')")s, exit code $EXIT"
[ "$EXIT" = 0 ] || fail "the API did not exit cleanly on SIGTERM (exit $EXIT)"
dc start flashsale
wait_until 60 "the API ready again" ready

# 7. Every 202 persisted once.
accepted_ids() { python3 -c '
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if r["status"] == 202: print(r["order_id"])' "$ORDERS_OUT" | sort; }
unanswered_keys() { python3 -c '
import json, sys
print(sum(1 for r in map(json.loads, open(sys.argv[1])) if r["status"] == 0))' "$ORDERS_OUT"; }
db_ids() {
  podman exec "${PROJECT}_db_1" mariadb -uroot -N -e \
    "SELECT order_id FROM flashsale.tb_order WHERE product_id = '$SKU'" | sort
}
all_persisted() { [ -z "$(comm -23 <(accepted_ids) <(db_ids))" ]; }
# The orders of $ORDERS_OUT (sale $SKU) against the database: every 202
# there once, no row but those and the unanswered ones, more than half of
# the $1 sent accepted. $2 names them. Sets ACCEPTED and ROWS.
books_hold() { # sent, what
  ACCEPTED=$(accepted_ids | wc -l)
  wait_until 60 "every accepted order of $2 in the database" all_persisted
  ROWS=$(db_ids | wc -l)
  local distinct extra unanswered
  distinct=$(db_ids | uniq | wc -l)
  extra=$(comm -13 <(accepted_ids) <(db_ids) | wc -l)
  unanswered=$(unanswered_keys)
  step "$2: accepted $ACCEPTED, rows $ROWS ($distinct distinct), rows not answered 202: $extra (orders with no answer: $unanswered)"
  [ "$ROWS" = "$distinct" ] || fail "an order of $2 persisted twice"
  [ "$extra" -le "$unanswered" ] || fail "rows for orders of $2 never sent"
  [ "$ACCEPTED" -gt $(($1 / 2)) ] || fail "fewer than half the orders of $2 accepted"
}
books_hold "$ORDERS" "bursts 1 and 2"
PER_USER=$(podman exec "${PROJECT}_db_1" mariadb -uroot -N -e \
  "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) n FROM flashsale.tb_order WHERE product_id = '$SKU' GROUP BY user_id) t")
[ "$PER_USER" -le 1 ] || fail "a buyer holds $PER_USER orders (limit 1)"
client replay "$FLASHSALE_PORT" "$SKU" "$ORDERS_OUT" 50
[ "$(db_ids | wc -l)" = "$ROWS" ] || fail "a replayed key made a new row"
audit_ok() { client admin "$FLASHSALE_PORT" GET "/api/admin/products/$SKU/audit" | grep -q '"ok":true'; }
wait_until 30 "the sale's audit balanced" audit_ok
step "the books balance (admin audit ok)"

# 8. Prometheus: rules, targets, a rule's query.
prom() { curl -sf --max-time 5 -G "http://127.0.0.1:$PROMETHEUS_PORT$1" "${@:2}"; }
RULES=$(grep -c -- '- alert:' deploy/prometheus/alerts.yml)
rules_loaded() {
  [ "$(prom /api/v1/rules | python3 -c 'import json,sys; print(sum(len(g["rules"]) for g in json.load(sys.stdin)["data"]["groups"]))')" = "$RULES" ]
}
wait_until 60 "Prometheus' $RULES alert rules loaded" rules_loaded
targets_up() { # job count
  [ "$(prom /api/v1/targets | python3 -c '
import json, sys
t = json.load(sys.stdin)["data"]["activeTargets"]
print(sum(1 for x in t if x["labels"]["job"] == sys.argv[1] and x["health"] == "up"))' "$1")" = "$2" ]
}
wait_until 90 "the API scraped" targets_up flashsale-api 1
wait_until 90 "the three workers scraped" targets_up flashsale-worker 3
has_data() { # query
  [ "$(prom /api/v1/query --data-urlencode "query=$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))')" -gt 0 ]
}
BOOKS_EXPR=$(grep -A1 'alert: FlashsaleBooksUnbalanced' deploy/prometheus/alerts.yml | sed -n 's/.*expr: //p' | sed 's/ == 0$//')
wait_until 30 "the books rule's query ($BOOKS_EXPR) with data" has_data "$BOOKS_EXPR"
wait_until 30 "the upcoming sale's stock from the API (the token's view)" \
  has_data "flashsale_sale_stock{job=\"flashsale-api\",product_id=\"$SKU-later\"}"
step "Prometheus: $RULES rules, API and 3 workers up, '$BOOKS_EXPR' answered, the upcoming sale seen through the token"

# 8b. The upgrade runbook, as docs/operations.md writes it for compose: the
# new release's image built (`compose build`: flashsale's tag moves), then
# each worker replaced by one of the new image (a replica added, then the
# old one stopped with SIGTERM and removed), then the API recreated on it
# (`up -d --no-deps flashsale`: SIGTERM, drained, the new one started).
# Here back to the previous release and forward again, under a burst.
running_workers() {
  podman ps -q --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=worker"
}
roll_to() { # image id
  local want=$1 c n
  for c in $(running_workers); do
    [ "$(podman inspect "$c" --format '{{.Image}}')" = "$want" ] && continue
    n=$(running_workers | wc -l)
    dc up -d --no-deps --no-recreate --scale worker=$((n + 1)) worker 2>/dev/null
    podman stop -t 30 "$c" >/dev/null && podman rm "$c" >/dev/null   # docker stop / docker rm
  done
  dc up -d --no-deps flashsale 2>/dev/null
  wait_until 60 "the API ready on the new image" ready
  for c in $(running_workers) $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=flashsale"); do
    [ "$(podman inspect "$c" --format '{{.Image}}')" = "$want" ] \
      || fail "$(podman inspect "$c" --format '{{.Name}}') runs $(podman inspect "$c" --format '{{.Image}}'), not $want"
  done
  [ "$(running_workers | wc -l)" = 3 ] || fail "$(running_workers | wc -l) workers after the roll, not 3"
}
step "the upgrade runbook: the previous release's image"
PREV_BIN=$(scripts/previous-release.sh)
install -D -m 755 "$PREV_BIN" target/prebuilt/flashsale-previous
strip target/prebuilt/flashsale-previous
N_IMAGE=$(podman image inspect "$IMAGE" --format '{{.Id}}')
FS_PREBUILT=target/prebuilt/flashsale-previous dc build -q flashsale
P_IMAGE=$(podman image inspect "$IMAGE" --format '{{.Id}}')
[ "$P_IMAGE" != "$N_IMAGE" ] || fail "the previous release's image is this one's"
UP_SKU=$SKU-up
UP_ORDERS=${UP_ORDERS:-3000}
UP_RATE=${UP_RATE:-60}
UP_OUT=$STATE/upgrade-orders.jsonl
client admin "$FLASHSALE_PORT" POST /api/admin/products \
  "{\"product_id\":\"$UP_SKU\",\"title\":\"Upgrade\",\"price\":\"10.00\",\"available_qty\":$((UP_ORDERS * 3 / 4)),\"start_time\":$((NOW - 1000)),\"end_time\":$((NOW + 3600000)),\"limit_per_user\":1}" >/dev/null
client admin "$FLASHSALE_PORT" POST "/api/admin/products/$UP_SKU/open" >/dev/null
step "burst 3 on $UP_SKU: $UP_ORDERS users at ${UP_RATE}/s; the fleet rolled back to the previous release, then forward"
client burst "$FLASHSALE_PORT" "$UP_SKU" 1 "$UP_ORDERS" "$UP_RATE" "$UP_OUT" &
BURST=$!
sleep 3
R0=$(date +%s)
roll_to "$P_IMAGE"
step "rolled back in $(($(date +%s) - R0))s: every container on the previous release's image"
dc build -q flashsale
[ "$(podman image inspect "$IMAGE" --format '{{.Id}}')" = "$N_IMAGE" ] || fail "this release's image rebuilt differently"
R0=$(date +%s)
roll_to "$N_IMAGE"
step "forward in $(($(date +%s) - R0))s: every container on this release's image"
wait $BURST
BURST=
ORDERS_OUT=$UP_OUT SKU=$UP_SKU
books_hold "$UP_ORDERS" "burst 3, across the upgrade (no answer: the API's swaps)"
wait_until 30 "the sale's audit balanced after the upgrade" audit_ok
step "the books balance after the upgrade (admin audit ok)"

# 9. Down, and nothing left.
step "compose down -v"
dc --profile monitoring down -v -t 10
LEFT=$( {
  podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format 'container {{.Names}}'
  podman volume ls --filter "label=com.docker.compose.project=$PROJECT" --format 'volume {{.Name}}'
  podman network ls --filter "label=com.docker.compose.project=$PROJECT" --format 'network {{.Name}}'
  podman ps -a --format 'container {{.Names}}'
  podman volume ls --format 'volume {{.Name}}'
  podman network ls --format 'network {{.Name}}'
} | grep -E "^[a-z]+ ${PROJECT}_" | sort -u || true)
[ -z "$LEFT" ] || fail "left behind: $LEFT"
step "nothing left of $PROJECT; PASS"
