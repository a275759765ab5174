"""A `flashsale serve` of this tree for the scripts that measure or picture
it: on a loopback port of its own, against the local Redis (a key prefix
of its own) and MariaDB (a database of its own), with `AUTH=none`, rate
limits off and a fresh admin token; stopped, its keys and database gone,
when the `with` block ends, whatever happens in it.

    with LocalServe("repcost", env={"PAYMENT_TIMEOUT_SECS": "25"}) as s:
        status, answer = s.call("POST", "/api/admin/products", body, admin=True)
"""
import http.client, json, os, random, secrets, subprocess, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))


def default_binary():
    """This tree's release build, else its debug build."""
    release = os.path.join(TARGET, "release/flashsale")
    return release if os.path.exists(release) else os.path.join(TARGET, "debug/flashsale")


class LocalServe:
    def __init__(self, name, binary=None, args=(), env=None):
        self.binary = binary or default_binary()
        self.port = 18000 + random.randrange(2000)
        self.token = secrets.token_hex(24)
        self.prefix = f"{name}{random.randrange(10**6)}"
        self.db = f"{name}{os.getpid()}"
        self.args, self.env = list(args), dict(env or {})
        self.proc = None

    def __enter__(self):
        env = dict(os.environ, ADMIN_TOKEN=self.token, AUTH="none", LISTEN_ADDR=f"127.0.0.1:{self.port}",
                   REDIS_KEY_PREFIX=self.prefix, DATABASE_URL=f"mysql://root@127.0.0.1:3306/{self.db}",
                   RUST_LOG="warn", RATE_LIMITS="false", **self.env)
        self.proc = subprocess.Popen([self.binary, "serve", *self.args], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    if self.call("GET", "/readyz")[0] == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.1)
            raise RuntimeError(f"{self.binary} serve never got ready")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *_):
        self.proc.terminate()
        self.proc.wait(30)
        keys = subprocess.run(["redis-cli", "--scan", "--pattern", f"{self.prefix}:*"],
                              capture_output=True, text=True).stdout.split()
        for k in range(0, len(keys), 500):
            subprocess.run(["redis-cli", "del", *keys[k:k + 500]], capture_output=True)
        subprocess.run(["mariadb", "-uroot", "-e", f"DROP DATABASE IF EXISTS {self.db}"], check=True)

    def url(self, path=""):
        return f"http://127.0.0.1:{self.port}{path}"

    def call(self, method, path, body=None, headers=None, admin=False):
        """`(status, answer)`: the answer parsed if JSON, else its bytes;
        `body` a string is sent as it is, anything else as JSON."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        h = dict(headers or {})
        data = None
        if body is not None:
            data = body if isinstance(body, str) else json.dumps(body)
            h["Content-Type"] = "application/json"
        if admin:
            h["Authorization"] = f"Bearer {self.token}"
        conn.request(method, path, data, h)
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        return r.status, (json.loads(raw) if raw[:1] in b"{[" else raw)

    def mysql(self, sql):
        return subprocess.run(["mariadb", "-uroot", "-N", "-e", sql, self.db],
                              capture_output=True, text=True, check=True).stdout.strip()
