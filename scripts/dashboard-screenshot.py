#!/usr/bin/env python3
"""The README's dashboard screenshot (docs/dashboard.png): a release `serve`
on its own key prefix and database, two sales taking orders for about a
minute (one sells out; half the orders paid through the local trial's pay
route), the events pushed to a receiver this script runs (it acknowledges
most, fails a few), headless Chromium signed in through the page's form
(chromedriver's WebDriver protocol), a screenshot. Needs the local Redis and
MariaDB, `chromium` and `chromium-driver`.

    scripts/dashboard-screenshot.py [out.png]
"""
import base64, json, os, random, secrets, socket, subprocess, sys, threading, time
import http.server, urllib.error, urllib.request

OUT = sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png"
PORT, DRIVER, HOOK = 18282, 18283, 18284
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = secrets.token_hex(16)
PREFIX = f"shot{os.getpid()}"


def call(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except urllib.error.URLError:
        return 0, None


def admin(path, body=None):
    return call("POST", BASE + path, body, {"Authorization": f"Bearer {TOKEN}"})


def wd(method, path, body=None):
    status, answer = call(method, f"http://127.0.0.1:{DRIVER}{path}", body)
    return answer["value"] if answer else None


class Receiver(http.server.BaseHTTPRequestHandler):
    """The shop's endpoint: takes each event, fails about one in twenty."""
    seen = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Receiver.seen += 1
        self.send_response(500 if Receiver.seen % 20 == 0 else 204)
        self.end_headers()

    def log_message(self, *args):
        pass


hook = http.server.ThreadingHTTPServer(("127.0.0.1", HOOK), Receiver)
threading.Thread(target=hook.serve_forever, daemon=True).start()

subprocess.run(["cargo", "build", "--release", "-q"], check=True)
env = dict(os.environ, ADMIN_TOKEN=TOKEN, AUTH="none", LISTEN_ADDR=f"127.0.0.1:{PORT}",
           REDIS_KEY_PREFIX=PREFIX, DATABASE_URL=f"mysql://root@127.0.0.1:3306/{PREFIX}",
           RATE_LIMITS="false", BOOKS_CHECK_MS="2000", RUST_LOG="warn",
           EVENT_WEBHOOK_URL=f"http://127.0.0.1:{HOOK}/events",
           EVENT_WEBHOOK_SECRET="whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())
serve = subprocess.Popen(["target/release/flashsale", "serve"], env=env)
driver = subprocess.Popen(["chromedriver", f"--port={DRIVER}"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
try:
    for _ in range(100):
        if call("GET", BASE + "/readyz")[0] == 200:
            break
        time.sleep(0.2)
    now = int(time.time() * 1000)
    sales = {"phone-x1": (300, 2), "earbuds-2": (1000, 3)}
    for sku, (stock, limit) in sales.items():
        admin("/api/admin/products", {"product_id": sku, "title": sku, "price": "99.00",
                                      "available_qty": stock, "limit_per_user": limit,
                                      "start_time": now - 5_000, "end_time": now + 3_600_000})
        admin(f"/api/admin/products/{sku}/open")

    stop = time.time() + 75
    def buyers(sku, per_sec, users):
        rng = random.Random(sku)
        while time.time() < stop:
            user = rng.randint(1, users)
            status, order = call("POST", BASE + "/api/orders",
                                 {"user_id": user, "product_id": sku, "quantity": 1})
            if status == 202 and order and rng.random() < 0.5:
                threading.Timer(3.0, call, ("POST", BASE + f"/api/orders/{order['order_id']}/pay",
                                            {"user_id": user})).start()
            time.sleep(1 / per_sec)
    threads = [threading.Thread(target=buyers, args=a) for a in
               [("phone-x1", 9, 400), ("phone-x1", 9, 400), ("earbuds-2", 6, 2000)]]
    for t in threads:
        t.start()

    for _ in range(100):
        if wd("GET", "/status") and wd("GET", "/status").get("ready"):
            break
        time.sleep(0.1)
    session = wd("POST", "/session", {"capabilities": {"alwaysMatch": {
        "browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--lang=en-US"]}}}})["sessionId"]
    s = f"/session/{session}"
    wd("POST", s + "/url", {"url": BASE + "/admin/dashboard"})
    el = lambda css: wd("POST", s + "/element", {"using": "css selector", "value": css})[
        "element-6066-11e4-a52e-4f735466cecf"]
    wd("POST", s + f"/element/{el('#token')}/value", {"text": TOKEN})
    wd("POST", s + f"/element/{el('#sign-in')}/click", {})
    time.sleep(70)
    png = base64.b64decode(wd("GET", s + "/screenshot"))
    with open(OUT, "wb") as f:
        f.write(png)
    print(f"saved {OUT} ({len(png)} bytes)")
    wd("DELETE", s)
    for t in threads:
        t.join()
finally:
    serve.terminate()
    driver.terminate()
    hook.shutdown()
    serve.wait()
    subprocess.run(f"redis-cli --scan --pattern '{PREFIX}:*' | xargs -r redis-cli del >/dev/null",
                   shell=True)
    subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {PREFIX}"])
