"""One conversation of several turns against `infgram serve`, once keeping the caches of
ended generations (`--prompt-cache-mib`, the default 256) and once keeping none (0): each
turn's prompt tokens (the whole conversation so far), time to its first token, and whether
the answers are the same.

    cargo build --release
    cargo run --release --example bench_decode -- prompts > /tmp/prompts.jsonl
    python3 scripts/chat-turns.py --model qwen2.5-coder-0.5b --prompts /tmp/prompts.jsonl \\
        [--turns 6] [--max-tokens 96] [--threads 2]

Each turn's user message is the next of the prompt set's chats; every answer is greedy and
goes into the conversation. Standard library only.
"""
import argparse
import importlib.util
import json
import os

spec = importlib.util.spec_from_file_location(
    "serve_clients", os.path.join(os.path.dirname(__file__), "serve-clients.py"))
clients = importlib.util.module_from_spec(spec)
spec.loader.exec_module(clients)


def conversation(model, threads, kept_mib, prompts, turns, max_tokens):
    """[(prompt tokens, seconds to the first token, answer)] of each turn, on a server of
    its own."""
    proc, url = clients.start_infgram(model, threads, 2, ["--prompt-cache-mib", str(kept_mib)])
    try:
        messages, out = [], []
        for i in range(turns):
            messages.append({"role": "user", "content": prompts[i % len(prompts)]})
            text, _, ttft, _, prompt = clients.chat(url, list(messages), max_tokens, False)
            messages.append({"role": "assistant", "content": text})
            out.append((prompt, ttft, text))
        return out
    finally:
        clients.stop_infgram(proc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True, help="bench_decode prompts' JSON lines")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    none = conversation(args.model, args.threads, 0, prompts, args.turns, args.max_tokens)
    kept = conversation(args.model, args.threads, 256, prompts, args.turns, args.max_tokens)
    print(f"{args.model}, {args.turns} turns, greedy answers of at most {args.max_tokens} "
          f"tokens, {args.threads} threads\n")
    print("| turn | prompt tokens | first token, none kept | first token, kept | × | same answer |")
    print("|---:|---:|---:|---:|---:|---|")
    for i, ((p, cold, a), (_, warm, b)) in enumerate(zip(none, kept)):
        print(f"| {i + 1} | {p} | {cold:.2f} s | {warm:.2f} s | {cold / warm:.1f} | "
              f"{'yes' if a == b else 'NO'} |")


if __name__ == "__main__":
    main()
