"""infgram.ray on a local three-node Ray cluster (127.0.0.1; the nodes share this machine's
cores), against the same work on one process, measured in one run:

* build: ``infgram.ray.build`` with N slices vs ``infgram.build_index`` of the same input (the
  builder of ``infgram index``), wall time and each slice's own build time (what predicts a
  real cluster, where slices build on their own nodes);
* query overhead: ``infgram.ray.Engine`` over the slices vs ``InfiniGramEngine`` over the same
  slice directories in this process: count and infgram_ntd latency, p50 and p99, and the time
  the router adds per round trip (count takes one, infgram_ntd two);
* generation: SBIS (with and without the copy guard) through ``Router.index().generate`` vs
  ``infgram.Index.generate`` on one index of the same documents (the same tokens: tested);
* HTTP: the Ray Serve deployment (``serve_app``) vs ``infgram serve`` on one index of the same
  documents, requests per second from 4 client threads.

Usage: python bench_ray.py TEXT WORKDIR [--slices 3] [--copies 1] [--queries 500]
       [--repeats 3] [--infgram target/release/infgram]
TEXT: a text file, cut at blank lines into documents (Tiny Shakespeare: its speeches),
written as JSON lines (``--copies`` times, for a larger build). Prints tables (median of the
repeats, min–max).
"""

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every address on 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import infgram  # noqa: E402
import infgram.ray as iray  # noqa: E402
from infgram.engine import InfiniGramEngine  # noqa: E402


def write_docs(text_path, out, copies):
    text = Path(text_path).read_text(encoding="utf-8")
    docs = [d.strip() for d in text.split("\n\n") if d.strip()]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for c in range(copies):
            for i, d in enumerate(docs):
                f.write(json.dumps({"text": d, "i": i, "copy": c}) + "\n")
    return docs


def spread(xs):
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def latencies_ms(fn, qs):
    out = []
    for q in qs:
        t0 = time.perf_counter()
        fn(q)
        out.append((time.perf_counter() - t0) * 1e3)
    out.sort()
    return out[len(out) // 2], out[min(len(out) - 1, int(len(out) * 0.99))]


def ray_floor(n, calls, repeats):
    """p50 / p99 of a no-op method on `n` actors (and on one), plain and compiled."""

    @ray.remote(num_cpus=0)
    class Echo:
        def f(self, x):
            return x

    actors = [Echo.remote() for _ in range(n)]
    ray.get([a.f.remote(0) for a in actors])
    tries = {
        "1 actor": lambda _: ray.get(actors[0].f.remote(["q"])),
        f"{n} actors": lambda _: ray.get([a.f.remote(["q"]) for a in actors]),
    }
    compiled = None
    try:
        from ray.dag import InputNode, MultiOutputNode

        with InputNode() as inp:
            dag = MultiOutputNode([a.f.bind(inp) for a in actors])
        compiled = dag.experimental_compile()
        tries[f"{n} actors, compiled graph"] = lambda _: ray.get(compiled.execute(["q"]))
    except Exception as e:  # reported, not raised: compiled graphs are optional
        print(f"(compiled graphs unavailable: {e})")
    out = {}
    for name, fn in tries.items():
        runs = [latencies_ms(fn, range(calls)) for _ in range(repeats)]
        out[name] = ([r[0] for r in runs], [r[1] for r in runs])
    if compiled is not None:
        compiled.teardown()
    for a in actors:
        ray.kill(a)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        return r.status


def throughput(port, bodies, threads=4):
    errors = []

    def client(part):
        for b in part:
            try:
                if post(port, b) != 200:
                    errors.append(b)
            except Exception as e:  # counted, not raised: a benchmark reports
                errors.append(e)

    parts = [bodies[i::threads] for i in range(threads)]
    ts = [threading.Thread(target=client, args=(p,)) for p in parts]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(bodies) / (time.perf_counter() - t0), len(errors)


def wait_http(port, deadline_s=60):
    body = json.dumps({"query_type": "count", "query": "a"}).encode()
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            if post(port, body) == 200:
                return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"nothing answered on 127.0.0.1:{port}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("workdir")
    ap.add_argument("--slices", type=int, default=3)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--gen-tokens", type=int, default=200)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--infgram", default="target/release/infgram")
    args = ap.parse_args()
    work = Path(args.workdir)
    data = work / "data" / "docs.jsonl"
    docs = write_docs(args.text, data, args.copies)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"{len(docs) * args.copies} documents, {data.stat().st_size / 1e6:.2f} MB")

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    c.wait_for_nodes()
    try:
        run(args, work, data, docs)
    finally:
        ray.shutdown()
        c.shutdown()


