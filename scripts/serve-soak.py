"""Many clients connecting and leaving at once against `infgram serve --model M`: for a fixed
time, each of N client threads opens a streamed chat completion, reads a random number of its
events (often none, sometimes all) and drops the connection, then starts again. Every few
seconds the server's resident memory and /health are sampled. At the end the server must
answer /health ok with nothing running or queued and serve a greedy completion equal to the
one it served before the load; the script exits 1 otherwise.

    cargo build --release
    python3 scripts/serve-soak.py --model qwen2.5-coder-0.5b [--clients 200] [--seconds 60]

The server runs on 127.0.0.1 (started as scripts/serve-clients.py starts it: --backlog 64)
and is stopped by the script; every request has a time limit.
Standard library only (Linux: memory from /proc).
"""
import argparse
import http.client
import importlib.util
import json
import os
import random
import subprocess
import threading
import time
import urllib.request

# The server is started as serve-clients.py starts it (its start_infgram).
_spec = importlib.util.spec_from_file_location(
    "serve_clients", os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve-clients.py"))
serve_clients = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_clients)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def health(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        return r.status, json.loads(r.read())


def complete(port, content, max_tokens=24):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def client(port, until, seed, counts, lock):
    """Streamed requests, each read for a random number of lines and dropped, until `until`."""
    rng = random.Random(seed)
    while time.time() < until:
        body = json.dumps({"messages": [{"role": "user", "content": f"Count to {rng.randint(3, 30)}."}],
                           "max_tokens": rng.randint(8, 64), "stream": True,
                           "temperature": rng.choice([0, 0.8]), "seed": rng.randint(0, 999)})
        outcome = "dropped"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v1/chat/completions", body,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                outcome = str(r.status)
            else:
                for _ in range(rng.choice([0, 1, 3, 1000])):
                    if not r.readline():
                        outcome = "finished"
                        break
            conn.close()
        except OSError:
            outcome = "error"
        with lock:
            counts[outcome] = counts.get(outcome, 0) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8)
    args = ap.parse_args()
    proc, url = serve_clients.start_infgram(args.model, args.threads, args.parallel)
    port = int(url.rsplit(":", 1)[1])
    ok = True
    try:
        before = complete(port, "Write a haiku about rust.")
        start_rss = rss_mib(proc.pid)
        print(f"{args.model}: {args.clients} clients for {args.seconds:.0f} s, --parallel "
              f"{args.parallel}, --threads {args.threads}; resident memory {start_rss:.0f} MiB "
              f"after the first request\n")
        print("| s | resident MiB | /health | running | queued |")
        print("|---:|---:|---|---:|---:|")
        counts, lock = {}, threading.Lock()
        until = time.time() + args.seconds
        threads = [threading.Thread(target=client, args=(port, until, i, counts, lock))
                   for i in range(args.clients)]
        t0 = time.time()
        for th in threads:
            th.start()
        peak = start_rss
        while any(th.is_alive() for th in threads):
            time.sleep(5)
            rss = rss_mib(proc.pid)
            peak = max(peak, rss)
            try:
                status, h = health(port)
                state = f"{status} {h.get('status')}"
            except OSError as e:
                status, h, state = 0, {}, f"error {e}"
            print(f"| {time.time() - t0:.0f} | {rss:.0f} | {state} | "
                  f"{h.get('generation_running', '–')} | {h.get('generation_waiting', '–')} |",
                  flush=True)
        for th in threads:
            th.join()
        # The server settles: what the dropped clients held is given back.
        settle = time.time() + 60
        while True:
            status, h = health(port)
            if h.get("generation_running", 0) == 0 and h.get("generation_waiting", 0) == 0 or time.time() > settle:
                break
            time.sleep(0.5)
        after = complete(port, "Write a haiku about rust.")
        end_rss = rss_mib(proc.pid)
        print(f"\nrequests: {dict(sorted(counts.items()))}")
        print(f"resident memory: {start_rss:.0f} MiB before, peak {peak:.0f}, {end_rss:.0f} after")
        print(f"after the load: /health {status} {json.dumps(h)}")
        same = after == before
        print(f"the same greedy answer as before the load: {'yes' if same else 'NO'}")
        ok = status == 200 and h.get("status") == "ok" and same \
            and h.get("generation_running", 0) == 0 and h.get("generation_waiting", 0) == 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
