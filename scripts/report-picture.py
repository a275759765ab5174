#!/usr/bin/env python3
"""The README's picture of a sale's report (docs/report.png), from a sale
shaped like a real one: a release `serve` with its workers against the
local Redis (a key prefix of its own) and MariaDB (a database of its own),
a room sale of `stock` units, buyers joining before the start and after
it, most admitted buyers ordering (some walk away: their admissions run
out; some order twice: over the limit; bots order without an admission),
most orders paid by signed notifications (Standard Webhooks; a few fail
first), the rest timing out, three paying late. Then headless Chromium
(chromedriver, WebDriver over plain HTTP) signs in to the dashboard,
opens the report and saves a screenshot.

    scripts/report-picture.py [--stock 300] [--out target/tmp/report-picture.png] [--bin path]

Takes about two minutes; traffic goes to 127.0.0.1 only, bounded by the
stock and the crowd below.
"""
import argparse, base64, hashlib, hmac, http.client, json, os, random, secrets, shutil
import subprocess, threading, time
from concurrent.futures import ThreadPoolExecutor

from localserve import TARGET, LocalServe

ap = argparse.ArgumentParser()
ap.add_argument("--stock", type=int, default=300)
ap.add_argument("--out", default=None)
ap.add_argument("--bin", default=None)
args = ap.parse_args()

KEY = secrets.token_bytes(32)
PRICE = "9.90"
TIMEOUT_SECS = 25
SKU = f"phone-{random.randrange(10**4)}"
rng = random.Random(7)
serve = LocalServe("reppic", args.bin, env={
    "PAYMENT_WEBHOOK_SECRETS": "whsec_" + base64.b64encode(KEY).decode(),
    "PAYMENT_TIMEOUT_SECS": str(TIMEOUT_SECS),
})
call = serve.call


