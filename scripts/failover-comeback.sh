#!/usr/bin/env bash
# How long after a failover every process takes orders again (BENCHMARKS.md,
# "What happens in a failover?"): runs tests/it/comeback.rs's two kill tests
# N times each (a private 3-master cluster with replicas, 200 streams open,
# two `serve`s, a crowd ordering through the kill), and prints, by master
# killed, the time from the cluster's `cluster_state:ok` (the slot served by
# the promoted replica) to the first order accepted, and to the last of
# "every process took an order on every master's sales": p50 and max.
#
#   scripts/failover-comeback.sh        # 10 kills of each (about 7 min)
#   KILLS=3 scripts/failover-comeback.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${KILLS:-10}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo test --test it --no-run >/dev/null 2>&1
declare -A test=(
  [first_seed_node]=comeback::with_200_streams_the_first_seed_node_dies_and_every_process_takes_orders_within_5_s
  [another_master]=comeback::with_200_streams_another_master_dies_and_every_process_takes_orders_within_5_s
)
for victim in first_seed_node another_master; do
  for i in $(seq 1 "$KILLS"); do
    cargo test -q --test it -- --nocapture --exact "${test[$victim]}" >"$out/$victim-$i.log" 2>&1 || true
    grep -q "test result: ok" "$out/$victim-$i.log" || echo "run $i ($victim) failed" >&2
  done
done
python3 - "$out" "$KILLS" <<'PY'
import re, sys, statistics, pathlib
out, kills = pathlib.Path(sys.argv[1]), int(sys.argv[2])
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}
for victim, name in (("first_seed_node", "the first seed node"), ("another_master", "another master")):
    firsts, alls = [], []
    for i in range(1, kills + 1):
        text = (out / f"{victim}-{i}.log").read_text(errors="replace")
        ms = [float(v) * unit[u] for v, u in re.findall(r"took orders ([0-9.]+)(ns|µs|us|ms|s) after cluster_state:ok", text)]
        if ms:
            firsts.append(min(ms))
            alls.append(max(ms))
    if not alls:
        print(f"{name}: no run measured")
        continue
    p50 = lambda xs: statistics.median(xs)
    print(f"{name} killed, {len(alls)} kills: first order accepted p50 {p50(firsts):.0f} ms, max {max(firsts):.0f} ms; "
          f"every process on every master p50 {p50(alls):.0f} ms, max {max(alls):.0f} ms")
PY
