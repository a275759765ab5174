#!/usr/bin/env python3
"""The compose test's client (scripts/compose-test.sh), standard library only.
Every request goes to 127.0.0.1 (the ports compose published there).

  admin PORT METHOD PATH [JSON]        an admin call (ADMIN_TOKEN), prints the body
  burst PORT PRODUCT FIRST LAST RATE OUT
                                       one order per user FIRST..LAST, each with a
                                       JWT signed by JWT_SECRET (HS256, `sub`) and
                                       an Idempotency-Key, at most RATE a second,
                                       16 at a time; one JSON line per order in OUT:
                                       {"user","key","status","order_id"} (status 0:
                                       no answer, the connection refused or cut)
  replay PORT PRODUCT OUT N            sends N accepted orders of OUT again, same
                                       keys: each must answer the same order id
"""
import base64, concurrent.futures, hashlib, hmac, http.client, json, os, sys, threading, time

def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

def jwt(user):
    head = b64(b'{"alg":"HS256","typ":"JWT"}')
    body = b64(json.dumps({"sub": str(user), "exp": int(time.time()) + 3600}).encode())
    msg = f"{head}.{body}"
    sig = hmac.new(os.environ["JWT_SECRET"].encode(), msg.encode(), hashlib.sha256).digest()
    return f"{msg}.{b64(sig)}"

def call(port, method, path, body=None, headers=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()

def order(port, product, user, key):
    try:
        status, raw = call(port, "POST", "/api/orders", {"product_id": product, "quantity": 1},
                           {"Authorization": f"Bearer {jwt(user)}", "Idempotency-Key": key})
    except (OSError, http.client.HTTPException):
        return {"user": user, "key": key, "status": 0, "order_id": None}
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = {}
    return {"user": user, "key": key, "status": status,
            "order_id": answer.get("order_id"), "error": answer.get("error")}

def burst(port, product, first, last, rate, out):
    start = time.monotonic()
    lock = threading.Lock()
    results = []
    def one(i, user):
        # Paced: the i-th order leaves no sooner than i/RATE seconds in.
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        r = order(port, product, user, f"ct-{product}-{user}")
        with lock:
            results.append(r)
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda a: one(*a), enumerate(range(first, last + 1))))
    with open(out, "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    counts = {}
    for r in results:
        label = str(r["status"]) + (f" {r['error']}" if r.get("error") else "")
        counts[label] = counts.get(label, 0) + 1
    print(f"{len(results)} orders in {time.monotonic() - start:.1f}s: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))

def replay(port, product, out, n):
    accepted = [r for r in map(json.loads, open(out)) if r["status"] == 202][:n]
    bad = 0
    for r in accepted:
        again = order(port, product, r["user"], r["key"])
        if again["order_id"] != r["order_id"] or again["status"] not in (200, 202):
            bad += 1
            print(f"replay of {r['key']}: {again}", file=sys.stderr)
    print(f"{len(accepted)} replays, {bad} wrong")
    return bad == 0

def main():
    cmd, port = sys.argv[1], int(sys.argv[2])
    if cmd == "admin":
        method, path = sys.argv[3], sys.argv[4]
        body = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
        status, raw = call(port, method, path, body,
                           {"Authorization": f"Bearer {os.environ['ADMIN_TOKEN']}"})
        print(raw.decode())
        sys.exit(0 if 200 <= status < 300 else 1)
    if cmd == "burst":
        product, first, last, rate, out = sys.argv[3:8]
        burst(port, product, int(first), int(last), float(rate), out)
    elif cmd == "replay":
        product, out, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
        sys.exit(0 if replay(port, product, out, n) else 1)
    else:
        sys.exit(f"unknown command {cmd}")

if __name__ == "__main__":
    main()
