"""What drafting costs another engine, and how much it drafts.

    python benches/tables/bench_drafter.py INDEX_DIR HELD_OUT_FILE... [--binary target/release/infgram]
        [--model smollm2-135m]

INDEX_DIR: an infgram index in the engine's tokens; HELD_OUT_FILE: texts not in it. Each
request is a 200-token prompt of held-out text followed by its true continuation; with
--model (and --binary), a prompt is the first --prompt-chars characters of a file (cut at a line
end) and its continuation is what the model writes from it, greedy, --max-tokens tokens
(`infgram gen --model M --raw --temperature 0`), so acceptance is a greedy verifier's. The engine's loop is simulated: each step
drafts 16 tokens, and the session is extended by the continuation's tokens the draft got
right plus one (what the verifier keeps). Prints the p50 / p90 of
`draft` and `extend` from Python, of `POST /v1/drafts` on 127.0.0.1 (with `--binary`), and
the mean tokens accepted per verification with the corpus index against prompt lookup alone,
and the tokens kept per step (a step without a draft keeps one: what the engine's loop gains).
"""

import argparse
import json
import os
import statistics
import subprocess
import time
import urllib.request

import infgram


def held_out_requests(index, files, n, prompt_len=200, steps=64):
    """`n` requests from the held-out `files`: a prompt and the text's true continuation."""
    texts = [index.tokenize(open(f, encoding="utf-8", errors="replace").read()) for f in files]
    texts = [t for t in texts if len(t) > prompt_len + steps * 17]
    if not texts:
        raise SystemExit("no held-out file is long enough")
    requests = []
    for r in range(n):
        t = texts[r % len(texts)]
        at = (r * 997) % (len(t) - prompt_len - steps * 17)
        requests.append((t[at: at + prompt_len], t[at + prompt_len: at + prompt_len + steps * 17]))
    return requests


def model_requests(index, files, binary, model, prompt_chars, max_tokens):
    """A request per file: its first `prompt_chars` characters (to a line end) and the model's
    greedy continuation of them, as token ids."""
    requests = []
    for f in files:
        text = open(f, encoding="utf-8", errors="replace").read()
        cut = text.rfind("\n", 0, prompt_chars) + 1 or prompt_chars
        prompt = text[:cut]
        if len(prompt) < 200:
            continue
        out = subprocess.run([binary, "gen", "--model", model, "--raw", "--prompt", prompt, "--temperature", "0",
                              "--max-tokens", str(max_tokens), "--speculative", "--json"],
                             capture_output=True, text=True, check=True)
        report = json.loads(out.stdout)
        requests.append((index.tokenize(prompt), report["token_ids"]))
    if not requests:
        raise SystemExit("no held-out file is long enough")
    return requests


def simulate(drafter, requests, draft_times, extend_times):
    """(mean tokens accepted per verification of a draft, mean tokens kept per step: a step
    with no draft is a plain step that keeps one token)."""
    accepted, verifications, kept_total = 0, 0, 0
    for r, (prompt, truth) in enumerate(requests):
        rid = f"r{r}"
        drafter.start(rid, prompt)
        pos = 0
        while pos < len(truth) - 17:
            t = time.perf_counter()
            d = drafter.draft(rid, 16)
            draft_times.append(time.perf_counter() - t)
            k = 0
            for a, b in zip(d.token_ids, truth[pos:]):
                if a != b:
                    break
                k += 1
            if d.token_ids:
                accepted += k
                verifications += 1
            kept = truth[pos: pos + k + 1]
            t = time.perf_counter()
            drafter.extend(rid, kept)
            extend_times.append(time.perf_counter() - t)
            pos += len(kept)
            kept_total += len(kept)
        drafter.finish(rid)
    return accepted / max(1, verifications), kept_total / max(1, len(draft_times))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("held_out", nargs="+", help="text files not in the index (requests)")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--binary", default=None)
    ap.add_argument("--model", default=None, help="continuations written by this model, greedy (needs --binary)")
    ap.add_argument("--tokenizer", default=None,
                    help="a tokenizer.json for the index (a wheel without `neural` cannot read a GGUF's)")
    ap.add_argument("--prompt-chars", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--corpus-rule", default="sbis", choices=["sbis", "longest_suffix"],
                    help="how the corpus index drafts (the server gets the same)")
    ap.add_argument("--save-requests", default=None,
                    help="write the requests as JSON [[prompt_ids, continuation_ids], ...] "
                         "(bench_drafter_rules reads them: the same protocol in Rust)")
    args = ap.parse_args()
    index = infgram.Index(args.index, tokenizer=args.tokenizer)
    if args.model:
        if not args.binary:
            raise SystemExit("--model needs --binary (the continuations come from `infgram gen`)")
        requests = model_requests(index, args.held_out[: args.requests], args.binary, args.model,
                                  args.prompt_chars, args.max_tokens)
    else:
        requests = held_out_requests(index, args.held_out, args.requests)
    if args.save_requests:
        with open(args.save_requests, "w") as f:
            json.dump(requests, f)
    rows = []
    for label, drafter in (("prompt lookup alone", infgram.Drafter()),
                           ("prompt lookup + corpus index", infgram.Drafter(index=index, corpus_rule=args.corpus_rule))):
        dt, et = [], []
        mean, per_step = simulate(drafter, requests, dt, et)
        rows.append((label, pct(dt, 0.5), pct(dt, 0.9), pct(et, 0.5), pct(et, 0.9), mean, per_step, len(dt)))
    print(f"index {os.path.basename(args.index.rstrip('/'))}: {len(requests)} held-out requests, 16-token drafts\n")
    print("| drafting | draft p50 µs | draft p90 µs | extend p50 µs | extend p90 µs | accepted per verification "
          "| tokens per step | calls |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.2f} | {r[6]:.2f} | {r[7]} |")
    if args.binary:
        server = subprocess.Popen([args.binary, "serve", "--addr", "127.0.0.1:0", "--index", f"ix={args.index}",
                                   "--corpus-rule", args.corpus_rule.replace("_", "-"), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            addr = None
            for _ in range(200):
                line = server.stderr.readline()
                if line.startswith("listening on http://"):
                    addr = line.split("http://", 1)[1].split()[0]
                    break
            times = []
            for r, (prompt, truth) in enumerate(requests[:20]):
                for step in range(10):
                    ctx = prompt + truth[: step * 4]
                    body = json.dumps({"context_ids": ctx, "max_tokens": 16, "request_id": f"h{r}"}).encode()
                    req = urllib.request.Request(f"http://{addr}/v1/drafts", data=body,
                                                 headers={"Content-Type": "application/json"})
                    t = time.perf_counter()
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        resp.read()
                    times.append(time.perf_counter() - t)
            print(f"\nPOST /v1/drafts on 127.0.0.1 (a session per request, whole context each call, "
                  f"{len(times)} calls): p50 {pct(times, 0.5):.0f} µs, p90 {pct(times, 0.9):.0f} µs")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
