#!/usr/bin/env python3
"""Hostile and broken clients against a running `churn-throttler serve` on 127.0.0.1.

One case per call: `hostile.py CASE --port P --mport M --ca CA [...]`. Each prints its
figures and a last line `CASE: ok ...` or `CASE: FAIL ...`; the exit status is 0 only for
ok. Standard library only (ssl, socket, asyncio, threads); every loop is bounded.
"""
import argparse
import asyncio
import json
import os
import select
import socket
import ssl
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "fixtures", "pod-delete-running.json")


with open(FIXTURE) as _f:
    TEMPLATE = _f.read()


def review(uid, namespace, name, user):
    """A pod DELETE review (tests/fixtures/pod-delete-running.json, renamed)."""
    r = json.loads(TEMPLATE)
    q = r["request"]
    q["uid"], q["namespace"], q["name"] = uid, namespace, name
    q["userInfo"]["username"] = user
    q["oldObject"]["metadata"]["namespace"] = namespace
    q["oldObject"]["metadata"]["name"] = name
    return json.dumps(r).encode()


def context(ca, alpn=("http/1.1",)):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def tls_connect(a, alpn=("http/1.1",), timeout=10):
    raw = socket.create_connection(("127.0.0.1", a.port), timeout=timeout)
    return context(a.ca, alpn).wrap_socket(raw, server_hostname="localhost")


def post(sock, body, path="/validate", keep_alive=True):
    head = (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        + ("" if keep_alive else "Connection: close\r\n")
        + "\r\n"
    )
    sock.sendall(head.encode() + body)
    return read_response(sock)


def read_response(sock):
    """(status, headers text, body bytes) of one HTTP/1.1 response with Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a response head")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, "\n".join(lines[1:]), rest[:length]


def wait_closed(sock, limit):
    """Seconds until the peer closes (EOF or reset), or None if still open after `limit`."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            if not sock.recv(65536):
                return time.monotonic() - start
        except (socket.timeout, TimeoutError):
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return time.monotonic() - start
    return None


def metric(a, name):
    with socket.create_connection(("127.0.0.1", a.mport), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, _, body = read_response(s)
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else 0.0


def result(name, good, text):
    print(f"{name}: {'ok' if good else 'FAIL'}: {text}")
    return 0 if good else 1


# --- cases -------------------------------------------------------------------------------


async def slowloris(a):
    """N TLS connections trickle one header byte per second; each is closed within the
    header timeout; meanwhile another client's reviews keep a p99 under 50 ms."""
    n, limit = a.count, a.timeout
    ctx = context(a.ca)
    closed = []
    ready = []

    async def one(i):
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", a.port, ssl=ctx, server_hostname="localhost"), 30
            )
        except Exception as e:  # noqa: BLE001 (counted as not served)
            closed.append(("connect-failed", str(e)))
            ready.append(i)
            if len(ready) == n:
                connected.set()
            return
        ready.append(i)
        if len(ready) == n:
            connected.set()
        start = time.monotonic()
        request = b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        for k in range(int(limit) + 10):
            try:
                writer.write(request[k % len(request):k % len(request) + 1])
                await writer.drain()
                data = await asyncio.wait_for(reader.read(1024), 1.0)
                if not data:
                    break
            except asyncio.TimeoutError:
                continue
            except Exception:  # noqa: BLE001 (reset: closed)
                break
        else:
            closed.append(("open", time.monotonic() - start))
            writer.close()
            return
        closed.append(("closed", time.monotonic() - start))
        writer.close()

    latencies = []
    connected = threading.Event()

    def others(stop):
        # Measured while every slow connection is open (after their handshakes).
        connected.wait(60)
        s = tls_connect(a)
        body = review("uid-p99", "p99", "p99", "someone-unpaced")
        for _ in range(2000):
            if stop.is_set():
                break
            t = time.monotonic()
            status, _, _ = post(s, body)
            latencies.append((time.monotonic() - t) * 1000)
            if status != 200:
                latencies.append(1e9)
            time.sleep(0.01)
        s.close()

    stop = threading.Event()
    t = threading.Thread(target=others, args=(stop,))
    t.start()
    await asyncio.gather(*(one(i) for i in range(n)))
    stop.set()
    t.join()
    times = [x[1] for x in closed if x[0] == "closed"]
    still = sum(1 for x in closed if x[0] == "open")
    failed = sum(1 for x in closed if x[0] == "connect-failed")
    p99 = pct(latencies, 99)
    print(f"slowloris: {n} connections: {len(times)} closed by the server (max {max(times, default=0):.2f} s, "
          f"median {pct(times, 50):.2f} s after the handshake), {still} still open after {limit + 10:.0f} s, "
          f"{failed} not connected; other client: {len(latencies)} reviews, p50 {pct(latencies, 50):.1f} ms, "
          f"p99 {p99:.1f} ms")
    good = len(times) == n and max(times, default=0) <= limit + 1.5 and p99 < 50 and latencies
    return result("slowloris", good, f"all {n} closed within {limit} s + 1.5 s, p99 {p99:.1f} ms < 50 ms")


