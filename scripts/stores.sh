#!/usr/bin/env bash
# The stores the service and its tests talk to, made to answer: Redis on
# 127.0.0.1:${REDIS_PORT:-6379} and MariaDB on 127.0.0.1:${MYSQL_PORT:-3306}
# (user root, empty password). What already answers is left alone (but
# for root@localhost as an earlier version of this script left it, which
# the service's driver cannot sign in with: mend_machine_root); what does
# not is installed from Debian's packages when missing, and started.
#
#   scripts/stores.sh            # the README's two commands call it first; .ci/run too
#   REDIS_PORT=6390 MYSQL_PORT=3310 scripts/stores.sh   # elsewhere (a private data directory)
#   scripts/stores.sh stop       # stops what this script started on those ports
#
# Redis keeps nothing on disk (no RDB, no AOF: the tests' Redis; a
# deployment sets persistence, docs/operations.md). MariaDB on 3306 is the
# machine's own (Debian's /var/lib/mysql); on another port it gets a data
# directory of its own under ${STORES_DIR:-/var/lib/flashsale-stores}.
# Needs root (or sudo) the first time, for the packages.
set -euo pipefail

REDIS_PORT=${REDIS_PORT:-6379}
MYSQL_PORT=${MYSQL_PORT:-3306}
STORES_DIR=${STORES_DIR:-/var/lib/flashsale-stores}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian's packages, when their commands are missing.
install_missing() { # command package [command package ...]
  local wanted=()
  while (($#)); do
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || wanted+=("$2")
    shift 2
  done
  ((${#wanted[@]})) || return 0
  echo "installing ${wanted[*]}"
  as_root apt-get update -qq
  # No service is started by the packages' scripts (no init in a container;
  # this script starts what it needs itself).
  printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
  as_root chmod 755 /usr/sbin/policy-rc.d
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
  as_root rm -f /usr/sbin/policy-rc.d
}

redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }
mysql_up() { mariadb -h 127.0.0.1 -P "$MYSQL_PORT" -uroot -e 'SELECT 1' >/dev/null 2>&1; }

wait_for() { # name check
  for _ in $(seq 1 60); do
    if "$2"; then echo "$1 answers"; return 0; fi
    sleep 1
  done
  echo "$1 did not come up" >&2
  return 1
}

start_redis() {
  install_missing redis-server redis-server redis-cli redis-tools
  as_root mkdir -p "$STORES_DIR/redis-$REDIS_PORT"
  echo "starting redis on 127.0.0.1:$REDIS_PORT"
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" \
    --save "" --appendonly no --dir "$STORES_DIR/redis-$REDIS_PORT" \
    --pidfile "$STORES_DIR/redis-$REDIS_PORT/redis.pid" \
    --logfile "$STORES_DIR/redis-$REDIS_PORT/redis.log"
}

# MariaDB on 3306: the machine's own server, started as Debian starts it
# (its init script: mysqld_safe running mariadbd as the user mysql on
# Debian's data directory, which the package initialised; under systemd the
# script hands over to systemctl). The account root@localhost of a fresh
# Debian install signs in only through the socket (unix_socket): it is given
# an empty password for TCP too, as the service's default DATABASE_URL and
# the tests expect, mysql_native_password first: a client that answers an
# auth switch with a scramble of the empty password (sqlx does) is refused
# when the server tries unix_socket first. root@127.0.0.1 and root@::1 the
# same, for a server that resolves no names (skip_name_resolve).
ROOT_OVER_TCP="
ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
CREATE USER IF NOT EXISTS root@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO root@'127.0.0.1' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS root@'::1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO root@'::1' WITH GRANT OPTION;"
start_machine_mariadb() {
  install_missing mariadbd mariadb-server mariadb mariadb-client
  if ! as_root test -d /var/lib/mysql/mysql; then
    echo "initialising /var/lib/mysql"
    as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql --skip-test-db >/dev/null
  fi
  as_root install -d -o mysql -g root -m 755 /run/mysqld
  echo "starting mariadb (the machine's) on 127.0.0.1:3306"
  if [ -x /etc/init.d/mariadb ]; then
    as_root /etc/init.d/mariadb start || { echo "/etc/init.d/mariadb start failed" >&2; return 1; }
  else
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
  fi
  for _ in $(seq 1 60); do
    mysql_up && return 0
    if as_root mariadb -uroot -e 'SELECT 1' >/dev/null 2>&1; then
      echo "root: an empty password over TCP too"
      as_root mariadb -uroot -e "$ROOT_OVER_TCP"
      return 0
    fi
    sleep 1
  done
}

# What an earlier version of this script made of root@localhost (unix_socket
# tried first): the mariadb client gets in over TCP, the service's driver
# does not (1045, "using password: YES"). Put right, and nothing else.
mend_machine_root() {
  local account
  account=$(mariadb -h 127.0.0.1 -P "$MYSQL_PORT" -uroot -N -e 'SHOW CREATE USER CURRENT_USER()' 2>/dev/null || true)
  if [[ $account == *"IDENTIFIED VIA unix_socket OR mysql_native_password" ]]; then
    echo "root: mysql_native_password tried before unix_socket"
    mariadb -h 127.0.0.1 -P "$MYSQL_PORT" -uroot -e "$ROOT_OVER_TCP"
  fi
}

# MariaDB on another port: a data directory of its own, root with an
# empty password (as the tests' own servers are made).
start_private_mariadb() {
  install_missing mariadbd mariadb-server mariadb mariadb-client
  local dir=$STORES_DIR/mariadb-$MYSQL_PORT
  if [ ! -d "$dir/data/mysql" ]; then
    as_root mkdir -p "$dir"
    as_root mariadb-install-db --no-defaults --datadir="$dir/data" --user=root \
      --auth-root-authentication-method=normal --skip-test-db >/dev/null
  fi
  echo "starting mariadb on 127.0.0.1:$MYSQL_PORT ($dir)"
  as_root start-stop-daemon --start --background --make-pidfile --pidfile "$dir/mariadbd.pid" \
    --exec /usr/sbin/mariadbd -- --no-defaults --datadir="$dir/data" --port="$MYSQL_PORT" \
    --bind-address=127.0.0.1 --socket="$dir/mariadbd.sock" --user=root \
    --log-error="$dir/error.log" --max-connections=500
}

stop() {
  local pid
  pid="$STORES_DIR/redis-$REDIS_PORT/redis.pid"
  [ -f "$pid" ] && as_root kill "$(cat "$pid")" 2>/dev/null && echo "redis on $REDIS_PORT stopped"
  pid="$STORES_DIR/mariadb-$MYSQL_PORT/mariadbd.pid"
  [ -f "$pid" ] && as_root kill "$(cat "$pid")" 2>/dev/null && echo "mariadb on $MYSQL_PORT stopped"
  return 0
}

case "${1:-start}" in
stop)
  stop
  exit 0
  ;;
start) ;;
*)
  echo "usage: scripts/stores.sh [start|stop]" >&2
  exit 2
  ;;
esac

install_missing redis-cli redis-tools mariadb mariadb-client
redis_up || start_redis
wait_for "redis on 127.0.0.1:$REDIS_PORT" redis_up
if ! mysql_up; then
  if [ "$MYSQL_PORT" = 3306 ]; then start_machine_mariadb; else start_private_mariadb; fi
fi
wait_for "mariadb on 127.0.0.1:$MYSQL_PORT" mysql_up
if [ "$MYSQL_PORT" = 3306 ]; then mend_machine_root; fi
