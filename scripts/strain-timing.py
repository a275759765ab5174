#!/usr/bin/env python3
"""How soon a waiting room's pace follows a stalled backend (BENCHMARKS.md
"How fast the pace follows the backend"): a `serve` without workers
(`--workers false`, so nothing persists) against the local Redis (a key
prefix of its own) and MariaDB (a database of its own); per round, a room
sale (ceiling 1,000/s, floor 100/s), one buyer joins and orders: that
order is the oldest unpersisted from then on. `/metrics` is scraped every
100 ms (`--every`; with the admin token, as Prometheus would; each scrape lets the
instance renew its reading of the room, as buyers' polls do) and the pace
recorded when it changes: the time from the order to the first halving
and to the floor.

    scripts/strain-timing.py [rounds] [--every secs] [--bin path]
"""
import argparse, http.client, json, os, random, re, secrets, subprocess, time

ap = argparse.ArgumentParser()
ap.add_argument("rounds", type=int, nargs="?", default=5)
ap.add_argument("--every", type=float, default=0.1, help="seconds between scrapes (the readers' pace)")
ap.add_argument("--bin", default=None, help="a flashsale binary (default: this tree's release build, else debug)")
args = ap.parse_args()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
PORT = 18000 + random.randrange(1000)
TOKEN = secrets.token_hex(16)
PREFIX = f"strain{random.randrange(10**6)}"
DB = f"strain{os.getpid()}"


def call(method, path, body=None, admin=False):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if admin:
        headers["Authorization"] = f"Bearer {TOKEN}"
    conn.request(method, path, json.dumps(body) if body is not None else None, headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def pace(sku):
    _, text = call("GET", "/metrics", admin=True)
    m = re.search(rf'^flashsale_room_admit_per_sec{{product_id="{re.escape(sku)}"}} (\S+)$', text.decode(), re.M)
    return float(m.group(1)) if m else None


def round_once(i):
    sku = f"strain-{i}-{random.randrange(10**6)}"
    now = int(time.time() * 1000)
    body = {"product_id": sku, "title": "t", "price": "1.00", "available_qty": 1000, "limit_per_user": 1,
            "start_time": now - 1000, "end_time": now + 600_000,
            "waiting_room": {"ceiling_per_sec": 1000, "floor_per_sec": 100, "admission_secs": 60}}
    assert call("POST", "/api/admin/products", body, admin=True)[0] == 201
    assert call("POST", f"/api/admin/products/{sku}/open", admin=True)[0] == 200
    status, t = call("POST", f"/api/sales/{sku}/queue", {"user_id": 1})
    assert status == 200, t
    ticket = json.loads(t)["ticket"]
    while True:
        _, s = call("GET", f"/api/sales/{sku}/queue/{ticket}")
        s = json.loads(s)
        if s["status"] == "admitted":
            break
        time.sleep(0.05)
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    conn.request("POST", "/api/orders", json.dumps({"user_id": 1, "product_id": sku, "quantity": 1}),
                 {"Content-Type": "application/json", "Admission-Token": s["admission"]})
    r = conn.getresponse()
    r.read()
    assert r.status == 202, r.status
    t0 = time.monotonic()
    seen = []
    while time.monotonic() - t0 < 20:
        p = pace(sku)
        if p is not None and (not seen or seen[-1][1] != p):
            seen.append((time.monotonic() - t0, p))
        if p == 100:
            break
        time.sleep(args.every)
    return seen


def main():
    binary = args.bin
    if binary is None:
        release = os.path.join(TARGET, "release/flashsale")
        binary = release if os.path.exists(release) else os.path.join(TARGET, "debug/flashsale")
    env = dict(os.environ, ADMIN_TOKEN=TOKEN, AUTH="none", LISTEN_ADDR=f"127.0.0.1:{PORT}",
               REDIS_KEY_PREFIX=PREFIX, DATABASE_URL=f"mysql://root@127.0.0.1:3306/{DB}", RUST_LOG="warn",
               RATE_LIMITS="false")
    p = subprocess.Popen([binary, "serve", "--workers", "false"], env=env)
    try:
        for _ in range(300):
            try:
                if call("GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        print(f"{binary}, a scrape every {args.every:g} s: pace (buyers/s) after the first unpersisted order, by seconds since it")
        firsts, floors = [], []
        for i in range(args.rounds):
            seen = round_once(i)
            print("  " + ", ".join(f"{t:.1f} s: {p:g}" for t, p in seen))
            halved = [t for t, p in seen if p < 1000]
            floor = [t for t, p in seen if p == 100]
            if halved and floor:
                firsts.append(halved[0])
                floors.append(floor[0])
        print(f"first halving {min(firsts):.1f}-{max(firsts):.1f} s, the floor {min(floors):.1f}-{max(floors):.1f} s "
              f"({len(firsts)} rounds)")
    finally:
        p.terminate()
        p.wait(30)
        keys = subprocess.run(["redis-cli", "--scan", "--pattern", f"{PREFIX}:*"], capture_output=True, text=True).stdout.split()
        for k in range(0, len(keys), 500):
            subprocess.run(["redis-cli", "del", *keys[k:k + 500]], capture_output=True)
        subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {DB}"], check=True)


if __name__ == "__main__":
    main()
