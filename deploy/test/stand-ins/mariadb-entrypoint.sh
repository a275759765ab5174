#!/bin/sh
# The stand-in's entrypoint: a new datadir is initialised once; root may
# connect from anywhere with an empty password (what the official image does
# with MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1), granted at every start by an
# idempotent init file.
set -eu
if [ "${1:-mariadbd}" = mariadbd ]; then
  [ $# -gt 0 ] && shift
  if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql \
      --auth-root-authentication-method=normal --skip-test-db >/dev/null
  fi
  cat > /run/mysqld/init.sql <<'SQL'
CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;
CREATE USER IF NOT EXISTS 'healthcheck'@'localhost' IDENTIFIED BY '';
SQL
  chown -R mysql:mysql /var/lib/mysql /run/mysqld
  exec mariadbd --user=mysql --datadir=/var/lib/mysql --bind-address=0.0.0.0 \
    --skip-name-resolve --init-file=/run/mysqld/init.sql "$@"
fi
exec "$@"