def pay(order_id, kind="payment.succeeded"):
    """A payment side's notification, signed per Standard Webhooks."""
    body = json.dumps({"type": kind, "data": {"order_id": order_id, "payment_id": "pay_" + secrets.token_hex(6),
                                              "amount": PRICE, "currency": "CNY"}})
    msg_id, ts = "msg_" + secrets.token_hex(8), str(int(time.time()))
    sig = base64.b64encode(hmac.new(KEY, f"{msg_id}.{ts}.{body}".encode(), hashlib.sha256).digest()).decode()
    headers = {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": f"v1,{sig}"}
    for _ in range(20):  # 409 order_pending: not persisted yet, send again
        status, answer = call("POST", "/api/payments/notifications", body, headers)
        if status != 409:
            return answer
        time.sleep(0.5)


class Crowd:
    def __init__(self, sku):
        self.sku, self.lock = sku, threading.Lock()
        self.tickets = {}  # user -> ticket
        self.done = set()
        self.orders = []  # (user, order_id, when)
        self.sold_out = False

    def join(self, user):
        status, t = call("POST", f"/api/sales/{self.sku}/queue", {"user_id": user})
        if status == 200:
            with self.lock:
                self.tickets[user] = t["ticket"]

    def order(self, user, admission=None):
        h = {"Admission-Token": admission} if admission else {}
        status, answer = call("POST", "/api/orders", {"user_id": user, "product_id": self.sku, "quantity": 1}, h)
        if status == 202:
            with self.lock:
                self.orders.append((user, answer["order_id"], time.monotonic()))
        elif isinstance(answer, dict) and answer.get("error") == "sold_out":
            self.sold_out = True

    def poll(self, user, ticket):
        status, s = call("GET", f"/api/sales/{self.sku}/queue/{ticket}")
        if status != 200:
            return
        state = s.get("status")
        if state == "admitted":
            self.done.add(user)
            if rng.random() < 0.15:  # walks away: the admission runs out unused
                return
            self.order(user, s["admission"])
            if user % 7 == 0:  # a second order: over the limit
                self.order(user, s["admission"])
        elif state in ("sold_out", "ended", "expired"):
            self.done.add(user)


def webdriver_screenshot(out):
    port = 19900 + random.randrange(99)
    driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def wd(method, path, body=None):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request(method, path, json.dumps(body) if body is not None else None,
                         {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            conn.close()
            if isinstance(answer.get("value"), dict) and "error" in answer["value"]:
                raise RuntimeError(f"webdriver {path}: {answer['value']}")
            return answer.get("value")
        for _ in range(100):
            try:
                if wd("GET", "/status")["ready"]:
                    break
            except OSError:
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--lang=en-US", "--window-size=900,1200"]}}}}
        s = "/session/" + wd("POST", "/session", caps)["sessionId"]
        el = lambda css: list(wd("POST", f"{s}/element", {"using": "css selector", "value": css}).values())[0]
        wd("POST", f"{s}/url", {"url": serve.url("/admin/dashboard")})
        wd("POST", f"{s}/element/{el('#token')}/value", {"text": serve.token})
        wd("POST", f"{s}/element/{el('#sign-in')}/click", {})
        time.sleep(2)
        wd("POST", f"{s}/url", {"url": serve.url(f"/admin/dashboard/report/{SKU}")})
        height = wd("POST", f"{s}/execute/sync", {"script": "return document.body.scrollHeight;", "args": []})
        wd("POST", f"{s}/window/rect", {"width": 900, "height": min(int(height) + 140, 4000)})
        time.sleep(1)
        png = base64.b64decode(wd("GET", f"{s}/screenshot"))
        with open(out, "wb") as f:
            f.write(png)
        wd("DELETE", s)
    finally:
        driver.terminate()
        driver.wait(10)



def main():
    out = args.out or os.path.join(TARGET, "tmp/report-picture.png")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    for tool in ("chromium", "chromedriver"):
        if not shutil.which(tool):
            raise SystemExit(f"needs {tool}: apt-get install chromium chromium-driver")
    with ThreadPoolExecutor(8) as pool, serve:
        now = int(time.time() * 1000)
        body = {"product_id": SKU, "title": "Phone X, 256 GB", "price": PRICE, "available_qty": args.stock,
                "limit_per_user": 1, "start_time": now + 10_000, "end_time": now + 600_000,
                "waiting_room": {"ceiling_per_sec": 20, "admission_secs": 15, "join_early_secs": 600}}
        assert call("POST", "/api/admin/products", body, admin=True)[0] == 201
        assert call("POST", f"/api/admin/products/{SKU}/open", admin=True)[0] == 200
        crowd = Crowd(SKU)
        user, t0 = 0, time.monotonic()
        # Before the start: 25 join a second (drawn at the start); a buyer
        # too early is refused.
        while time.monotonic() - t0 < 9.5:
            second = time.monotonic()
            list(pool.map(crowd.join, range(user + 1, user + 26)))
            user += 25
            time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
        crowd.order(10**6)
        time.sleep(max(0.0, 10.5 - (time.monotonic() - t0)))
        # The sale: 15 join a second for 20 s, every ticket polled each
        # second, bots without an admission, until sold out and the line
        # is through.
        paid = set()
        started = time.monotonic()
        while time.monotonic() - started < 60:
            second = time.monotonic()
            if second - started < 20:
                list(pool.map(crowd.join, range(user + 1, user + 16)))
                user += 15
            for bot in range(2):
                crowd.order(2 * 10**6 + rng.randrange(10**5))
            with crowd.lock:
                waiting = [(u, t) for u, t in crowd.tickets.items() if u not in crowd.done]
            list(pool.map(lambda ut: crowd.poll(*ut), waiting))
            # Payments: 80% of orders, 3-12 s after ordering (a few fail
            # first); the rest are left to time out.
            with crowd.lock:
                orders = list(crowd.orders)
            for u, order_id, at in orders:
                if order_id in paid or (u * 2654435761) % 100 >= 80:
                    continue
                if time.monotonic() - at >= 3 + (u % 10):
                    paid.add(order_id)
                    if u % 13 == 0:
                        pool.submit(pay, order_id, "payment.failed")
                    pool.submit(pay, order_id)
            if crowd.sold_out and not waiting and second - started > 25:
                break
            time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
        # Three of the unpaid pay late, after their timeout.
        unpaid = [o for _, o, _ in crowd.orders if o not in paid]
        print(f"{SKU}: {user} joined, {len(crowd.orders)} orders, {len(paid)} paid, {len(unpaid)} left to time out")
        time.sleep(TIMEOUT_SECS + 6)
        for order_id in unpaid[:3]:
            print("late:", pay(order_id))
        time.sleep(4)
        webdriver_screenshot(out)
        print(f"saved {out}")


if __name__ == "__main__":
    main()
