#!/bin/bash
# What the dashboard costs per tick: `serve` (release build) with N open
# sales, measured for the same time with no viewer, one viewer, and many
# viewers polling the page's data every second as the page does. Reports
# per tick the service's CPU (from /proc), Redis's CPU and the commands
# Redis processed (INFO), each with the no-viewer baseline subtracted.
# The numbers behind BENCHMARKS.md "The dashboard". Needs the local
# Redis (6379: nothing else should use it meanwhile) and MariaDB.
#
#   scripts/dashboard-cost.sh [sales] [seconds per phase] [viewers]
set -euo pipefail
sales=${1:-10}
secs=${2:-30}
many=${3:-20}
port=18181
prefix=dashcost$$
token=dashboard-cost-$(openssl rand -hex 12)
base=http://127.0.0.1:$port
work=$(mktemp -d)
cargo build --release -q
ADMIN_TOKEN=$token AUTH=none LISTEN_ADDR=127.0.0.1:$port REDIS_KEY_PREFIX=$prefix \
  DATABASE_URL=mysql://root@127.0.0.1:3306/$prefix RUST_LOG=warn RATE_LIMITS=false \
  target/release/flashsale serve >"$work/serve.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  redis-cli --scan --pattern "$prefix:*" | xargs -r redis-cli del >/dev/null
  mariadb -uroot -e "DROP DATABASE IF EXISTS $prefix"
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -sf "$base/readyz" >/dev/null && break
  sleep 0.2
done
now=$(($(date +%s) * 1000))
for i in $(seq 1 "$sales"); do
  body="{\"product_id\":\"cost-$i\",\"title\":\"t\",\"price\":\"1.00\",\"available_qty\":1000,\"limit_per_user\":1,\"start_time\":$((now - 60000)),\"end_time\":$((now + 3600000))}"
  curl -sf -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d "$body" "$base/api/admin/products" >/dev/null
  curl -sf -X POST -H "Authorization: Bearer $token" "$base/api/admin/products/cost-$i/open" >/dev/null
  for u in 1 2 3; do
    curl -sf -H 'Content-Type: application/json' -d "{\"user_id\":$u,\"product_id\":\"cost-$i\",\"quantity\":1}" "$base/api/orders" >/dev/null
  done
done
cookie=$(curl -s -i -d "token=$token" "$base/admin/login" | sed -n 's/^set-cookie: \(flashsale_admin=[^;]*\).*/\1/Ip')
sleep 3 # the workers have persisted the orders

serve_cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; } # 10 ms ticks
redis_cpu() { redis-cli info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.0f", s * 1000}'; } # ms
redis_cmds() { redis-cli info stats | awk -F: '/^total_commands_processed:/ {print $2+0}'; }
viewer() { # polls once a second until the phase ends
  local until=$1
  while (($(date +%s) < until)); do
    curl -s -o /dev/null -b "$cookie" "$base/admin/dashboard/data"
    sleep 1
  done
}
phase() { # viewers -> "serve_ms redis_ms commands"
  local n=$1 c0 r0 k0 until
  c0=$(serve_cpu); r0=$(redis_cpu); k0=$(redis_cmds)
  until=$(($(date +%s) + secs))
  for _ in $(seq 1 "$n"); do viewer "$until" & done
  sleep "$secs"
  wait $(jobs -p | grep -v "^$pid$") 2>/dev/null || true
  echo "$((($(serve_cpu) - c0) * 10)) $(($(redis_cpu) - r0)) $(($(redis_cmds) - k0))"
}
read -r b_serve b_redis b_cmds < <(phase 0)
read -r o_serve o_redis o_cmds < <(phase 1)
read -r m_serve m_redis m_cmds < <(phase "$many")
printf '%s open sales, %s s per phase (a tick is 1 s)\n' "$sales" "$secs"
printf '%-22s %14s %14s %18s\n' phase "serve ms/tick" "redis ms/tick" "redis cmds/tick"
row() { awk -v n="$1" -v s="$2" -v r="$3" -v k="$4" -v t="$secs" \
  'BEGIN {printf "%-22s %14.2f %14.2f %18.1f\n", n, s/t, r/t, k/t}'; }
row "no viewer" "$b_serve" "$b_redis" "$b_cmds"
row "1 viewer (- none)" $((o_serve - b_serve)) $((o_redis - b_redis)) $((o_cmds - b_cmds))
row "$many viewers (- none)" $((m_serve - b_serve)) $((m_redis - b_redis)) $((m_cmds - b_cmds))
