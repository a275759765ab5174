#!/usr/bin/env python3
"""What open sales cost while nobody orders (BENCHMARKS.md "Quiet
open sales"). A release `serve` (API and workers in one
process) against a private Redis (port 6392, started and stopped here, so
its CPU and commands are ours alone) and the local MariaDB (a database of
its own):

  1. N sales created and opened (no order);
  2. a settling wait, then `serve`'s and Redis's %CPU of one core over the
     measured seconds (pidstat), and the Redis commands in that time by
     name (INFO commandstats);
  3. then an order on each of a few sales picked at random, and how long
     each took to reach MySQL (polled every 10 ms).

Several binaries (`--bin A --bin B`) are measured one after the other in
the same sitting, each on fresh sales, for a side-by-side table.

    scripts/idle-sales-cost.py [sales] [measured seconds] [--bin path]...
"""
import argparse, http.client, json, os, random, re, secrets, shutil, subprocess, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("sales", type=int, nargs="?", default=1000)
ap.add_argument("secs", type=int, nargs="?", default=30)
ap.add_argument("--bin", action="append", help="a flashsale binary (default: this tree's release build)")
ap.add_argument("--orders", type=int, default=5, help="orders placed after the idle phase, one per sale")
ap.add_argument("--settle", type=int, default=20, help="seconds between the last sale opened and the measurement")
args = ap.parse_args()

PORT, REDIS_PORT = 18485, 6392
TOKEN = secrets.token_hex(16)
WORK = tempfile.mkdtemp()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Client:
    """One keep-alive connection to `serve`."""

    def __init__(self):
        self.conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)

    def call(self, method, path, body=None, admin=False):
        try:
            return self.send(method, path, body, admin)
        except (http.client.HTTPException, OSError):  # the server closed an idle connection
            self.conn.close()
            return self.send(method, path, body, admin)

    def send(self, method, path, body, admin):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if admin:
            headers["Authorization"] = f"Bearer {TOKEN}"
        self.conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data else None)


def redis(*a):
    return subprocess.run(["redis-cli", "-p", str(REDIS_PORT), *map(str, a)],
                          capture_output=True, text=True, check=True).stdout


def commandstats():
    """{command: calls} from INFO commandstats."""
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^cmdstat_([^:]+):calls=(\d+)", redis("info", "commandstats"), re.M)}


def mysql(db, sql):
    return subprocess.run(["mariadb", "-uroot", "-N", "-e", sql, db],
                          capture_output=True, text=True, check=True).stdout.strip()


def cpu(pids, secs):
    """Average %CPU of one core of each pid over `secs` (pidstat, 1 s samples)."""
    out = subprocess.run(["pidstat", "-u", "-p", ",".join(map(str, pids)), "1", str(secs)],
                         capture_output=True, text=True, check=True).stdout
    seen = {}
    for line in out.splitlines():
        f = line.split()
        if line.startswith("Average:") and f[2] != "PID":
            seen[int(f[2])] = float(f[7])
    return [seen.get(p, 0.0) for p in pids]


def measure(binary, n):
    db = f"idlecost{os.getpid()}{random.randrange(10**6)}"
    env = dict(os.environ, ADMIN_TOKEN=TOKEN, AUTH="none", LISTEN_ADDR=f"127.0.0.1:{PORT}",
               REDIS_URL=f"redis://127.0.0.1:{REDIS_PORT}", DATABASE_URL=f"mysql://root@127.0.0.1:3306/{db}",
               RUST_LOG="warn", RATE_LIMITS="false")
    redis("flushall")
    log = open(os.path.join(WORK, "serve.log"), "a")
    p = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=log)
    try:
        for _ in range(150):
            try:
                if Client().call("GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        c, now, t0 = Client(), int(time.time() * 1000), time.monotonic()
        for i in range(n):
            pid = f"quiet-{i}"
            body = {"product_id": pid, "title": "t", "price": "1.00", "available_qty": 100,
                    "limit_per_user": 1, "start_time": now - 60_000, "end_time": now + 3_600_000}
            assert c.call("POST", "/api/admin/products", body, admin=True)[0] == 201
            assert c.call("POST", f"/api/admin/products/{pid}/open", admin=True)[0] == 200
        opened = time.monotonic() - t0
        time.sleep(args.settle)
        redis("config", "resetstat")
        serve_cpu, redis_cpu = cpu([p.pid, rs.pid], args.secs)
        calls = commandstats()
        waits = []
        for k, i in enumerate(random.sample(range(n), min(args.orders, n))):
            time.sleep(1.5)  # each order finds its sale quiet
            status, o = c.call("POST", "/api/orders", {"user_id": 1 + k, "product_id": f"quiet-{i}", "quantity": 1})
            assert status == 202, (status, o)
            t = time.monotonic()
            while mysql(db, f"SELECT COUNT(*) FROM tb_order WHERE order_id = '{o['order_id']}'") != "1":
                assert time.monotonic() - t < 30, "order not persisted in 30 s"
                time.sleep(0.01)
            waits.append((time.monotonic() - t) * 1000)
        return dict(opened=opened, serve=serve_cpu, redis=redis_cpu, calls=calls, waits=waits)
    finally:
        p.terminate()
        p.wait(30)
        subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {db}"], check=True)


bins = args.bin or [os.path.join(ROOT, "target/release/flashsale")]
rs = subprocess.Popen(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--dir", WORK], stdout=subprocess.DEVNULL)
time.sleep(0.5)
try:
    print(f"{args.sales} open sales, no order; {args.secs} s measured after {args.settle} s; "
          f"pidstat %CPU of one core; Redis commands per second")
    for b in bins:
        r = measure(b, args.sales)
        total = sum(r["calls"].values())
        top = sorted(r["calls"].items(), key=lambda kv: -kv[1])[:6]
        per_s = ", ".join(f"{k} {v / args.secs:.0f}" for k, v in top)
        waits = ", ".join(f"{w:.0f}" for w in r["waits"])
        print(f"{b}\n  opened in {r['opened']:.0f} s; serve {r['serve']:.1f}%  redis {r['redis']:.1f}%  "
              f"commands {total / args.secs:.0f}/s ({per_s})\n  an order on a quiet sale persisted after (ms): {waits}")
finally:
    rs.terminate()
    rs.wait(10)
    shutil.rmtree(WORK, ignore_errors=True)
