#!/usr/bin/env bash
# What a hot sale costs each Redis master in instructions (valgrind's
# callgrind counts them: the same for the same work whoever else shares the
# cores), with its stock in one slot or in stock shards, side by side:
#
#   scripts/hot-sale-instructions.sh [hot-sale flags...]
#   # e.g. --shards 1,3 --orders 12000 --concurrency 256
#
# Starts a private cluster on loopback (ports BASE..BASE+5, BASE defaults to
# 7900): 3 masters under callgrind, 3 replicas as usual, a long node timeout
# (a master under valgrind is some 50 times slower: no failover for that);
# runs `flashsale-bench hot-sale --callgrind` against it (each master's
# instructions read before and after each sale with `callgrind_control -e`);
# stops the cluster. Needs valgrind, redis-server and a release build of the
# bench (`cargo build --release -p flashsale-bench`).
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-7900}
DIR=$(mktemp -d /tmp/flashsale-hot-instructions.XXXX)
MASTERS=$(seq "$BASE" $((BASE + 2)))
REPLICAS=$(seq $((BASE + 3)) $((BASE + 5)))
pids=()

stop() {
  for p in $MASTERS $REPLICAS; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap stop EXIT

node() { # port, then the command that runs redis-server
  local port=$1
  shift
  mkdir -p "$DIR/$port"
  "$@" --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$DIR/$port/nodes.conf" --cluster-node-timeout 60000 \
    --repl-diskless-sync-delay 0 --save "" --appendonly no --dir "$DIR/$port" \
    --daemonize no --logfile "$DIR/$port/redis.log" &
  pids+=($!)
}

for p in $MASTERS; do
  node "$p" valgrind --tool=callgrind --callgrind-out-file="$DIR/callgrind.%p.out" \
    --log-file="$DIR/valgrind.$p.log" redis-server
done
for p in $REPLICAS; do node "$p" redis-server; done
for p in $MASTERS $REPLICAS; do
  for _ in $(seq 300); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
# The first three nodes become the masters: each of them is under callgrind.
# shellcheck disable=SC2046
redis-cli --cluster create $(for p in $MASTERS $REPLICAS; do echo "127.0.0.1:$p"; done) \
  --cluster-replicas 1 --cluster-yes >"$DIR/create.log" 2>&1
for _ in $(seq 300); do
  synced=0
  for p in $REPLICAS; do
    redis-cli -p "$p" info replication | grep -q 'master_link_status:up' && synced=$((synced + 1))
  done
  masters=$(redis-cli -p "$BASE" cluster nodes | grep -c master || true)
  redis-cli -p "$BASE" cluster info | grep -q 'cluster_state:ok' && [ "$synced" -eq 3 ] &&
    [ "$masters" -eq 3 ] && break
  sleep 0.2
done
for p in $MASTERS; do
  redis-cli -p "$p" info replication | grep -q 'role:master' || {
    echo "node $p is not a master; see $DIR/create.log" >&2
    exit 1
  }
done

RUST_LOG=warn target/release/flashsale-bench hot-sale --callgrind --moves 0 \
  --redis-cluster-nodes "127.0.0.1:$BASE,127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2))" "$@"