def idle_tls(a):
    s = tls_connect(a)
    t = wait_closed(s, a.timeout + 10)
    print(f"idle TLS (handshake, then nothing): closed after {t if t is None else round(t, 2)} s")
    return result("idle-tls", t is not None and t <= a.timeout + 1.5, f"closed within {a.timeout} s + 1.5 s")


def h2_frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_literal(name, value):
    def string(b):
        assert len(b) < 127
        return bytes([len(b)]) + b
    return b"\x00" + string(name.encode()) + string(value.encode())


def idle_h2(a):
    """HTTP/2: one review answered, then the connection stays idle (PINGs answered):
    closed by the idle timeout."""
    s = tls_connect(a, alpn=("h2",))
    if s.selected_alpn_protocol() != "h2":
        return result("idle-h2", False, f"ALPN chose {s.selected_alpn_protocol()}")
    body = review("uid-h2", "h2", "h2", "someone-unpaced")
    headers = b"".join(hpack_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "https"), (":path", "/validate"), (":authority", "localhost"),
        ("content-type", "application/json"), ("content-length", str(len(body)))])
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0) + h2_frame(1, 4, 1, headers)
              + h2_frame(0, 1, 1, body))
    buf = b""
    answered = None
    pings = 0
    start = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - start < a.idle + 20:
        try:
            chunk = s.recv(65536)
        except (socket.timeout, TimeoutError):
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            chunk = b""
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload, buf = buf[9:9 + length], buf[9 + length:]
            if kind == 4 and not flags & 1:
                s.sendall(h2_frame(4, 1, 0))
            elif kind == 6 and not flags & 1:
                pings += 1
                s.sendall(h2_frame(6, 1, 0, payload))
            elif kind == 0 and stream == 1 and flags & 1 and answered is None:
                answered = time.monotonic()
            elif kind == 7:
                pass  # GOAWAY: the close follows
    end = time.monotonic()
    if answered is None:
        return result("idle-h2", False, "the review was not answered")
    idle = end - answered
    print(f"idle HTTP/2 (one review, then idle, {pings} PINGs answered): closed {idle:.2f} s after the answer")
    return result("idle-h2", a.idle - 0.5 <= idle <= a.idle + 1.5, f"closed by the idle timeout ({a.idle} s)")


