#!/bin/bash
# Instructions per sold-out order, by valgrind's callgrind (repeatable on a
# busy machine), for `flashsale serve` or the bench's constant floor; per
# accepted order for `serve`; per persisted order for `flashsale worker`:
#
#   scripts/profile-order-path.sh serve [out]   # target/release/flashsale serve
#   scripts/profile-order-path.sh floor [out]   # target/release/flashsale-bench floor
#   scripts/profile-order-path.sh accept [out]  # serve, every order accepted (a user each)
#   scripts/profile-order-path.sh worker [out]  # flashsale worker persisting N orders
#
# Starts the server under valgrind with instrumentation off, opens a 1-unit
# sale and sells it (serve), sends 600 warm-up orders, then N (default
# 10,000) sold-out orders over 16 keep-alive connections with
# instrumentation on, and prints the instructions per order. Inspect the
# output with `callgrind_annotate --inclusive=yes <out>`. Needs valgrind,
# python3, curl, and a release build; local Redis and MySQL for `serve`.
# BIN: another `flashsale` binary for `serve` (to compare two builds side
# by side); START_IN_MS: the sale's start from now (default -1000: open, so
# the orders are sold out; 3000000: the pre-start path, `sale_not_started`).
# Traffic goes to 127.0.0.1 only, N orders.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?serve or floor}
out=${2:-callgrind.$what.out}
n=${N:-10000}
port=18080
log=$(mktemp)
stock=1
prefix=profile$$
export ADMIN_TOKEN=profile-order-path-0123456789 AUTH=none RATE_LIMITS=false \
    RUST_LOG=warn REDIS_KEY_PREFIX=$prefix DATABASE_URL=mysql://root@127.0.0.1:3306/$prefix
case $what in
serve | accept)
    [ "$what" = accept ] && stock=$((n + 1000))
    WORKERS=false LISTEN_ADDR=127.0.0.1:$port valgrind --tool=callgrind --instr-atstart=no \
        --callgrind-out-file="$out" "${BIN:-target/release/flashsale}" serve >"$log" 2>&1 &
    ;;
worker)
    # The orders come through a plain `serve` (no workers); the worker
    # process under valgrind persists them.
    stock=$((n + 1000))
    WORKERS=false LISTEN_ADDR=127.0.0.1:$port "${BIN:-target/release/flashsale}" serve >"$log.serve" 2>&1 &
    served=$!
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
        "${BIN:-target/release/flashsale}" worker >"$log" 2>&1 &
    ;;
floor)
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
        target/release/flashsale-bench floor --secs 120 >"$log" 2>&1 &
    ;;
*) echo "serve or floor" >&2; exit 2 ;;
esac
vg=$!
cleanup() {
    kill $vg ${served:-} 2>/dev/null || true
    wait ${served:-} 2>/dev/null || true
    rm -f "$log" "$log.serve"
    redis-cli --scan --pattern "$prefix:*" | xargs -r redis-cli del >/dev/null
    mariadb -uroot -e "DROP DATABASE IF EXISTS $prefix"
}
trap cleanup EXIT
product=profile-$(date +%s%N)
if [ "$what" = floor ]; then
    for _ in $(seq 1 120); do grep -q '^http://' "$log" && break; sleep 0.5; done
    port=$(grep '^http://' "$log" | head -1 | sed 's/.*://')
else
    for _ in $(seq 1 120); do curl -sf -o /dev/null "127.0.0.1:$port/readyz" && break; sleep 0.5; done
    [ "$what" = serve ] || [ "$what" = accept ] || sleep 2 # the worker's own start
    now=$(($(date +%s%N) / 1000000))
    curl -sf -o /dev/null -H "authorization: Bearer $ADMIN_TOKEN" -H 'content-type: application/json' \
        "127.0.0.1:$port/api/admin/products" \
        -d "{\"product_id\":\"$product\",\"title\":\"t\",\"price\":\"1.00\",\"available_qty\":$stock,\"limit_per_user\":1,\"start_time\":$((now + ${START_IN_MS:--1000})),\"end_time\":$((now + 3600000))}"
    curl -sf -o /dev/null -X POST -H "authorization: Bearer $ADMIN_TOKEN" "127.0.0.1:$port/api/admin/products/$product/open"
    sleep 1.2 # the memory's first clock sample
fi
first_user=1
blast() { # orders, connections (users from first_user on, one order each when stock > 1)
    python3 - "$port" "$1" "$2" "$product" "$first_user" "$stock" <<'PY'
import http.client, itertools, json, sys, threading
port, n, c, product = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
users, many = itertools.count(int(sys.argv[5])), int(sys.argv[6]) > 1
answers, lock = {}, threading.Lock()
def run(k):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(k):
        with lock: user = next(users) if many else 7
        body = json.dumps({"user_id": user, "product_id": product, "quantity": 1})
        conn.request("POST", "/api/orders", body, {"content-type": "application/json"})
        r = conn.getresponse(); r.read()
        with lock: answers[r.status] = answers.get(r.status, 0) + 1
threads = [threading.Thread(target=run, args=(n // c,)) for _ in range(c)]
[t.start() for t in threads]; [t.join() for t in threads]
print("answers by status:", answers, file=sys.stderr)
PY
}
blast 600 8
first_user=1000000
# What blast sends: n orders over 16 connections, n/16 each.
sent=$((n / 16 * 16))
if [ "$what" = worker ]; then
    persisted() { mariadb -uroot -N -e "SELECT COUNT(*) FROM tb_order" "$prefix"; }
    for _ in $(seq 1 600); do [ "$(persisted)" = 600 ] && break; sleep 0.2; done
    callgrind_control -i on $vg >/dev/null
    blast "$n" 16
    for _ in $(seq 1 3000); do [ "$(persisted)" = $((sent + 600)) ] && break; sleep 0.1; done
    callgrind_control -i off $vg >/dev/null
else
    callgrind_control -i on $vg >/dev/null
    blast "$n" 16
    callgrind_control -i off $vg >/dev/null
fi
kill -INT $vg; wait $vg || true
total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$what: $total instructions for $sent orders, $((total / sent)) per order ($out)"
