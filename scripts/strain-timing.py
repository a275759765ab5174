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
import argparse, random, re, time

from localserve import LocalServe

ap = argparse.ArgumentParser()
ap.add_argument("rounds", type=int, nargs="?", default=5)
ap.add_argument("--every", type=float, default=0.1, help="seconds between scrapes (the readers' pace)")
ap.add_argument("--bin", default=None, help="a flashsale binary (default: this tree's release build, else debug)")
args = ap.parse_args()
serve = LocalServe("strain", args.bin, args=["--workers", "false"])
call = serve.call


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
    ticket = t["ticket"]
    while True:
        _, s = call("GET", f"/api/sales/{sku}/queue/{ticket}")
        if s["status"] == "admitted":
            break
        time.sleep(0.05)
    status, _ = call("POST", "/api/orders", {"user_id": 1, "product_id": sku, "quantity": 1},
                     {"Admission-Token": s["admission"]})
    assert status == 202, status
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
    with serve:
        print(f"{serve.binary}, a scrape every {args.every:g} s: pace (buyers/s) after the first unpersisted order, by seconds since it")
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


if __name__ == "__main__":
    main()