def partial_body(a):
    s = tls_connect(a)
    s.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{")
    start = time.monotonic()
    try:
        status, _, body = read_response(s)
    except (ConnectionError, ssl.SSLError, OSError) as e:
        status, body = 0, str(e).encode()
    answered = time.monotonic() - start
    closed = wait_closed(s, 5)
    print(f"partial body (Content-Length 1000, 1 byte sent): HTTP {status} after {answered:.2f} s "
          f"({body[:60].decode(errors='replace').strip()}), closed {closed if closed is None else round(closed, 2)} s later")
    return result("partial-body", status == 408 and answered <= a.timeout + 1.5 and closed is not None,
                  f"408 within the body timeout ({a.timeout} s), then closed")


def missing_body(a):
    s = tls_connect(a)
    s.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100000000\r\n\r\n")
    start = time.monotonic()
    status, _, body = read_response(s)
    answered = time.monotonic() - start
    closed = wait_closed(s, 5)
    print(f"declared but missing body (Content-Length 100000000, none sent): HTTP {status} after "
          f"{answered * 1000:.0f} ms, closed {closed if closed is None else round(closed, 2)} s later")
    return result("missing-body", status == 413 and closed is not None, "413 at once, then closed")


def metrics_mid_header(a):
    s = socket.create_connection(("127.0.0.1", a.mport), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    t = wait_closed(s, a.timeout + 10)
    print(f"metrics port, head never finished: closed after {t if t is None else round(t, 2)} s")
    return result("metrics-mid-header", t is not None and t <= a.timeout + 1.5, f"closed within {a.timeout} s + 1.5 s")


def probe_ms(a, path):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", a.mport), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        status, _, _ = read_response(s)
    return status, (time.monotonic() - start) * 1000


def full_port(a):
    """`count` idle TLS connections (the server runs under a small open-file limit): the
    probes answer fast, and a new admission connection is served within the idle timeout."""
    held, shed = [], 0
    for _ in range(a.count):
        try:
            held.append(tls_connect(a, timeout=5))
        except (ConnectionError, ssl.SSLError, OSError, socket.timeout):
            shed += 1
    print(f"full port: {len(held)} idle TLS connections held, {shed} shed by the server")
    probes = [probe_ms(a, p) for p in ("/healthz", "/readyz", "/healthz", "/readyz")]
    print("probes while full: " + ", ".join(f"HTTP {s} in {ms:.1f} ms" for s, ms in probes))
    start = time.monotonic()
    served, tries = None, 0
    body = review("uid-full", "full", "full", "someone-unpaced")
    while time.monotonic() - start < a.timeout + 10:
        tries += 1
        try:
            s = tls_connect(a, timeout=5)
            status, _, _ = post(s, body, keep_alive=False)
            s.close()
            if status == 200:
                served = time.monotonic() - start
                break
        except (ConnectionError, ssl.SSLError, OSError, socket.timeout):
            time.sleep(0.2)
    for s in held:
        s.close()
    print(f"new admission connection served after {served if served is None else round(served, 2)} s ({tries} tries)")
    good = all(s == 200 and ms < 100 for s, ms in probes) and served is not None and served <= a.timeout + 1.5
    return result("full-port", good, f"probes under 100 ms, a new connection served within {a.timeout} s + 1.5 s")


def flood(a):
    """`count` ReplicaSet-controller deletions, one per namespace, over a few keep-alive
    connections; then open reservations, RSS, and what a request after the flood gets."""
    n, conns = a.count, 8
    statuses = {}
    lock = threading.Lock()

    def worker(w):
        s = tls_connect(a)
        for i in range(w, n, conns):
            body = review(f"flood-{i}", f"ns-{i}", f"pod-{i}", "system:serviceaccount:kube-system:replicaset-controller")
            for _ in range(3):
                try:
                    status, _, _ = post(s, body)
                    break
                except (ConnectionError, ssl.SSLError, OSError):
                    s = tls_connect(a)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
        s.close()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - start
    time.sleep(1.5)  # the sweep publishes the gauges every second
    open_reservations = metric(a, "churn_throttler_reservations_open")
    rss_kb = 0
    with open(f"/proc/{a.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    s = tls_connect(a)
    t = time.monotonic()
    status, _, body = post(s, review("after-flood", "prod", "real-pod", "system:serviceaccount:kube-system:replicaset-controller"))
    answered = time.monotonic() - t
    s.close()
    resp = json.loads(body).get("response", {})
    code = resp.get("status", {}).get("code")
    retry = resp.get("status", {}).get("details", {}).get("retryAfterSeconds")
    waits = answered + (retry or 0)
    print(f"flood: {n} deletions in distinct namespaces in {took:.1f} s ({n / took:.0f}/s), answers {statuses}; "
          f"open reservations {open_reservations:.0f} (bound {a.reservations}), RSS {rss_kb / 1024:.1f} MiB "
          f"(bound {a.rss} MiB); the request after: allowed={resp.get('allowed')} code={code} "
          f"retryAfter={retry} s, answered in {answered:.2f} s: waits at most {waits:.1f} s (bound {a.timeout} s)")
    good = (open_reservations <= a.reservations and rss_kb / 1024 <= a.rss and waits <= a.timeout
            and sum(statuses.values()) == n)
    return result("flood", good, "reservations, RSS and the wait after the flood under their bounds")


def holds_and_signal(a):
    """`count` deletions of a hold rule at once; SIGHUP while they are held: every one is
    answered, the process lives."""
    results = []

    def one(i):
        s = tls_connect(a)
        t = time.monotonic()
        try:
            status, _, body = post(s, review(f"hold-{i}", "hold", f"hold-{i}", a.user))
            results.append((status, json.loads(body)["response"]["allowed"], time.monotonic() - t))
        except (ConnectionError, ssl.SSLError, OSError, ValueError) as e:
            results.append((0, str(e), time.monotonic() - t))
        s.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.count)]
    for t in threads:
        t.start()
    time.sleep(0.4)
    held = metric(a, "churn_throttler_held_requests")
    os.kill(a.pid, 1)  # SIGHUP
    for t in threads:
        t.join()
    time.sleep(0.5)
    alive = os.path.exists(f"/proc/{a.pid}") and "zombie" not in open(f"/proc/{a.pid}/status").read()
    answered = sum(1 for s, ok, _ in results if s == 200 and ok is True)
    longest = max((x[2] for x in results), default=0)
    print(f"SIGHUP with {held:.0f} requests held: process alive={alive}; {answered}/{a.count} answered allowed "
          f"(longest {longest:.2f} s)")
    return result("sighup", alive and held > 0 and answered == a.count, "alive, every held request answered")


def abandoned_hold(a):
    """One deletion takes the rule's only slot of the window; a second is held until the
    next window and its client goes away; a third must get the freed slot (held until
    then, not pushed a window further and refused)."""
    s = tls_connect(a)
    status, _, body = post(s, review("ab-1", "ab", "ab-1", a.user))
    s.close()
    first = json.loads(body)["response"]["allowed"]
    s2 = tls_connect(a)
    b2 = review("ab-2", "ab", "ab-2", a.user)
    s2.sendall((f"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(b2)}\r\n\r\n").encode() + b2)
    time.sleep(1.0)
    held = metric(a, "churn_throttler_held_requests")
    s2.close()  # the client goes away mid-hold
    time.sleep(0.5)
    s3 = tls_connect(a)
    t = time.monotonic()
    status, _, body = post(s3, review("ab-3", "ab", "ab-3", a.user))
    waited = time.monotonic() - t
    s3.close()
    resp = json.loads(body)["response"]
    print(f"abandoned hold: first allowed={first}; second held ({held:.0f} held) and abandoned after 1 s; "
          f"third: allowed={resp['allowed']} after {waited:.2f} s (window {a.timeout} s)")
    return result("abandoned-hold", first is True and held >= 1 and resp["allowed"] is True and waited < a.timeout,
                  "the third request got the abandoned slot, inside the window")


def log_uid(a):
    """A throttled review whose uid holds a newline, ESC and NUL; the log is checked by the script."""
    uid = "evil\nlevel=ERROR forged\x1b[31m\x00end"
    s = tls_connect(a)
    statuses = []
    for i in range(a.count):
        status, _, body = post(s, review(uid, "logs", f"log-{i}", a.user))
        statuses.append((status, json.loads(body)["response"].get("allowed")))
    s.close()
    print(f"log: {a.count} reviews with a forged uid sent, answers {sorted(set(statuses))}")
    return result("log-uid-sent", any(ok is False for _, ok in statuses), "at least one throttled (logged at debug)")


def evict_h2(a):
    """An HTTP/2 connection completes a review and stays idle (PINGs answered); then
    `count` HTTP/1.1 connections from the same address each complete a review and stay
    open, filling the address's share: the HTTP/2 one, idle longest, is evicted with a
    GOAWAY before the close, and every newer connection stays."""
    s = tls_connect(a, alpn=("h2",))
    body = review("uid-evict-h2", "eh2", "eh2", "someone-unpaced")
    headers = b"".join(hpack_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "https"), (":path", "/validate"), (":authority", "localhost"),
        ("content-type", "application/json"), ("content-length", str(len(body)))])
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0) + h2_frame(1, 4, 1, headers)
              + h2_frame(0, 1, 1, body))
    buf, answered, goaway, closed = b"", False, None, False

    def pump(limit, until_closed=False):
        nonlocal buf, answered, goaway, closed
        end = time.monotonic() + limit
        s.settimeout(min(0.2, limit))
        while time.monotonic() < end and not closed:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, TimeoutError):
                if answered and not until_closed:
                    return
                continue
            except (ConnectionError, ssl.SSLError, OSError):
                chunk = b""
            if not chunk:
                closed = True
                return
            buf += chunk
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                kind, flags = buf[3], buf[4]
                stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                payload, buf = buf[9:9 + length], buf[9 + length:]
                if kind == 4 and not flags & 1:
                    s.sendall(h2_frame(4, 1, 0))
                elif kind == 6 and not flags & 1:
                    s.sendall(h2_frame(6, 1, 0, payload))
                elif kind == 0 and stream == 1 and flags & 1:
                    answered = True
                elif kind == 7 and goaway is None:
                    goaway = int.from_bytes(payload[4:8], "big")  # error code

    pump(5)
    if not answered:
        return result("evict-h2", False, "the HTTP/2 review was not answered")
    newer, newer_failed = [], 0
    for i in range(a.count):
        try:
            c = tls_connect(a)
            status, _, _ = post(c, review(f"uid-eh1-{i}", "eh1", f"eh1-{i}", "someone-unpaced"))
            newer.append(c)
        except (ConnectionError, ssl.SSLError, OSError):
            newer_failed += 1
        pump(0.01)
        if closed:
            break
    pump(2, until_closed=True)
    # A closed one is readable (EOF); the open ones have nothing to read.
    readable, _, _ = select.select(newer, [], [], 0.1)
    still = len(newer) - len(readable)
    for c in newer:
        c.close()
    print(f"evict HTTP/2: after {len(newer)} newer HTTP/1.1 connections that completed a review "
          f"({newer_failed} failed): GOAWAY {'error code ' + str(goaway) if goaway is not None else 'not seen'}, "
          f"closed={closed}; {still} of the newer ones still open")
    good = goaway == 0 and closed and newer_failed == 0 and still == len(newer)
    return result("evict-h2", good, "the idle HTTP/2 connection got GOAWAY (NO_ERROR) and was closed; the newer stayed")


