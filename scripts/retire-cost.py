#!/usr/bin/env python3
"""What ended sales cost, and what retiring them gives back (BENCHMARKS.md
"Ended sales, and retiring them"). A release `serve` against a private Redis (port 6391,
started and stopped here, so its memory and CPU are ours alone) and the
local MariaDB (a database of its own):

  A. no sale (after one sale was run, retired and purged: Redis keeps some
     memory of its own once used, whatever its keys): `serve` and Redis
     idle CPU (pidstat), Redis used_memory;
  B. N sales created, opened, two orders each (one paid, the other left to
     the payment timeout), closed: N ended sales;
  C. retirement off (RETIRE_CHECK_MS=0): idle CPU with N ended sales, memory;
  D. `serve` restarted with retirement on (a pass every 10 s, the default;
     retired 5 s after the end and purged 5 s later, to keep it short): the
     time until every sale is retired and purged, while one client orders
     from a live sale, its latency compared with the same client after;
  E. idle CPU and memory once they are all gone (the live sale too).

    scripts/retire-cost.py [sales] [seconds per idle phase]
"""
import http.client, json, os, re, secrets, shutil, statistics, subprocess, sys, tempfile, time

SALES = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
IDLE_SECS = int(sys.argv[2]) if len(sys.argv) > 2 else 30
PORT, REDIS_PORT = 18484, 6391
TOKEN = secrets.token_hex(16)
DB = f"retirecost{os.getpid()}"
WORK = tempfile.mkdtemp()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/flashsale")
ENDED = "AND product_id LIKE 'ended-%'"  # the N sales (not the warm-up's, not the live one)


class Client:
    """One keep-alive connection to `serve`."""

    def __init__(self):
        self.conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)

    def call(self, method, path, body=None, admin=False):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if admin:
            headers["Authorization"] = f"Bearer {TOKEN}"
        self.conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data else None)


def redis(*args):
    out = subprocess.run(["redis-cli", "-p", str(REDIS_PORT), *map(str, args)],
                         capture_output=True, text=True, check=True)
    return out.stdout


def used_memory():
    """(used_memory, used_memory_dataset, keys)."""
    time.sleep(2)  # UNLINK frees in the background
    info = redis("info", "memory")
    field = lambda name: int(re.search(rf"^{name}:(\d+)", info, re.M).group(1))
    if os.environ.get("RETIRE_COST_DEBUG"):
        print(info, redis("info", "clients"), redis("memory", "stats"), file=sys.stderr)
    return field("used_memory"), field("used_memory_dataset"), int(redis("dbsize"))


