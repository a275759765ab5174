#!/usr/bin/env bash
# What Redis spends on one call of the order script, in instructions
# (callgrind: repeatable on a shared machine), beside reference scripts that
# bound it (BENCHMARKS.md "Orders that share a call"):
#
#   nop    `return 1`: an EVALSHA's own cost (dispatch, the Lua call, the
#          reply, its share of the pipelined I/O)
#   bare   the eight commands an accepted order ran before the HINCRBY merge
#          (HMGET, TIME, GET, HGET, DECRBY, HINCRBY, XADD, HSET of the
#          record) and no logic
#   floor  what deducting and enqueueing needs with no copy of the order and
#          no logic: HMGET, TIME, GET, HINCRBY, DECRBY, XADD
#          (both XADD one field, the order's JSON, as the script does now;
#          the measurements before it XADDed six fields, one per value)
#   then `lua/place_order.lua` as in the working tree, with 1, 4, 8 and 16
#   orders a call (BATCHES: the orders that share a call, sale/line.rs), and
#   at each REV given (a script of one order a call, before the calls were
#   shared, is sent one order a call).
#
# Each runs on a private Redis (port 6395, under valgrind, started and
# stopped here) with one open sale of ample stock and limit: 200 calls to
# warm up, then N (default 5000) orders counted, 16 calls pipelined per
# connection, each order a new buyer and order id (so every order is
# accepted). Figures are instructions per ORDER.
#
#   scripts/order-script-cost.sh [REV]...        N=5000 by default
#   BATCHES="1 8" scripts/order-script-cost.sh    # orders a call, working tree
#   EXTRA="a.lua b.lua" scripts/order-script-cost.sh   # candidate scripts too
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-5000}
PORT=6395
WORK=$(mktemp -d)
trap 'redis-cli -p $PORT shutdown nosave >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

cat >"$WORK/nop.lua" <<'EOF'
return 1
EOF
cat >"$WORK/bare.lua" <<'EOF'
local sale = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms', 'limit', 'price', 'room_key', 'awake')
local t = redis.call('TIME')
local stock = redis.call('GET', KEYS[2])
local bought = redis.call('HGET', KEYS[3], ARGV[2])
redis.call('DECRBY', KEYS[2], 1)
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
local entry = redis.call('XADD', KEYS[5], '*', 'order', '{"order_id":"o-1","user_id":1,"quantity":1,"price":"4999","created_ms":1796003647270}')
redis.call('HSET', KEYS[6], ARGV[1], '{"user_id":1,"quantity":1,"price":"4999","created_ms":1796003647270,"entry_id":"1796003647271-0"}')
return {'ok', '4999', 1, 1}
EOF
cat >"$WORK/floor.lua" <<'EOF'
local sale = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms', 'limit', 'price', 'room_key', 'awake')
local t = redis.call('TIME')
local stock = redis.call('GET', KEYS[2])
local bought = redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
redis.call('DECRBY', KEYS[2], 1)
local entry = redis.call('XADD', KEYS[5], '*', 'order', '{"order_id":"o-1","user_id":1,"quantity":1,"price":"4999","created_ms":1796003647270}')
return {'ok', '4999', 1, 1}
EOF
cp lua/place_order.lua "$WORK/place_order@tree.lua"
for rev in "$@"; do
  git show "$rev:lua/place_order.lua" >"$WORK/place_order@$rev.lua"
done

# Instructions per order of one script, B orders a call (B=1 and the old
# arguments for a script of one order a call).
cost() {
  local script=$1 B=${2:-1} out="$WORK/cg.out"
  valgrind --tool=callgrind --callgrind-out-file="$out.%p" \
    redis-server --port $PORT --save "" --appendonly no >/dev/null 2>&1 &
  local vg=$!
  for _ in $(seq 100); do redis-cli -p $PORT ping >/dev/null 2>&1 && break; sleep 0.2; done
  local r="redis-cli -p $PORT"
  $r hset 'bx:{p}:sale' start_ms 0 end_ms 99999999999999 limit 1000000000 price 4999 awake 1 >/dev/null
  $r set 'bx:{p}:stock' 1000000000 >/dev/null
  local sha
  sha=$($r script load "$(cat "$script")")
  local args=()
  if grep -q 'ARGV\[1\]  order_id' "$script" || [[ $(basename "$script") != place_order* ]]; then
    args=(o-__rand_int__ __rand_int__ p 1 '' '' '') # one order a call
  else
    args=(p)
    for _ in $(seq "$B"); do args+=(o-__rand_int__ __rand_int__ 1 ''); done
  fi
  calls() {
    redis-benchmark -p $PORT -q -n "$1" -c 4 -P 16 -r 1000000 evalsha "$sha" 7 \
      'bx:{p}:sale' 'bx:{p}:stock' 'bx:{p}:bought' 'bx:{p}:idem' 'bx:{p}:orders' \
      'bx:{p}:accepted' 'bx:{p}:void' "${args[@]}" >/dev/null
  }
  calls 200
  callgrind_control -z $vg >/dev/null 2>&1
  calls $((N / B))
  callgrind_control -d $vg >/dev/null 2>&1
  sleep 1
  local total
  total=$(callgrind_annotate "$(ls -t "$out".* | head -1)" 2>/dev/null |
    awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
  $r shutdown nosave >/dev/null 2>&1 || true
  wait $vg 2>/dev/null || true
  rm -f "$out".*
  printf '%-28s %3d a call: %8d instructions per order\n' "$(basename "$script" .lua)" "$B" $((total / (N / B * B)))
}

for s in nop bare floor; do cost "$WORK/$s.lua"; done
for b in ${BATCHES:-1 4 8 16}; do cost "$WORK/place_order@tree.lua" "$b"; done
for rev in "$@"; do cost "$WORK/place_order@$rev.lua"; done
for f in ${EXTRA:-}; do cost "$f"; done
