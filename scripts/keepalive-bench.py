#!/usr/bin/env python3
"""Keep-alive clients against a running `flashsale serve`, under refusals.

Each of --threads threads keeps one HTTP/1.1 connection (http.client, as a
Python service would) and sends --requests orders on it, for a sale opened
here, reconnecting only when it must: after a transport error (counted), or
after an answer that says `Connection: close`. With --close-on-refusal the
client also reconnects after every 429/503, which is what a server that closes
the connection after each refusal costs.

Prints the answers by status, the transport errors, the connections opened,
and the server's CPU time per answer (from /proc/<pid>/stat: user + system),
as one JSON line.

  scripts/keepalive-bench.py --url http://127.0.0.1:8080 --pid <serve pid> \
      --admin-token "$ADMIN_TOKEN" [--close-on-refusal]

Sends traffic to the given URL only (use 127.0.0.1), bounded in count and
time (--max-secs).
"""

import argparse
import collections
import http.client
import json
import os
import threading
import time
import urllib.parse
import uuid


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def admin(host, port, token, method, path, body=None):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request(method, path, json.dumps(body) if body else None, headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    if resp.status >= 300:
        raise SystemExit(f"{method} {path}: {resp.status} {data!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--admin-token", default=os.environ.get("ADMIN_TOKEN"))
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--requests", type=int, default=300, help="per thread")
    ap.add_argument("--stock", type=int, default=1000)
    ap.add_argument("--close-on-refusal", action="store_true")
    ap.add_argument("--max-secs", type=float, default=60)
    args = ap.parse_args()
    url = urllib.parse.urlparse(args.url)
    host, port = url.hostname, url.port or 80
    assert host in ("127.0.0.1", "localhost", "::1"), "loopback only"

    sku = "ka-" + uuid.uuid4().hex[:12]
    now = int(time.time() * 1000)
    admin(host, port, args.admin_token, "POST", "/api/admin/products", {
        "product_id": sku, "title": "keep-alive bench", "price": "1.00",
        "available_qty": args.stock, "start_time": now - 60_000,
        "end_time": now + 3_600_000, "limit_per_user": 1,
    })
    admin(host, port, args.admin_token, "POST", f"/api/admin/products/{sku}/open")

    statuses = collections.Counter()
    lock = threading.Lock()
    totals = {"transport_errors": 0, "connections": 0}
    deadline = time.monotonic() + args.max_secs

    def client(t):
        conn, mine, errors, opened = None, collections.Counter(), 0, 0
        for i in range(args.requests):
            if time.monotonic() > deadline:
                break
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=10)
                opened += 1
            body = json.dumps({"user_id": t * 1_000_000 + i + 1, "product_id": sku, "quantity": 1})
            try:
                conn.request("POST", "/api/orders", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
            except (OSError, http.client.HTTPException):
                errors += 1
                conn.close()
                conn = None
                continue
            mine[resp.status] += 1
            closing = (resp.getheader("connection") or "").lower() == "close"
            if closing or (args.close_on_refusal and resp.status in (429, 503)):
                conn.close()
                conn = None
        if conn is not None:
            conn.close()
        with lock:
            statuses.update(mine)
            totals["transport_errors"] += errors
            totals["connections"] += opened

    before = cpu_ticks(args.pid)
    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(t,)) for t in range(args.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - started
    ticks = cpu_ticks(args.pid) - before
    answers = sum(statuses.values())
    hz = os.sysconf("SC_CLK_TCK")
    print(json.dumps({
        "mode": "close-on-refusal" if args.close_on_refusal else "keep-alive",
        "answers": answers,
        "statuses": dict(sorted(statuses.items())),
        "transport_errors": totals["transport_errors"],
        "connections": totals["connections"],
        "secs": round(elapsed, 2),
        "server_cpu_us_per_answer": round(ticks / hz * 1e6 / max(answers, 1), 1),
    }))


if __name__ == "__main__":
    main()
