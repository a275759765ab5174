#!/usr/bin/env python3
"""The README's picture of the buyer's page (docs/buyer-page.png): a `serve`
(AUTH=none) on its own key prefix and database, a sale with a waiting room
starting in about half a minute, forty buyers joining its line early (by
the API), and one buyer on the page in headless Chromium at phone width
(chromedriver's WebDriver protocol): before the start, in line after the
draw (joining after the start, behind the forty), and with the order
confirmed. The three views side by side in one image. Needs the local Redis
and MariaDB, `chromium` and `chromium-driver`.

    scripts/buyer-page-screenshot.py [out.png]
"""
import base64, json, os, secrets, subprocess, sys, tempfile, time
import urllib.error, urllib.request

OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "docs/buyer-page.png")
PORT, DRIVER = 18292, 18293
BASE = f"http://127.0.0.1:{PORT}"
TOKEN = secrets.token_hex(16)
PREFIX = f"page{os.getpid()}"
SKU = "phone-x1"
WIDTH, HEIGHT = 430, 900
TARGET = os.environ.get("CARGO_TARGET_DIR", "target")


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


def until(what, check, limit=60):
    deadline = time.time() + limit
    while not check():
        if time.time() > deadline:
            raise SystemExit(f"gave up waiting: {what}")
        time.sleep(0.1)


# The page is the same in any build: the debug one the tests use will do.
subprocess.run(["cargo", "build", "-q", "-p", "flashsale"], check=True)
env = dict(os.environ, ADMIN_TOKEN=TOKEN, AUTH="none", LISTEN_ADDR=f"127.0.0.1:{PORT}",
           REDIS_KEY_PREFIX=PREFIX, DATABASE_URL=f"mysql://root@127.0.0.1:3306/{PREFIX}",
           RATE_LIMITS="false", RUST_LOG="warn")
serve = subprocess.Popen([f"{TARGET}/debug/flashsale", "serve"], env=env)
driver = subprocess.Popen(["chromedriver", f"--port={DRIVER}"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
shots = []
try:
    until("the service", lambda: call("GET", BASE + "/readyz")[0] == 200)
    start = int(time.time() * 1000) + 25_000
    admin("/api/admin/products", {
        "product_id": SKU, "title": "Phone X1 · 256 GB", "price": "4999.00",
        "available_qty": 100, "limit_per_user": 1,
        "start_time": start, "end_time": start + 3_600_000,
        "waiting_room": {"ceiling_per_sec": 2, "admission_secs": 120, "join_early_secs": 600}})
    admin(f"/api/admin/products/{SKU}/open")
    joined = [call("POST", BASE + f"/api/sales/{SKU}/queue", {"user_id": u})[0]
              for u in range(1001, 1041)]
    if joined != [200] * 40:
        raise SystemExit(f"the early joins answered {joined}")

    until("chromedriver", lambda: (wd("GET", "/status") or {}).get("ready"))
    session = wd("POST", "/session", {"capabilities": {"alwaysMatch": {
        "browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={WIDTH},{HEIGHT}", "--lang=en-US",
                     "--hide-scrollbars"]}}}})["sessionId"]
    s = f"/session/{session}"
    el = lambda css: wd("POST", s + "/element", {"using": "css selector", "value": css})[
        "element-6066-11e4-a52e-4f735466cecf"]
    js = lambda script: wd("POST", s + "/execute/sync", {"script": script, "args": []})
    phase = lambda: js("return document.body.dataset.phase;")

    def shot():
        # The window as tall as the page, from its top, no focus ring.
        js("document.activeElement.blur(); window.scrollTo(0, 0); return null;")
        for _ in range(2):
            frame = js("return window.outerHeight - window.innerHeight;")
            height = js("return Math.ceil(document.querySelector('main').getBoundingClientRect().bottom);")
            wd("POST", s + "/window/rect", {"width": WIDTH, "height": height + frame})
            time.sleep(0.3)
        shots.append(wd("GET", s + "/screenshot"))

    wd("POST", s + "/url", {"url": f"{BASE}/sale/{SKU}"})
    until("the page", lambda: phase() == "idle")
    wd("POST", s + f"/element/{el('#user-id')}/value", {"text": "7"})
    time.sleep(2)
    shot()

    # After the start: a late joiner, placed behind the forty early ones.
    until("the start", lambda: js("return document.getElementById('countdown-label').textContent;")
          .startswith("On sale"))
    time.sleep(3)
    wd("POST", s + f"/element/{el('#join')}/click", {})
    until("a place", lambda: phase() == "waiting"
          and js("return document.getElementById('place').textContent;").isdigit())
    shot()

    until("the turn", lambda: phase() == "admitted", limit=120)
    wd("POST", s + f"/element/{el('#buy')}/click", {})
    until("confirmed", lambda: phase() == "done")
    shot()

    # The three views side by side, captioned.
    with tempfile.TemporaryDirectory() as tmp:
        cells = []
        for i, (png, caption) in enumerate(zip(shots, ["Before the start", "In line", "Ordered"])):
            path = os.path.join(tmp, f"{i}.png")
            with open(path, "wb") as f:
                f.write(base64.b64decode(png))
            cells.append(f'<figure><img src="{i}.png"><figcaption>{caption}</figcaption></figure>')
        board = os.path.join(tmp, "board.html")
        with open(board, "w") as f:
            f.write("<!doctype html><style>body{margin:0;background:#d5dae1;display:flex;width:max-content;align-items:flex-start;gap:20px;"
                    "padding:20px;font:600 15px system-ui,sans-serif;color:#1d2430}"
                    "figure{margin:0;text-align:center}img{display:block;width:390px;border-radius:12px;"
                    "box-shadow:0 2px 10px rgba(0,0,0,.18);margin-bottom:8px}</style>"
                    + "".join(cells))
        wd("POST", s + "/window/rect", {"width": 1280, "height": 1200})
        wd("POST", s + "/url", {"url": "file://" + board})
        until("the board", lambda: js("return [...document.images].every((i) => i.complete);"))
        # The window as large as the board (its frame added).
        width, height = js("const b = document.body.getBoundingClientRect();"
                           "return [Math.ceil(b.width), Math.ceil(b.height)];")
        fw, fh = js("return [window.outerWidth - window.innerWidth,"
                    " window.outerHeight - window.innerHeight];")
        wd("POST", s + "/window/rect", {"width": width + fw, "height": height + fh})
        png = base64.b64decode(wd("GET", s + "/screenshot"))
    with open(OUT, "wb") as f:
        f.write(png)
    print(f"saved {OUT} ({len(png)} bytes)")
    wd("DELETE", s)
finally:
    serve.terminate()
    driver.terminate()
    serve.wait()
    subprocess.run(f"redis-cli --scan --pattern '{PREFIX}:*' | xargs -r redis-cli del >/dev/null",
                   shell=True)
    subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {PREFIX}"])
