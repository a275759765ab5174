#!/bin/sh
# The checks of the official image's healthcheck.sh that compose.yaml uses:
# --connect (the server answers a client) and --innodb_initialized (InnoDB
# is up), as its 'healthcheck' user over the local socket.
set -eu
for check in "$@"; do
  case "$check" in
    --connect) mariadb-admin -uhealthcheck --socket=/run/mysqld/mysqld.sock ping >/dev/null ;;
    --innodb_initialized)
      [ "$(mariadb -uhealthcheck --socket=/run/mysqld/mysqld.sock -N -e \
        "SELECT 1 FROM information_schema.ENGINES WHERE engine='InnoDB' AND support IN ('YES','DEFAULT','ENABLED')")" = 1 ] ;;
    *) echo "healthcheck.sh: $check is not one of this stand-in's checks" >&2; exit 2 ;;
  esac
done
