"""Concurrent clients against an OpenAI-compatible chat server: aggregate tokens/s, and the
p50/p99 of time to first token and of time per output token, at each number of clients.
Measures `infgram serve` (started here with --model) or any server at --url (llama-server
--parallel N on the same GGUF file and threads, for the same table).

    cargo build --release
    cargo run --release --example bench_decode -- prompts > /tmp/prompts.jsonl
    python3 scripts/serve-clients.py --model qwen2.5-coder-0.5b --prompts /tmp/prompts.jsonl \\
        [--clients 1,2,4,8,16] [--max-tokens 128] [--threads 2] [--plain]
    python3 scripts/serve-clients.py --url http://127.0.0.1:8081 --prompts /tmp/prompts.jsonl

Each client sends one streamed greedy chat completion (the prompt set's chats, in turn) and
all of a round start together; infgram reads every prompt whole (`--prompt-cache-mib 0`
unless given: a round repeats earlier rounds' prompts); a round's answers must each equal the same prompt's answer
with one client (greedy: an answer does not depend on the load), which the last column says.
With --plain, infgram is asked for plain decoding ("speculative": false); by default a
greedy chat decodes speculatively. Every request has a time limit; the script stops the
server it started. Standard library only.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_infgram(model, threads, parallel, extra=()):
    """`infgram serve --model MODEL` (and `extra` arguments) on a free port of 127.0.0.1;
    (process, url)."""
    binary = os.path.join(os.path.dirname(__file__), "..", "target", "release", "infgram")
    port = free_port()
    proc = subprocess.Popen([binary, "serve", "--model", model, "--threads", str(threads),
                             "--parallel", str(parallel), "--addr", f"127.0.0.1:{port}",
                             "--backlog", "64", "--quiet", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("the server did not start within 600 s")


def stop_infgram(proc):
    """Stops a server `start_infgram` started (killed past 20 s)."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def chat(url, content, max_tokens, plain, timeout=300):
    """One streamed greedy chat completion of a user's message `content` (or a list of
    messages): (text, tokens, seconds to the first token, seconds from the first token to
    the last, prompt tokens)."""
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    body = {"messages": messages, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if plain:
        body["speculative"] = False
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.time()
    first = last = None
    text, tokens, prompt = [], 0, 0
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.time()
                    first = first or now
                    last = now
                    text.append(piece)
            usage = event.get("usage")
            if usage:
                tokens = usage.get("completion_tokens", tokens)
                prompt = usage.get("prompt_tokens", prompt)
    first = first or time.time()
    last = last or first
    return "".join(text), tokens, first - start, last - first, prompt


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="start infgram serve with this model")
    ap.add_argument("--url", help="or measure the server already at this URL")
    ap.add_argument("--prompts", required=True, help="bench_decode prompts' JSON lines")
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--prompt-cache-mib", type=int, default=0,
                    help="infgram serve's --prompt-cache-mib; 0 (here the default): every "
                         "prompt read whole, as a fresh server reads new prompts (with kept "
                         "caches a round's prompts sent in an earlier round, or by the checks "
                         "of its answers, are not read again)")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    proc = None
    if args.model:
        extra = ["--prompt-cache-mib", str(args.prompt_cache_mib)]
        proc, url = start_infgram(args.model, args.threads, max(counts), extra)
    elif args.url:
        url = args.url.rstrip("/")
    else:
        sys.exit("give --model or --url")
    try:
        alone = {}
        print(f"{args.model or url}, greedy chats of at most {args.max_tokens} tokens, "
              f"{'plain' if args.plain else 'default'} decoding\n")
        print("| clients | tokens | seconds | aggregate tokens/s | × one client | TTFT p50 / p99, s "
              "| TPOT p50 / p99, ms | as alone |")
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        one = None
        for n in counts:
            results = [None] * n
            def client(i):
                results[i] = chat(url, prompts[i % len(prompts)], args.max_tokens, args.plain)
            threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
            t = time.time()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.time() - t
            if any(r is None for r in results):
                sys.exit(f"{n} clients: a request failed")
            tokens = sum(r[1] for r in results)
            rate = tokens / wall
            one = one or rate
            ttft = [r[2] for r in results]
            tpot = [r[3] / (r[1] - 1) * 1e3 for r in results if r[1] > 1]
            same = True
            for i, r in enumerate(results):
                key = i % len(prompts)
                if key not in alone:
                    alone[key] = chat(url, prompts[key], args.max_tokens, args.plain)[0]
                same = same and r[0] == alone[key]
            print(f"| {n} | {tokens} | {wall:.2f} | {rate:.1f} | {rate / one:.2f} | "
                  f"{percentile(ttft, 50):.2f} / {percentile(ttft, 99):.2f} | "
                  f"{percentile(tpot, 50):.1f} / {percentile(tpot, 99):.1f} | "
                  f"{'yes' if same else 'NO'} |")
    finally:
        if proc:
            stop_infgram(proc)


if __name__ == "__main__":
    main()
