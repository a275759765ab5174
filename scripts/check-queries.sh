#!/usr/bin/env bash
# The SQL of the service's query macros (`sqlx::query!`, `query_as!`,
# `query_scalar!`), checked against the schema its migrations make.
#
#   scripts/check-queries.sh            # fails when .sqlx/ is not what the schema says
#   scripts/check-queries.sh --update   # writes .sqlx/ anew (commit it)
#
# The build reads `.sqlx/` (SQLX_OFFLINE=true, .cargo/config.toml): no
# database at build time. This script migrates a fresh database on the local
# MariaDB (127.0.0.1:3306, root) with `migrations/*.sql`, then checks the
# crate online: each macro has the server prepare its statement and
# describe its parameters and columns (a query that no longer fits the
# schema fails here, naming it), and writes what it learned; that must be
# `.sqlx/` exactly (a query added, changed or removed without --update
# fails too). The database is dropped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
update=false
[ "${1:-}" = --update ] && update=true
db=fs_queries_$$_$RANDOM
out=$(mktemp -d)
sql() { mariadb -h 127.0.0.1 -P 3306 -uroot "$@"; }
cleanup() {
  sql -e "DROP DATABASE IF EXISTS \`$db\`" || true
  rm -rf "$out"
}
trap cleanup EXIT
sql -e "CREATE DATABASE \`$db\`"
for f in migrations/*.sql; do
  sql "$db" <"$f"
done
# The macros run again only when their crate is rebuilt (a changed variable
# does not rebuild it): its root touched, the dependencies' builds reused.
touch src/lib.rs
SQLX_OFFLINE=false DATABASE_URL="mysql://root@127.0.0.1:3306/$db" SQLX_OFFLINE_DIR="$out" \
  cargo check --quiet --locked -p flashsale --lib
# And once more offline, so that the next build is not the online one's.
touch src/lib.rs
if $update; then
  rm -rf .sqlx
  mkdir .sqlx
  cp "$out"/query-*.json .sqlx/ 2>/dev/null || true
  echo "check-queries: .sqlx/ written ($(ls .sqlx | wc -l) queries)"
  exit 0
fi
mkdir -p .sqlx
if ! diff -r -q .sqlx "$out" >/dev/null; then
  echo "check-queries: .sqlx/ is not what the schema and the queries say:" >&2
  diff -r -q .sqlx "$out" | sed "s#$out#(checked)#" >&2 || true
  echo "run scripts/check-queries.sh --update and commit .sqlx/" >&2
  exit 1
fi
echo "check-queries: $(ls .sqlx | wc -l) queries checked against the migrated schema; .sqlx/ is current"