def run(args, work, data, docs):
    # Build.
    one_s, ray_s, slice_s = [], [], []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        infgram.build_index([str(data)], str(work / "one"), progress=False, overwrite=True)
        one_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        m = iray.build([str(data)], str(work / "sharded"), shards=args.slices, overwrite=True)
        ray_s.append(time.perf_counter() - t0)
        slice_s.append(max(json.load(open(s["dir"] + ".json"))["summary"]["seconds"]
                           for s in m["slices"]))
    print(f"\nbuild ({args.slices} slices on 3 local nodes), seconds, median (min–max) of "
          f"{args.repeats}:")
    print(f"| one index | Ray, {args.slices} slices | ratio | slowest slice's own build |")
    print("|---|---|---|---|")
    ratio = statistics.median(ray_s) / statistics.median(one_s)
    print(f"| {spread(one_s)} | {spread(ray_s)} | {ratio:.2f}× | {spread(slice_s)} |")

    # Ray's own floor: a no-op method of one actor per slice, plain and as a compiled graph.
    floor = ray_floor(len(m["slices"]), args.queries, args.repeats)
    print(f"\nRay's floor on this machine: a no-op round trip to {len(m['slices'])} actors, ms, "
          f"median of {args.repeats} (min–max):")
    print("| call | p50 | p99 |")
    print("|---|---|---|")
    for name, (p50, p99) in floor.items():
        print(f"| {name} | {spread(p50)} | {spread(p99)} |")

    # Queries.
    width = m["token_width"]
    dirs = [s["dir"] for s in m["slices"]]
    local = InfiniGramEngine(dirs, eos_token_id=10, token_dtype=f"u{8 * width}")
    rng = random.Random(0)
    qs = []
    for _ in range(args.queries):
        d = rng.choice(docs).encode()
        i = rng.randrange(max(1, len(d) - 8))
        qs.append(list(d[i:i + rng.randint(1, 8)]))
    print(f"\nquery latency, ms ({args.queries} queries, {len(dirs)} shards), median of "
          f"{args.repeats} runs (min–max):")
    print("| query | in process p50 | p99 | Ray router p50 | p99 | added per round trip (p50) |")
    print("|---|---|---|---|---|---|")
    with iray.Engine(m, eos_token_id=10) as e:
        for name, trips in [("count", 1), ("infgram_ntd", 2)]:
            rows = [[], [], [], []]
            for _ in range(args.repeats):
                a = latencies_ms(getattr(local, name), qs)
                b = latencies_ms(getattr(e, name), qs)
                for k, v in enumerate(a + b):
                    rows[k].append(v)
            added = [(b - a) / trips for a, b in zip(rows[0], rows[2])]
            print(f"| {name} | {spread(rows[0])} | {spread(rows[1])} | {spread(rows[2])} | "
                  f"{spread(rows[3])} | {spread(added)} |")

        # Generation.
        print(f"\nSBIS generation, {args.gen_tokens} tokens, tokens/s, median of {args.repeats} "
              f"(min–max):")
        print("| guard | one index in process | Ray router | ratio | same tokens |")
        print("|---|---|---|---|---|")
        one = infgram.Index(str(work / "one"))
        remote = e.router.index()
        for guard in [None, 16]:
            rates, same = ([], []), True
            for r in range(args.repeats):
                kw = dict(max_tokens=args.gen_tokens, seed=r, guard=guard)
                outs = []
                for k, gen in enumerate([one.generate, remote.generate]):
                    t0 = time.perf_counter()
                    out = gen("ROMEO:", **kw)
                    rates[k].append(len(out["tokens"]) / (time.perf_counter() - t0))
                    outs.append(out)
                same = same and outs[0] == outs[1]
            ratio = statistics.median(rates[1]) / statistics.median(rates[0])
            print(f"| {guard or 'none'} | {spread(rates[0])} | {spread(rates[1])} | "
                  f"{ratio:.4f}× | {same} |")

    # HTTP.
    from ray import serve

    bodies = [json.dumps({"query_type": rng.choice(["count", "infgram_ntd"]),
                          "query_ids": q}).encode() for q in qs]
    bodies = (bodies * (args.requests // len(bodies) + 1))[:args.requests]
    port = free_port()
    server = subprocess.Popen([args.infgram, "serve", "--index", f"one={work / 'one'}",
                               "--addr", f"127.0.0.1:{port}", "--quiet"])
    try:
        wait_http(port)
        ours = [throughput(port, bodies) for _ in range(args.repeats)]
    finally:
        server.terminate()
        server.wait(timeout=30)
    sport = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": sport})
    try:
        serve.run(iray.serve_app(m), name="infgram", route_prefix="/")
        wait_http(sport)
        theirs = [throughput(sport, bodies) for _ in range(args.repeats)]
    finally:
        serve.shutdown()
    print(f"\nHTTP, requests/s from 4 client threads ({len(bodies)} requests, count and "
          f"infgram_ntd), median of {args.repeats} (min–max):")
    print("| infgram serve (one index) | Ray Serve (3 slices) | ratio | errors |")
    print("|---|---|---|---|")
    r1, r2 = [x[0] for x in ours], [x[0] for x in theirs]
    errors = sum(x[1] for x in ours + theirs)
    print(f"| {spread(r1)} | {spread(r2)} | {statistics.median(r2) / statistics.median(r1):.3f}× "
          f"| {errors} |")


if __name__ == "__main__":
    main()
