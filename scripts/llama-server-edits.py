"""llama.cpp's server on the conversations of infgram's code-edit benchmark: plain decoding and
its own n-gram drafting (`--spec-type ngram-simple`, `ngram-map-k`), greedy, the same GGUF file
and threads, one request at a time. The baseline of BENCHMARKS.md's "Code edits" table.

    cargo run --release --example bench_decode -- edits --dump /tmp/edits.jsonl
    python3 scripts/llama-server-edits.py LLAMA_SERVER MODEL.gguf /tmp/edits.jsonl [THREADS] [MAX_TOKENS] [SETTINGS]

SETTINGS: a comma-separated subset of plain, ngram-simple, ngram-map-k (default: all three;
plain is always run, as the baseline).

For each setting, starts `llama-server -m MODEL -t THREADS --jinja` (the model's own chat
template) on 127.0.0.1, sends every conversation to /v1/chat/completions (temperature 0,
`max_tokens`), reads the generation speed from the answer's `timings.predicted_per_second`,
and stops the server. Prints, per set, tokens/s of each setting, the speed-up of each drafting
setting over plain decoding (geometric mean over tasks), and how many answers were the same
text as plain decoding's.
"""
import json
import math
import socket
import subprocess
import sys
import time
import urllib.request

SETTINGS = [("plain", []), ("ngram-simple", ["--spec-type", "ngram-simple"]),
            ("ngram-map-k", ["--spec-type", "ngram-map-k"])]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_setting(server, model, threads, extra, tasks, max_tokens):
    port = free_port()
    proc = subprocess.Popen([server, "-m", model, "-t", str(threads), "-tb", str(threads), "--jinja",
                             "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-np", "1",
                             "--no-webui", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        out = []
        for task in tasks:
            body = json.dumps({"messages": task["messages"], "temperature": 0, "max_tokens": max_tokens,
                               "seed": 0}).encode()
            req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=1200) as r:
                answer = json.loads(r.read())
            out.append((answer["choices"][0]["message"]["content"], answer["timings"]["predicted_per_second"],
                        answer["usage"]["completion_tokens"]))
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    server, model, path = sys.argv[1], sys.argv[2], sys.argv[3]
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    max_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 384
    names = set(sys.argv[6].split(",")) if len(sys.argv) > 6 else {name for name, _ in SETTINGS}
    settings = [(name, extra) for name, extra in SETTINGS if name in names or name == "plain"]
    tasks = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    results = {name: run_setting(server, model, threads, extra, tasks, max_tokens) for name, extra in settings}
    print(f"llama-server, {model}, {threads} threads, greedy, at most {max_tokens} tokens")
    print("| set | setting | tasks | tokens/s | speed-up over plain, geometric mean (min–max) | same text as plain |")
    print("|---|---|---:|---:|---:|---:|")
    for s in sorted({t["set"] for t in tasks}, key=lambda x: x != "code edits"):
        idx = [i for i, t in enumerate(tasks) if t["set"] == s]
        for name, _ in settings:
            tps = [results[name][i][1] for i in idx]
            ratios = [results[name][i][1] / results["plain"][i][1] for i in idx]
            same = sum(results[name][i][0] == results["plain"][i][0] for i in idx)
            geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
            print(f"| {s} | {name} | {len(idx)} | {sum(tps) / len(tps):.1f} | {geo:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) "
                  f"| {same}/{len(idx)} |")


if __name__ == "__main__":
    main()