def proc_figures(pid):
    """(RSS MiB, open fds) of the server process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def metric_series(a, name):
    """{labels text: value} of every series of `name`."""
    with socket.create_connection(("127.0.0.1", a.mport), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, _, body = read_response(s)
    out = {}
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out


async def conn_flood(a):
    """`count` idle TLS connections to the admission port and `mcount` idle plain ones to
    the metrics port, from `sources` loopback addresses (127.0.0.1 alone, or 127.0.0.2
    and up), each reopened when the server closes it (the attacker reconnects), for
    `duration` s. Meanwhile a fresh client (127.0.0.1, a new connection per round) sends
    reviews, the probes are asked, and `holds` requests are held in flight by a hold
    rule: every review answered within `latency` ms at p99, every probe 200, every held
    request answered, evictions counted, RSS and fds bounded."""
    ctx = context(a.ca)
    # Until every connection was opened once (at most 30 s), then `duration` s more.
    state = {"deadline": time.monotonic() + 30 + a.duration}
    if a.sources == 1:
        sources = ["127.0.0.1"]
    else:
        sources = [f"127.0.0.{i}" for i in range(2, 2 + a.sources)]
    opened = {"admission": 0, "metrics": 0}
    open_now = {"admission": 0, "metrics": 0}
    peak = {"admission": 0, "metrics": 0}
    closed_by_server = {"admission": 0, "metrics": 0}
    latencies, connects, probes, held = [], [], [], []
    figures = []
    started = threading.Event()
    gate = asyncio.Semaphore(64)  # handshakes at once, so the client side keeps up

    async def one(i, port_name):
        src = sources[i % len(sources)]
        port = a.port if port_name == "admission" else a.mport
        while time.monotonic() < state["deadline"]:
            try:
                async with gate:
                    reader, writer = await asyncio.wait_for(asyncio.open_connection(
                        "127.0.0.1", port, local_addr=(src, 0),
                        **({"ssl": ctx, "server_hostname": "localhost"} if port_name == "admission" else {})), 10)
            except (OSError, asyncio.TimeoutError, ssl.SSLError):
                await asyncio.sleep(0.2)
                continue
            opened[port_name] += 1
            if opened["admission"] + opened["metrics"] == a.count + a.mcount:
                state["deadline"] = time.monotonic() + a.duration
                started.set()
            open_now[port_name] += 1
            peak[port_name] = max(peak[port_name], open_now[port_name])
            try:
                left = state["deadline"] - time.monotonic()
                data = await asyncio.wait_for(reader.read(1), max(left, 0.01))
                if not data:
                    closed_by_server[port_name] += 1
            except asyncio.TimeoutError:
                pass
            except (OSError, ssl.SSLError):
                closed_by_server[port_name] += 1
            finally:
                open_now[port_name] -= 1
                writer.close()
            # The attacker reconnects; a short pause keeps this client's CPU bounded, a
            # longer one until every connection was opened once, so the first opens
            # are not starved by the reconnects.
            await asyncio.sleep(0.2 if started.is_set() else 1.0)


    def fresh():
        started.wait(40)
        body = review("uid-fresh", "fresh", "fresh", "someone-unpaced")
        while time.monotonic() < state["deadline"] - 0.3:
            t = time.monotonic()
            try:
                raw = socket.create_connection(("127.0.0.1", a.port), timeout=10,
                                               source_address=("127.0.0.1", 0))
                s = context(a.ca).wrap_socket(raw, server_hostname="localhost")
                connects.append((time.monotonic() - t) * 1000)
                for _ in range(5):
                    t = time.monotonic()
                    status, _, _ = post(s, body)
                    latencies.append((time.monotonic() - t) * 1000 if status == 200 else 1e9)
                s.close()
            except (ConnectionError, ssl.SSLError, OSError) as e:
                latencies.append(1e9)
                print(f"fresh client: {e}")
            for path in ("/healthz", "/readyz"):
                try:
                    probes.append(probe_ms(a, path))
                except (ConnectionError, OSError) as e:
                    probes.append((0, 0.0))
                    print(f"probe {path}: {e}")
            figures.append(proc_figures(a.pid))
            time.sleep(0.2)

    def holds():
        started.wait(40)
        time.sleep(0.5)
        def one(i):
            try:
                s = tls_connect(a)
                status, _, body = post(s, review(f"flood-hold-{i}-{time.time()}", "hold", f"fh-{i}", a.user))
                held.append(status == 200 and json.loads(body)["response"]["allowed"] is True)
                s.close()
            except (ConnectionError, ssl.SSLError, OSError, ValueError) as e:
                held.append(False)
                print(f"held request {i}: {e}")
        ts = [threading.Thread(target=one, args=(i,)) for i in range(a.holds)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    evicted_before = metric_series(a, "churn_throttler_connections_evicted_total")
    threads = [threading.Thread(target=fresh), threading.Thread(target=holds)]
    for t in threads:
        t.start()
    tasks = [one(i, "admission") for i in range(a.count)] + [one(i, "metrics") for i in range(a.mcount)]

    async def mark():
        if a.count + a.mcount == 0:
            state["deadline"] = time.monotonic() + a.duration
            started.set()

    await asyncio.gather(mark(), *tasks)
    for t in threads:
        t.join()
    evicted = {k: v - evicted_before.get(k, 0) for k, v in
               metric_series(a, "churn_throttler_connections_evicted_total").items()}
    evicted = {k: v for k, v in evicted.items() if v}
    refused = metric_series(a, "churn_throttler_connections_refused_total")
    ev_adm = sum(v for k, v in evicted.items() if 'port="admission"' in k)
    ev_met = sum(v for k, v in evicted.items() if 'port="metrics"' in k)
    rss = max((f[0] for f in figures), default=0)
    fds = max((f[1] for f in figures), default=0)
    p50, p99 = pct(latencies, 50), pct(latencies, 99)
    bad_probes = [p for p in probes if p[0] != 200]
    print(f"flood from {len(sources)} address(es), held {a.duration:.0f} s after every connection was "
          f"opened once: admission {opened['admission']} "
          f"TLS connections opened ({a.count} at once asked, peak {peak['admission']} open, "
          f"{closed_by_server['admission']} closed by the server), metrics {opened['metrics']} opened "
          f"({a.mcount} asked, peak {peak['metrics']}, {closed_by_server['metrics']} closed by the server)")
    print(f"  fresh client: {len(latencies)} reviews, p50 {p50:.1f} ms, p99 {p99:.1f} ms; connect+handshake "
          f"p50 {pct(connects, 50):.1f} ms, max {max(connects, default=0):.1f} ms; probes: {len(probes)}, "
          f"{len(bad_probes)} not 200, max {max((p[1] for p in probes), default=0):.1f} ms; "
          f"held in flight: {sum(held)}/{len(held)} answered allowed")
    print(f"  server: peak RSS {rss:.1f} MiB (bound {a.rss}), peak fds {fds} (bound {a.fds}); evicted "
          f"during this flood {evicted}; refused {refused}")
    good = (latencies and p99 <= a.latency and probes and not bad_probes and len(held) == a.holds
            and all(held) and rss <= a.rss and fds <= a.fds and (ev_adm > 0 or a.count == 0)
            and (ev_met > 0 or a.mcount == 0))
    return result("conn-flood", good, f"reviews p99 <= {a.latency} ms, probes 200, held answered, "
                  "evictions counted, RSS and fds bounded")


def rapid_reset(a):
    """HTTP/2 rapid reset for `duration` s: HEADERS then RST_STREAM, stream after stream,
    reconnecting when the server sends GOAWAY. The script counts the log lines."""
    headers = b"".join(hpack_literal(k, v) for k, v in [
        (":method", "POST"), (":scheme", "https"), (":path", "/validate"), (":authority", "localhost")])
    deadline = time.monotonic() + a.duration
    streams = conns = 0
    while time.monotonic() < deadline:
        try:
            s = tls_connect(a, alpn=("h2",))
        except (ConnectionError, ssl.SSLError, OSError):
            time.sleep(0.05)
            continue
        conns += 1
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0))
        sid = 1
        try:
            while time.monotonic() < deadline and sid < 2**30:
                batch = b""
                for _ in range(50):
                    batch += h2_frame(1, 4, sid, headers) + h2_frame(3, 0, sid, struct.pack(">I", 8))
                    sid += 2
                s.sendall(batch)
                streams += 50
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        s.close()
    print(f"rapid reset: {streams} streams opened and reset over {conns} connections in {a.duration:.0f} s")
    return result("rapid-reset", streams > 0, "sent")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mport", type=int, required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--pid", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3.0)
    p.add_argument("--idle", type=float, default=4.0)
    p.add_argument("--reservations", type=float, default=0)
    p.add_argument("--rss", type=float, default=0)
    p.add_argument("--user", default="system:serviceaccount:test:holder")
    p.add_argument("--mcount", type=int, default=0)
    p.add_argument("--sources", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--holds", type=int, default=5)
    p.add_argument("--latency", type=float, default=100.0)
    p.add_argument("--fds", type=float, default=0)
    a = p.parse_args()
    cases = {
        "slowloris": lambda: asyncio.run(slowloris(a)),
        "idle-tls": lambda: idle_tls(a),
        "idle-h2": lambda: idle_h2(a),
        "partial-body": lambda: partial_body(a),
        "missing-body": lambda: missing_body(a),
        "metrics-mid-header": lambda: metrics_mid_header(a),
        "full-port": lambda: full_port(a),
        "flood": lambda: flood(a),
        "sighup": lambda: holds_and_signal(a),
        "abandoned-hold": lambda: abandoned_hold(a),
        "log-uid": lambda: log_uid(a),
        "conn-flood": lambda: asyncio.run(conn_flood(a)),
        "rapid-reset": lambda: rapid_reset(a),
        "evict-h2": lambda: evict_h2(a),
    }
    sys.exit(cases[a.case]())


if __name__ == "__main__":
    main()
