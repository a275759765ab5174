#!/usr/bin/env python3
"""Redis's own time per call of two versions of lua/place_order.lua, side by
side: a private redis-server on a free loopback port (no persistence), one
open sale, batches of accepted orders sent with `redis-cli --pipe`, each
version's batches alternating; `INFO commandstats`' usec_per_call after
each batch (reset before it). Redis's time, not the API's: the API sends the
same EVALSHA either way.

    scripts/order-script-cost.py <before.lua[:flags]> <after.lua[:flags]> [rounds] [orders per batch]
                                 [--callgrind] [--fresh-users]

e.g. git show 3dffcf4:lua/place_order.lua > /tmp/before.lua
     scripts/order-script-cost.py /tmp/before.lua lua/place_order.lua 10

Each version gets the seven KEYS every order call has, and the eighth
(`room_used`) with "c" only, as the API sends them.
`:flags` sends every order with those flags (default "": a sale without a
room): "a" (admitted, the sale has a room), "c" (admitted, the room has an
active cap: the bucket of the admission's expiry follows, all orders in one). With --fresh-users every
order is a new buyer's first (as in a room, where each buyer orders once);
otherwise buyers repeat (1,000 of them).

With --callgrind, redis-server runs under valgrind's callgrind and each
batch is counted in instructions (zeroed before it, dumped after it:
repeatable, whoever shares the cores); use small batches (2000).
"""
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def resp(args):
    out = [f"*{len(args)}\r\n"]
    for a in args:
        b = a.encode()
        out.append(f"${len(b)}\r\n{a}\r\n")
    return "".join(out)


def instructions(dump):
    """The instructions a callgrind dump counted (its `totals:` or `summary:` line)."""
    for line in open(dump):
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise ValueError(f"no totals in {dump}")


def main():
    grind = "--callgrind" in sys.argv
    fresh = "--fresh-users" in sys.argv
    args = [a for a in sys.argv[1:] if a not in ("--callgrind", "--fresh-users")]
    versions = {}
    for name, spec in (("before", args[0]), ("after", args[1])):
        path, _, flags = spec.partition(":")
        versions[name] = (path, flags, 8 if flags == "c" else 7)
    rounds = int(args[2]) if len(args) > 2 else 10
    n = int(args[3]) if len(args) > 3 else (2000 if grind else 20000)
    port = free_port()
    work = tempfile.mkdtemp(prefix="order-script-cost.")
    redis = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work]
    if grind:
        redis = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/cg.out"] + redis
    server = subprocess.Popen(redis, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli_base = ["redis-cli", "-p", str(port)]

    def cli(*a):
        return subprocess.run(cli_base + list(a), capture_output=True, text=True).stdout.strip()

    try:
        for _ in range(600):
            if cli("PING") == "PONG":
                break
            time.sleep(0.1)
        shas = {name: cli("SCRIPT", "LOAD", open(path).read()) for name, (path, _, _) in versions.items()}
        now = int(time.time() * 1000)
        pid = "bench"
        keys = [f"b:{{{pid}}}:{name}"
                for name in ("sale", "stock", "bought", "idem", "orders", "accepted", "void", "room_used")]
        cli("HSET", keys[0], "start_ms", str(now - 60000), "end_ms", str(now + 36000000), "limit", "1000000000",
            "price", "9.99", "initial", "1000000000", "awake", "1")
        if any(flags for _, flags, _ in versions.values()):
            cli("HSET", keys[0], "room_key", "00" * 32, "room_admission_ms", "60000")
        cli("SET", keys[1], "1000000000")
        results = {"before": [], "after": []}
        seq = 0
        batch = os.path.join(work, "batch.resp")
        for r in range(rounds):
            for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
                _, flags, n_keys = versions[name]
                with open(batch, "w") as f:
                    for _ in range(n):
                        seq += 1
                        user = seq if fresh else 1 + seq % 1000
                        extra = [str((now + 60000) // 1000)] if flags == "c" else []
                        f.write(resp(["EVALSHA", shas[name], str(n_keys), *keys[:n_keys], pid,
                                      f"{pid}:{seq:036x}", str(user), "1", flags, *extra]))
                cli("CONFIG", "RESETSTAT")
                if grind:
                    subprocess.run(["callgrind_control", "-z", str(server.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                with open(batch) as f:
                    subprocess.run(cli_base + ["--pipe"], stdin=f, stdout=subprocess.DEVNULL, check=True)
                if grind:
                    for old in os.listdir(work):
                        if old.startswith("cg.out."):
                            os.remove(os.path.join(work, old))
                    subprocess.run(["callgrind_control", "-d", str(server.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                    dumps = [d for d in os.listdir(work) if d.startswith("cg.out.")]
                    results[name].append(instructions(os.path.join(work, dumps[0])) / n)
                stats = dict(kv.split("=") for kv in next(
                    l for l in cli("INFO", "commandstats").splitlines() if l.startswith("cmdstat_evalsha:")
                ).split(":", 1)[1].split(","))
                assert stats["failed_calls"] == "0", stats
                if not grind:
                    results[name].append(float(stats["usec_per_call"]))
                cli("XTRIM", keys[4], "MAXLEN", "0")
                cli("DEL", keys[5], keys[2], keys[7])
        unit = "instructions" if grind else "µs"
        for name, xs in results.items():
            xs_sorted = sorted(xs)
            print(f"{name:>6}: median {xs_sorted[len(xs) // 2]:.2f} {unit} per call, "
                  f"range {xs_sorted[0]:.2f}-{xs_sorted[-1]:.2f} ({len(xs)} batches of {n})")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
