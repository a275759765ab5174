#!/usr/bin/env bash
# Fuzzes the HTTP API against its own OpenAPI document with schemathesis:
# a live `flashsale serve` (default limits, its own database and key prefix)
# gets generated requests for every route, valid and invalid, single and
# chained through the document's links. It fails on any 5xx, and on any
# answer whose status, content type, headers or body the document does not
# describe, on any schema-invalid request that is not refused with a 4xx,
# and on any route that answers without its credential (`ignored_auth`:
# every buyer route without a token, or with a bad one, must answer 401).
# Buyers use a JWT signed with the server's JWT_SECRET; admin routes the
# ADMIN_TOKEN (one per security scheme of the document).
#
#   scripts/fuzz-api.sh            # FUZZ_MAX_EXAMPLES (100) per operation, at most FUZZ_MAX_SECS (600)
#
# schemathesis comes from PyPI into a virtualenv (SCHEMATHESIS_VENV), made on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SCHEMATHESIS_VENV:-/opt/venvs/schemathesis}
VERSION=4.32.5
MAX_EXAMPLES=${FUZZ_MAX_EXAMPLES:-100}
MAX_SECS=${FUZZ_MAX_SECS:-600}

if ! "$VENV/bin/st" --version 2>/dev/null | grep -q "$VERSION"; then
  echo "installing schemathesis $VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "schemathesis==$VERSION"
fi

cargo build --quiet --bin flashsale

RUN=$(python3 -c 'import secrets; print(secrets.token_hex(4))')
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DB=fs_fuzz_$RUN
PREFIX=fuzz$RUN
TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
JWT_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
# A buyer's token (user 1, the user of the document's links), HS256, an hour.
BUYER=$(JWT_SECRET=$JWT_SECRET python3 -c '
import base64, hashlib, hmac, json, os, time
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
body = b64(json.dumps({"sub": "1", "exp": int(time.time()) + 3600}).encode())
sig = hmac.new(os.environ["JWT_SECRET"].encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
print(f"{head}.{body}.{b64(sig)}")
')
LOG=$(mktemp /tmp/flashsale-fuzz.XXXXXX.log)
CONFIG=$(mktemp /tmp/flashsale-fuzz.XXXXXX.toml)
printf '[auth.openapi.admin]\nbearer = "%s"\n\n[auth.openapi.buyer]\nbearer = "%s"\n' "$TOKEN" "$BUYER" >"$CONFIG"

PAYMENT_WEBHOOK_SECRETS=whsec_ZnV6ei1wYXltZW50LXNlY3JldC0wMTIzNDU2Nzg5 ADMIN_TOKEN=$TOKEN JWT_SECRET=$JWT_SECRET LISTEN_ADDR=127.0.0.1:$PORT DATABASE_URL=mysql://root@127.0.0.1:3306/$DB \
  REDIS_KEY_PREFIX=$PREFIX "${CARGO_TARGET_DIR:-target}/debug/flashsale" serve >"$LOG" 2>&1 &
SERVER=$!
cleanup() {
  rm -f "$CONFIG"
  kill "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  mariadb -h 127.0.0.1 -uroot -e "DROP DATABASE IF EXISTS \`$DB\`" || true
  redis-cli -h 127.0.0.1 -p 6379 --scan --pattern "$PREFIX:*" | xargs -r -n 500 redis-cli -h 127.0.0.1 -p 6379 del >/dev/null || true
}
trap cleanup EXIT

for _ in $(seq 1 60); do
  curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.5
done

status=0
timeout "$MAX_SECS" "$VENV/bin/st" --config-file "$CONFIG" run "http://127.0.0.1:$PORT/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,negative_data_rejection,ignored_auth \
  --max-examples "$MAX_EXAMPLES" \
  --seed "${FUZZ_SEED:-$RANDOM}" \
  --request-timeout 10 ${FUZZ_EXTRA:-} || status=$?

if grep -q "panicked" "$LOG"; then
  echo "the server panicked during the fuzz run:" >&2
  grep -A3 "panicked" "$LOG" >&2
  status=1
fi
exit "$status"