def mysql(sql):
    out = subprocess.run(["mariadb", "-uroot", "-N", "-e", sql, DB], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def serve(retire_check_ms):
    env = dict(os.environ, ADMIN_TOKEN=TOKEN, AUTH="none", LISTEN_ADDR=f"127.0.0.1:{PORT}",
               REDIS_URL=f"redis://127.0.0.1:{REDIS_PORT}", DATABASE_URL=f"mysql://root@127.0.0.1:3306/{DB}",
               RUST_LOG="warn", RATE_LIMITS="false", PAYMENT_TIMEOUT_SECS="5",
               RETIRE_CHECK_MS=str(retire_check_ms), RETIRE_AFTER_SECS="5", RETIRE_GRACE_SECS="5")
    log = open(os.path.join(WORK, "serve.log"), "a")
    p = subprocess.Popen([BIN, "serve"], env=env, stdout=log, stderr=log)
    for _ in range(150):
        try:
            c = Client()
            if c.call("GET", "/readyz")[0] == 200:
                return p
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("serve did not get ready")


def stop(p):
    p.terminate()
    p.wait(30)


def idle_cpu(pids, secs):
    """Average %CPU of each pid over `secs` (pidstat, 1 s samples)."""
    out = subprocess.run(["pidstat", "-u", "-p", ",".join(map(str, pids)), "1", str(secs)],
                         capture_output=True, text=True, check=True).stdout
    cpu = {}
    for line in out.splitlines():
        if line.startswith("Average:") and not line.split()[2] == "PID":
            f = line.split()
            cpu[int(f[2])] = float(f[7])  # %CPU
    return [cpu.get(p, 0.0) for p in pids]


def product(pid, now, stock, limit):
    return {"product_id": pid, "title": "t", "price": "1.00", "available_qty": stock,
            "limit_per_user": limit, "start_time": now - 60_000, "end_time": now + 3_600_000}


def orders_for(client, pid, secs, first_user):
    """Orders from one client, one every 5 ms, for `secs`: (sent at, epoch
    ms; latency, ms)."""
    lat, user, start = [], first_user, time.monotonic()
    while (now := time.monotonic()) < start + secs:
        time.sleep(max(0.0, start + (user - first_user) * 0.005 - now))
        sent, t = time.time() * 1000, time.perf_counter()
        status, _ = client.call("POST", "/api/orders", {"user_id": user, "product_id": pid, "quantity": 1})
        lat.append((sent, (time.perf_counter() - t) * 1000))
        assert status == 202, status
        user += 1
    return lat, user


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    subprocess.run(["cargo", "build", "--release", "-q", "--bin", "flashsale"], cwd=ROOT, check=True)
    rs = subprocess.Popen(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", WORK], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    p = None
    try:
        # Redis keeps some memory of its own once a service has used it
        # (scripts cached, internal tables), whatever the keys: the baseline
        # is a Redis that has served one sale, retired and purged.
        fresh_mem = used_memory()
        p = serve(10_000)
        c = Client()
        warm = "warm-0"
        assert c.call("POST", "/api/admin/products", product(warm, int(time.time() * 1000), 10, 1), admin=True)[0] == 201
        assert c.call("POST", f"/api/admin/products/{warm}/open", admin=True)[0] == 200
        assert c.call("POST", "/api/orders", {"user_id": 1, "product_id": warm, "quantity": 1})[0] == 202
        assert c.call("POST", f"/api/admin/products/{warm}/close", admin=True)[0] == 200
        while mysql(f"SELECT purged IS NOT NULL FROM tb_product WHERE product_id = '{warm}'") != "1":
            time.sleep(1)
        stop(p)
        p = serve(0)
        c = Client()
        print(f"{SALES} sales, {IDLE_SECS} s per idle phase; pidstat %CPU of one core")
        base_cpu = idle_cpu([p.pid, rs.pid], IDLE_SECS)
        base_mem = used_memory()

        t0, now, paying = time.monotonic(), int(time.time() * 1000), []
        for i in range(SALES):
            pid = f"ended-{i}"
            assert c.call("POST", "/api/admin/products", product(pid, now, 100, 1), admin=True)[0] == 201
            assert c.call("POST", f"/api/admin/products/{pid}/open", admin=True)[0] == 200
            _, o = c.call("POST", "/api/orders", {"user_id": 1, "product_id": pid, "quantity": 1})
            c.call("POST", "/api/orders", {"user_id": 2, "product_id": pid, "quantity": 1})
            paying.append(o["order_id"])
        for order in paying:
            for _ in range(100):  # once persisted
                if c.call("POST", f"/api/orders/{order}/pay", {"user_id": 1})[0] == 200:
                    break
                time.sleep(0.05)
        for i in range(SALES):
            assert c.call("POST", f"/api/admin/products/ended-{i}/close", admin=True)[0] == 200
        print(f"created, ordered, paid and closed {SALES} sales in {time.monotonic() - t0:.0f} s")
        while mysql("SELECT COUNT(*) FROM tb_order WHERE status = 'confirmed'") != "0":
            time.sleep(1)  # the unpaid ones timed out and were cancelled
        time.sleep(5)
        ended_cpu = idle_cpu([p.pid, rs.pid], IDLE_SECS)
        ended_mem = used_memory()
        stop(p)

        p = serve(10_000)
        c = Client()
        live = "live-0"
        assert c.call("POST", "/api/admin/products", product(live, int(time.time() * 1000), 10**9, 1), admin=True)[0] == 201
        assert c.call("POST", f"/api/admin/products/{live}/open", admin=True)[0] == 200
        t0 = time.monotonic()
        during, user, retired_at = [], 1, None
        while retired_at is None:
            lat, user = orders_for(c, live, 1, user)
            during += lat
            if mysql(f"SELECT COUNT(*) FROM tb_product WHERE purged IS NOT NULL {ENDED}") == str(SALES):
                retired_at = time.monotonic() - t0
        first = int(mysql(f"SELECT MIN(retired) FROM tb_product WHERE retired IS NOT NULL {ENDED}"))
        last = int(mysql(f"SELECT MAX(retired) FROM tb_product WHERE retired IS NOT NULL {ENDED}"))
        first_purge = int(mysql(f"SELECT MIN(purged) FROM tb_product WHERE purged IS NOT NULL {ENDED}"))
        last_purge = int(mysql(f"SELECT MAX(purged) FROM tb_product WHERE purged IS NOT NULL {ENDED}"))
        after, user = orders_for(c, live, 20, user)
        before = [l for t, l in during if t < first]
        retiring = [l for t, l in during if first <= t <= last or first_purge <= t <= last_purge]
        after = [l for _, l in after]
        assert c.call("POST", f"/api/admin/products/{live}/close", admin=True)[0] == 200
        while mysql(f"SELECT purged IS NOT NULL FROM tb_product WHERE product_id = '{live}'") != "1":
            time.sleep(1)
        time.sleep(3)
        gone_cpu = idle_cpu([p.pid, rs.pid], IDLE_SECS)
        gone_mem = used_memory()

        print(f"{'phase':<34} {'serve %CPU':>10} {'redis %CPU':>10} {'used_memory':>14} {'dataset':>14} {'keys':>7}")
        for name, cpu, mem in [("no sale", base_cpu, base_mem),
                               (f"{SALES} ended sales, not retired", ended_cpu, ended_mem),
                               ("all retired and purged", gone_cpu, gone_mem)]:
            print(f"{name:<34} {cpu[0]:>10.2f} {cpu[1]:>10.2f} {mem[0]:>14,} {mem[1]:>14,} {mem[2]:>7}")
        print(f"(a fresh Redis, before the service ever used it: used_memory {fresh_mem[0]:,}, dataset {fresh_mem[1]:,})")
        print(f"retired and purged minus no sale: used_memory {gone_mem[0] - base_mem[0]:+,} bytes, "
              f"dataset {gone_mem[1] - base_mem[1]:+,} bytes")
        print(f"retiring {SALES} sales: recorded over {(last - first) / 1000:.1f} s, keys deleted over "
              f"{(last_purge - first_purge) / 1000:.1f} s; all purged {retired_at:.1f} s after serve started "
              f"(a pass every 10 s, retired 5 s after the end, purged 5 s later)")
        for name, lat in [("before the retirement", before), ("while retiring/purging", retiring),
                          ("after it", after)]:
            if not lat:
                continue
            print(f"orders of a live sale {name:<22}: {len(lat):>6} orders, p50 {statistics.median(lat):.2f} ms, "
                  f"p99 {pct(lat, 0.99):.2f} ms, max {max(lat):.2f} ms")
    finally:
        if p:
            stop(p)
        rs.terminate()
        rs.wait(10)
        subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {DB}"], check=False)
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
