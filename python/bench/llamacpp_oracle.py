"""llama.cpp's answers on a GGUF file, for infgram to be compared with (the oracle of its K-quant passes).

    python python/bench/llamacpp_oracle.py MODEL.gguf TEXT.txt OUT.json [--threads 1,2]

needs `pip install llama-cpp-python==0.3.36 numpy` (built from its source, about ten minutes;
on a CPU with AMX, ggml's AMX code crashed in a VM: build with `CMAKE_ARGS="-DGGML_NATIVE=OFF
-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON
-DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"`).
Writes OUT.json with, all on llama.cpp's CPU backend and the file's weight types:

* `teacher`: a 1,000-token text (`<bos>` + TEXT.txt's first tokens), llama.cpp's five best
  next tokens and their logits at every position, from one pass over the whole text;
* `greedy`: five prompts (after `<bos>`) and llama.cpp's greedy 128-token continuation of
  each, one token a step;
* `speed`: for each thread count, decode tokens/s (64 greedy steps after a 256-token context,
  best of three runs) and the time of a 1-token and a 16-token pass at depth 256 (medians of 5).

Then `cargo run --release --example bench_model -- infgram --model MODEL.gguf --llamacpp
OUT.json` runs infgram on the same ids and prints agreement and speed side by side.
"""

import argparse
import json
import time

import numpy as np
from llama_cpp import Llama

PROMPTS = [
    "The capital of France is",
    "ROMEO:\nBut soft, what light",
    "def fibonacci(n):\n",
    "The three laws of thermodynamics are",
    "Once upon a time, in a small village by the sea,",
]


def load(path, threads, n_ctx, logits_all, kv_f32=False):
    kv = {"type_k": 0, "type_v": 0} if kv_f32 else {}  # GGML_TYPE_F32
    return Llama(
        **kv,
        model_path=path,
        n_ctx=n_ctx,
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        verbose=False,
    )


def last_logits(llm):
    """The logits of the last token evaluated (a context without `logits_all` keeps only
    that row, and llama-cpp-python no longer copies it into `scores`)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def teacher(path, text, threads, n=1000, top=5, kv_f32=False):
    llm = load(path, threads, 1024 * ((n + 1023) // 1024), True, kv_f32)
    ids = llm.tokenize(text.encode(), add_bos=True)[:n]
    llm.eval(ids)
    scores = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    best = np.argsort(-scores, axis=1)[:, :top]
    logits = np.take_along_axis(scores, best, axis=1)
    return {"ids": ids, "top_ids": best.tolist(), "top_logits": logits.tolist()}


def greedy(path, threads, steps=128, kv_f32=False):
    llm = load(path, threads, 512, False, kv_f32)
    out = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=True)
        llm.reset()
        llm.eval(ids)
        cont = []
        for _ in range(steps):
            nxt = int(np.argmax(last_logits(llm)))
            cont.append(nxt)
            llm.eval([nxt])
        out.append({"prompt": prompt, "ids": ids, "continuation": cont})
    return out


def speed(path, text, threads):
    llm = load(path, threads, 512, False)
    ctx = llm.tokenize(text.encode(), add_bos=True)[:300]
    llm.reset()
    llm.eval(ctx[:256])
    passes = {}
    for k in (1, 16):
        times = []
        for _ in range(5):
            llm.n_tokens = 256  # the next eval drops the cache past 256
            t = time.perf_counter()
            llm.eval(ctx[256 : 256 + k])
            times.append((time.perf_counter() - t) * 1e3)
        passes[k] = sorted(times)[2]
    rates = []
    for _ in range(3):
        llm.n_tokens = 256
        nxt = ctx[256]
        t = time.perf_counter()
        for _ in range(64):
            llm.eval([nxt])
            nxt = int(np.argmax(last_logits(llm)))
        rates.append(64 / (time.perf_counter() - t))
    return {"threads": threads, "tokens_per_s": max(rates), "all_tokens_per_s": rates,
            "k1_ms": passes[1], "k16_ms": passes[16]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--threads", default="1,2", help="thread counts to time, comma-separated")
    args = ap.parse_args()
    text = open(args.text, encoding="utf-8").read()
    result = {
        "model": args.model,
        "teacher": teacher(args.model, text, 2),
        "greedy": greedy(args.model, 2),
        "speed": [speed(args.model, text, int(t)) for t in args.threads.split(",")],
    }
    # The bound on agreement: llama.cpp against itself with its KV cache in f32, not f16.
    f32 = teacher(args.model, text, 2, kv_f32=True)
    same = sum(a[0] == b[0] for a, b in zip(f32["top_ids"], result["teacher"]["top_ids"]))
    result["self_top1"] = same / len(f32["top_ids"])
    result["self_greedy"] = [
        next((i for i, (a, b) in enumerate(zip(x["continuation"], y["continuation"])) if a != b),
             len(x["continuation"]))
        for x, y in zip(greedy(args.model, 2, kv_f32=True), result["greedy"])
    ]
    print(f"llama.cpp against itself with an f32 KV cache: top-1 {100 * result['self_top1']:.1f}%, "
          f"greedy tokens equal {result['self_greedy']} of 128")
    with open(args.out, "w") as f:
        json.dump(result, f)
    for s in result["speed"]:
        print(f"llama.cpp, {s['threads']} thread(s): {s['tokens_per_s']:.1f} tokens/s, "
              f"k=1 {s['k1_ms']:.1f} ms, k=16 {s['k16_ms']:.1f} ms")


if __name__ == "__main__":
    main()
