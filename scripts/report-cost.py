#!/usr/bin/env python3
"""What a sale's timeline costs the books (BENCHMARKS.md "What does the
report cost?"): a release `serve` with its workers (one process) against
the local Redis (a key prefix of its own) and MariaDB (a database of its
own); a room sale with a steady crowd for `secs` seconds (joins, polls,
orders at `rate` a second, some refused); then the sale's `tb_sale_second`
rows: how many, their JSON bytes, and InnoDB's bytes for the table (after
ANALYZE), per sale-hour (x 3600 / secs); and the report's bytes, which is
what the books keep once the sale is purged. Redis holds none of it.

    scripts/report-cost.py [secs] [orders a second] [--bin path]
"""
import argparse, json, random, time

from localserve import LocalServe

ap = argparse.ArgumentParser()
ap.add_argument("secs", type=int, nargs="?", default=60)
ap.add_argument("rate", type=int, nargs="?", default=20)
ap.add_argument("--bin", default=None)
args = ap.parse_args()


def main():
    with LocalServe("repcost", args.bin) as serve:
        call, mysql, DB = serve.call, serve.mysql, serve.db
        sku = f"cost-{random.randrange(10**6)}"
        now = int(time.time() * 1000)
        stock = args.secs * args.rate
        body = {"product_id": sku, "title": "t", "price": "1.00", "available_qty": stock, "limit_per_user": 1,
                "start_time": now - 1000, "end_time": now + 3_600_000,
                "waiting_room": {"ceiling_per_sec": args.rate, "admission_secs": 60}}
        assert call("POST", "/api/admin/products", body, admin=True)[0] == 201
        assert call("POST", f"/api/admin/products/{sku}/open", admin=True)[0] == 200
        t0, user, tickets = time.monotonic(), 0, []
        while time.monotonic() - t0 < args.secs:
            second = time.monotonic()
            for _ in range(args.rate):
                user += 1
                status, t = call("POST", f"/api/sales/{sku}/queue", {"user_id": user})
                if status == 200:
                    tickets.append((user, t["ticket"]))
            for u, t in tickets[-3 * args.rate:]:
                status, s = call("GET", f"/api/sales/{sku}/queue/{t}")
                if status == 200 and s.get("status") == "admitted":
                    h = {"Admission-Token": s["admission"]}
                    call("POST", "/api/orders", {"user_id": u, "product_id": sku, "quantity": 1}, headers=h)
            # A refusal or two a second: no admission.
            call("POST", "/api/orders", {"user_id": 10**9 + user, "product_id": sku, "quantity": 1})
            time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
        time.sleep(3)
        rows = int(mysql(f"SELECT COUNT(*) FROM tb_sale_second WHERE product_id = '{sku}'"))
        json_bytes = int(mysql(
            f"SELECT SUM(LENGTH(counts) + LENGTH(gauges) + LENGTH(latency) + LENGTH(buyers)) FROM tb_sale_second WHERE product_id = '{sku}'"))
        mysql("ANALYZE TABLE tb_sale_second")
        data, avg = map(int, mysql(
            f"SELECT DATA_LENGTH, AVG_ROW_LENGTH FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA = '{DB}' AND TABLE_NAME = 'tb_sale_second'").split())
        hour = 3600 / args.secs
        orders = int(mysql(f"SELECT COUNT(*) FROM tb_order WHERE product_id = '{sku}'"))
        print(f"{serve.binary}: {args.secs} s of a room sale, {args.rate} joins/s, {orders} orders, one process")
        print(f"  tb_sale_second: {rows} rows, {json_bytes / max(rows, 1):.0f} JSON bytes a row, "
              f"InnoDB ~{avg} bytes a row ({data} data bytes)")
        print(f"  per sale-hour: {rows * hour:.0f} rows, {json_bytes * hour / 1e6:.2f} MB of JSON, "
              f"~{rows * hour * avg / 1e6:.2f} MB in InnoDB; Redis: 0")
        # What stays once the sale is purged: its report (these rows go).
        status, report = call("GET", f"/api/admin/products/{sku}/report", admin=True)
        assert status == 200, status
        kept = len(json.dumps(report, separators=(",", ":")))
        seconds = len(report["seconds"])
        print(f"  the report (kept at retirement; the rows go at the purge): {kept} bytes, "
              f"{seconds} seconds: {kept * 3600 / max(seconds, 1) / 1e6:.2f} MB per sale-hour")


if __name__ == "__main__":
    main()
