#!/usr/bin/env python3
"""What the report's admissions that ran out cost Redis (BENCHMARKS.md
"What does the report cost?"): a room's `joined` hash of `n` buyers
(default 100,000) in a key of its own on the local Redis, read as the
report reads it (`HSCAN`, COUNT 1000, to the end), three times; prints
the calls, the wall time and Redis's own time per call (the `HSCAN` calls'
`usec` in INFO commandstats, before and after); then deletes the key.

    scripts/report-places-cost.py [n]
"""
import os, socket, sys, time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
key = f"placescost{os.getpid()}{{x}}:joined"
s = socket.create_connection(("127.0.0.1", 6379))
f = s.makefile("rb")


def read():
    line = f.readline()
    kind, rest = line[:1], line[1:].strip()
    if kind in (b"*", b"$") and int(rest) < 0:
        return None
    if kind == b"*":
        return [read() for _ in range(int(rest))]
    if kind == b"$":
        data = f.read(int(rest) + 2)[:-2]
        return data
    if kind == b":":
        return int(rest)
    if kind == b"-":
        raise RuntimeError(rest.decode())
    return rest


def cmd(*args):
    parts = [str(a).encode() for a in args]
    s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
    return read()


def hscan_stats():
    text = cmd("INFO", "commandstats").decode()
    for line in text.splitlines():
        if line.startswith("cmdstat_hscan:"):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            return int(fields["calls"]), int(fields["usec"])
    return 0, 0


cmd("EVAL", "for i = 1, tonumber(ARGV[1]) do redis.call('HSET', KEYS[1], tostring(i), 'l' .. i) end", 1, key, n)
try:
    for _ in range(3):
        calls0, usec0 = hscan_stats()
        t0, cursor, calls, fields = time.perf_counter(), b"0", 0, 0
        while True:
            cursor, page = cmd("HSCAN", key, cursor.decode(), "COUNT", 1000)
            calls += 1
            fields += len(page) // 2
            if cursor == b"0":
                break
        wall = (time.perf_counter() - t0) * 1000
        calls1, usec1 = hscan_stats()
        redis_ms = (usec1 - usec0) / 1000
        print(f"{fields} buyers: {calls} HSCAN calls, {wall:.0f} ms wall, "
              f"Redis {redis_ms:.1f} ms ({(usec1 - usec0) / max(calls1 - calls0, 1):.0f} us a call)")
finally:
    cmd("DEL", key)
