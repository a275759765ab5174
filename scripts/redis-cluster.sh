#!/usr/bin/env bash
# A Redis Cluster on loopback for the tests: 3 masters and 3 replicas on ports
# BASE..BASE+5 (BASE defaults to 7000), data in a temporary folder.
#   scripts/redis-cluster.sh start   # idempotent: does nothing if it is up
#   scripts/redis-cluster.sh stop
#   scripts/redis-cluster.sh nodes   # prints the masters' host:port list
#   scripts/redis-cluster.sh restart-node PORT
set -euo pipefail
BASE=${FLASHSALE_CLUSTER_BASE_PORT:-7000}
DIR=${FLASHSALE_CLUSTER_DIR:-/tmp/flashsale-cluster-$BASE}
PORTS=$(seq "$BASE" $((BASE + 5)))

up() { # state ok, 3 masters, and 3 replicas in sync with them (WAIT and failover need that)
  redis-cli -p "$BASE" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
  local nodes synced=0
  nodes=$(redis-cli -p "$BASE" cluster nodes 2>/dev/null)
  [ "$(grep -c master <<<"$nodes")" -eq 3 ] || return 1
  for p in $PORTS; do
    redis-cli -p "$p" info replication 2>/dev/null | grep -q 'master_link_status:up' && synced=$((synced + 1))
  done
  [ "$synced" -eq 3 ]
}

start() {
  exec 9>"/tmp/flashsale-cluster-$BASE.lock"
  flock 9 # one starter at a time (tests may start it concurrently)
  up && return 0
  stop_servers
  rm -rf "$DIR" && mkdir -p "$DIR"
  for p in $PORTS; do
    mkdir -p "$DIR/$p"
    server "$p"
  done
  for p in $PORTS; do
    for _ in $(seq 50); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  # shellcheck disable=SC2046
  redis-cli --cluster create $(for p in $PORTS; do echo "127.0.0.1:$p"; done) \
    --cluster-replicas 1 --cluster-yes >"$DIR/create.log" 2>&1
  for _ in $(seq 100); do up && return 0; sleep 0.2; done
  echo "redis cluster did not come up; see $DIR" >&2
  return 1
}

# cluster-require-full-coverage no: while one master fails over, the others
# keep serving their slots (with `yes` the whole cluster answers CLUSTERDOWN
# for that time, and every sale gets 503, not just the failed master's).
server() { # one node, from its folder (a restarted node keeps its cluster identity)
  redis-server --port "$1" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$DIR/$1/nodes.conf" --cluster-node-timeout 2000 \
    --cluster-require-full-coverage no \
    --repl-diskless-sync-delay 0 \
    --save "" --appendonly no --dir "$DIR/$1" --daemonize yes \
    --logfile "$DIR/$1/redis.log" 9>&- # the servers must not inherit the lock
}

stop_servers() {
  for p in $PORTS; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
}

case "${1:-}" in
  start) start ;;
  stop) stop_servers; rm -rf "$DIR" ;;
  restart-node) server "$2" ;; # after a test killed it: it rejoins as a replica
  nodes) echo "127.0.0.1:$BASE,127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2))" ;;
  *) echo "usage: $0 start|stop|nodes|restart-node PORT" >&2; exit 2 ;;
esac
