"""infgram.engine vs infini_gram.engine, side by side in one process, per query from Python,
on Tiny Shakespeare (byte tokens, one document):

* over an index written by infini-gram's indexer (both engines open the same directory);
* over infgram's own index of the same text (infgram) vs infini-gram's index (infini-gram).

Usage: python bench_engine.py TINYSHAKESPEARE.txt WORKDIR [--queries 2000] [--repeats 5]
Needs infini-gram==2.6.0 (and numpy, for its indexer) beside infgram. Prints a table of
microseconds per query (median of the repeats, with the spread) and the speed-up.
"""

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
import time
import resource
from pathlib import Path


def build_infini_gram(text_bytes, out):
    """infini-gram's index of the text as one document: its tokenize step written here (bytes,
    as its indexer writes them without a tokenizer), its suffix-array step run."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / "table.0").exists():
        return out
    (out / "tokenized.0").write_bytes(b"\xff" + text_bytes)
    (out / "offset.0").write_bytes((0).to_bytes(8, "little"))
    line = (json.dumps({"path": "tinyshakespeare.txt", "linenum": 0, "metadata": {}}) + "\n").encode()
    (out / "metadata.0").write_bytes(line)
    (out / "metaoff.0").write_bytes((0).to_bytes(8, "little"))
    data = out.parent / "empty-data"
    data.mkdir(exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    subprocess.run([sys.executable, "-m", "infini_gram.indexing", "--data_dir", str(data), "--save_dir", str(out),
                    "--token_dtype", "u8", "--cpus", "1", "--mem", "2", "--ulimit", str(nofile)],
                   check=True, capture_output=True)
    return out


def per_query_us(fn, qs, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for q in qs:
            fn(q)
        times.append((time.perf_counter() - t0) / len(qs) * 1e6)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("workdir")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import infgram
    from infgram.engine import InfiniGramEngine as Ours
    from infini_gram.engine import InfiniGramEngine as Theirs

    text = Path(args.text).read_bytes()
    work = Path(args.workdir)
    ig_dir = build_infini_gram(text, work / "infini-gram-index")
    ours_dir = work / "infgram-index"
    if not ours_dir.exists():
        infgram.build_index_from_ids([list(text)], str(ours_dir), 255)
    kw = dict(eos_token_id=0, vocab_size=255, token_dtype="u8")
    theirs = Theirs(index_dir=str(ig_dir), **kw)
    ours_on_theirs = Ours(index_dir=str(ig_dir), **kw)
    ours = Ours(index_dir=str(ours_dir), **kw)

    rng = random.Random(0)
    qs = []
    for _ in range(args.queries):
        p = rng.randrange(len(text) - 120)
        qs.append(list(text[p:p + rng.randint(1, 20)]))
    long_qs = [list(text[p:p + 100]) for p in (rng.randrange(len(text) - 120) for _ in range(args.queries))]
    # The answers agree before anything is timed.
    for q in qs[:300]:
        assert theirs.count(q) == ours.count(q) == ours_on_theirs.count(q), q
    methods = {
        "count (1-20 tokens)": (lambda e: (lambda q: e.count(q)), qs),
        "infgram_ntd (ctx 100)": (lambda e: (lambda q: e.infgram_ntd(q)), long_qs),
        "prob (1-20 tokens)": (lambda e: (lambda q: e.prob(q[:-1], q[-1])), qs),
        "infgram_prob (ctx 100)": (lambda e: (lambda q: e.infgram_prob(q[:-1], q[-1])), long_qs),
    }
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}; {args.queries} queries x {args.repeats} repeats; µs per query, "
          f"median (min-max)")
    print(f"| query | infini-gram | infgram, infini-gram's index | infgram, own index | speed-up (own) | speed-up (theirs) |")
    print("|---|---|---|---|---|---|")
    for name, (make, q) in methods.items():
        t = per_query_us(make(theirs), q, args.repeats)
        a = per_query_us(make(ours_on_theirs), q, args.repeats)
        b = per_query_us(make(ours), q, args.repeats)
        fmt = lambda x: f"{x[0]:.2f} ({x[1]:.2f}-{x[2]:.2f})"
        print(f"| {name} | {fmt(t)} | {fmt(a)} | {fmt(b)} | {t[0] / b[0]:.0f}x | {t[0] / a[0]:.0f}x |")


if __name__ == "__main__":
    main()
