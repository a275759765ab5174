#!/usr/bin/env bash
# A replicated MariaDB for trying the books on by hand and for the
# benchmarks (the tests start their own: tests/it/replicas.rs), on loopback
# ports of its own, never the shared 3306:
#
#   scripts/books-rig.sh start semi-sync   # primary 127.0.0.1:3407, replica :3408 (AFTER_SYNC)
#   scripts/books-rig.sh start async       # the same, asynchronous
#   scripts/books-rig.sh start galera      # three nodes, 127.0.0.1:3417-3419
#   scripts/books-rig.sh pids              # the rig's mariadbd processes
#   scripts/books-rig.sh stop
#
# Data under /tmp/flashsale-books-rig (removed by stop). Needs mariadb-server,
# and for galera galera-4 and rsync.
set -euo pipefail
dir=/tmp/flashsale-books-rig
mode=${2:-}

server() { # id port extra...  (EMPTY=1: an empty data directory, filled by a state transfer)
    local id=$1 port=$2
    shift 2
    if [ "${EMPTY:-0}" = 1 ]; then mkdir "$dir/node$id"; else cp -a "$dir/template" "$dir/node$id"; fi
    # A Galera joiner's rsync daemon runs as nobody: it must write the data.
    chmod -R a+rwX "$dir/node$id"
    /usr/sbin/mariadbd --no-defaults --datadir="$dir/node$id" --port="$port" --bind-address=127.0.0.1 \
        --socket="$dir/node$id.sock" --pid-file="$dir/node$id.pid" --tmpdir="$dir" --user=root \
        --skip-name-resolve --max-connections=200 --innodb-buffer-pool-size=256M \
        --innodb-log-file-size=64M --innodb-flush-log-at-trx-commit=1 --server-id="$id" "$@" \
        >"$dir/node$id.log" 2>&1 &
    for _ in $(seq 1 300); do
        mariadb -h127.0.0.1 -P"$port" -uroot -e 'SELECT 1' >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    echo "node $id did not start: $dir/node$id.log" >&2
    return 1
}

sql() { mariadb -h127.0.0.1 -P"$1" -uroot -N -e "$2"; }

case ${1:-} in
start)
    [ -e "$dir" ] && { echo "a rig runs ($dir): stop it first" >&2; exit 1; }
    mkdir -p "$dir" && chmod 777 "$dir"
    mariadb-install-db --no-defaults --datadir="$dir/template" --user=root \
        --auth-root-authentication-method=normal --skip-test-db >/dev/null
    case $mode in
    semi-sync | async)
        repl=(--log-bin=binlog --log-slave-updates=1 --binlog-format=ROW --gtid-strict-mode=1
            --sync-binlog=1 --rpl-semi-sync-master-wait-point=AFTER_SYNC
            --rpl-semi-sync-master-timeout=10000 --rpl-semi-sync-slave-enabled=1)
        server 1 3407 "${repl[@]}"
        server 2 3408 "${repl[@]}"
        [ "$mode" = semi-sync ] && sql 3407 "SET GLOBAL rpl_semi_sync_master_enabled = 1"
        sql 3408 "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=3407, MASTER_USER='root', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1; START SLAVE"
        if [ "$mode" = semi-sync ]; then
            for _ in $(seq 1 100); do
                [ "$(sql 3407 "SHOW STATUS LIKE 'Rpl_semi_sync_master_status'" | cut -f2)" = ON ] && break
                sleep 0.2
            done
        fi
        echo "primary mysql://root@127.0.0.1:3407, replica :3408 ($mode)"
        ;;
    galera)
        cluster=gcomm://127.0.0.1:4561,127.0.0.1:4562,127.0.0.1:4563
        for n in 1 2 3; do
            extra=() empty=1
            [ $n = 1 ] && extra=(--wsrep-new-cluster) empty=0
            EMPTY=$empty server $n $((3416 + n)) --binlog-format=ROW --innodb-autoinc-lock-mode=2 --wsrep-on=ON \
                --wsrep-provider=/usr/lib/galera/libgalera_smm.so --wsrep-cluster-address=$cluster \
                --wsrep-cluster-name=flashsale-rig --wsrep-node-address=127.0.0.1:$((4560 + n)) \
                --wsrep-node-name=n$n --wsrep-provider-options="base_port=$((4560 + n));ist.recv_addr=127.0.0.1:$((4580 + n));gcache.size=64M" \
                --wsrep-sst-receive-address=127.0.0.1:$((4570 + n)) --wsrep-sst-method=rsync "${extra[@]}"
        done
        echo "galera mysql://root@127.0.0.1:3417, :3418, :3419"
        ;;
    *) echo "start semi-sync|async|galera" >&2; exit 2 ;;
    esac
    ;;
pids)
    for f in "$dir"/node*.pid; do [ -e "$f" ] && cat "$f"; done
    ;;
stop)
    for f in "$dir"/node*.pid; do [ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    sleep 1
    rm -rf "$dir"
    ;;
*) echo "start semi-sync|async|galera, pids, stop" >&2; exit 2 ;;
esac
