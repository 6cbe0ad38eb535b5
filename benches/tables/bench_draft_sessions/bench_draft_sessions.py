"""What drafting sessions cost a server: resident memory as `POST /v1/drafts` opens N sessions
(a `request_id` each, a context of T random tokens), measured from /proc.

    python benches/tables/bench_draft_sessions/bench_draft_sessions.py BINARY INDEX [N] [T] [-- SERVE_ARGS…]

BINARY: an `infgram` binary; INDEX: a served index (its vocabulary must hold ids 32..231). The
server runs on 127.0.0.1 (a free port), is asked N times (bounded: each request waits at most
60 s), then stopped. Prints resident memory before and after, per session, and the server's
draft-session gauges where it has them.
"""

import json
import random
import socket
import subprocess
import sys
import time
import urllib.request


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    binary, index = args[0], args[1]
    n = int(args[2]) if len(args) > 2 else 1000
    t = int(args[3]) if len(args) > 3 else 4000
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [binary, "serve", "--addr", f"127.0.0.1:{port}", "--index", f"x={index}", "--quiet", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("the server did not start")
                time.sleep(0.1)
        rng = random.Random(1)
        ctx = lambda: [rng.randrange(32, 232) for _ in range(t)]
        post(url + "/v1/drafts", {"context_ids": ctx(), "max_tokens": 4, "request_id": "warm"})
        before = rss(server.pid)
        t0 = time.time()
        for i in range(n):
            post(url + "/v1/drafts", {"context_ids": ctx(), "max_tokens": 4, "request_id": f"s{i}"})
        seconds = time.time() - t0
        after = rss(server.pid)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        gauges = [l for l in metrics.splitlines() if l.startswith("infgram_draft_session")]
        print(f"{n} sessions of {t} tokens in {seconds:.1f} s: resident {before / 2**20:.0f} MB "
              f"before, {after / 2**20:.0f} MB after, {(after - before) / n / 1024:.0f} KB a session")
        for g in gauges:
            print(" ", g)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
