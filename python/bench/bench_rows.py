"""Speed of the batch ∞-gram API (``Index.infgram_rows``) against asking ``infgram_ntd`` of
every prefix, one query at a time, from Python: what a user interpolating their own model
would otherwise do. Prints a table; times are medians of ``--repeat`` runs with the spread.

    python python/bench/bench_rows.py INDEX_DIR TEXT_FILE [--chars 100000] [--repeat 3]

INDEX_DIR: any infgram index (``infgram gen`` builds Shakespeare's in the cache on first run:
``~/.cache/infgram/indexes/``); TEXT_FILE is tokenized with the index's tokenizer.
"""

import argparse
import time

import numpy as np

import infgram


def timed(f, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return out, ts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("index")
    ap.add_argument("text")
    ap.add_argument("--chars", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prefixes", type=int, default=2000, help="prefixes asked one by one")
    args = ap.parse_args()
    ix = infgram.Index(args.index)
    text = open(args.text, encoding="utf-8", errors="replace").read()[-args.chars :]
    toks = np.array(ix.tokenize(text), dtype=np.uint32)
    print(f"{len(toks)} tokens; median of {args.repeat} (min–max), per row")
    print(f"{'method':<34} {'us/row':>8} {'spread':>16} {'ids/row':>8}")
    base = None
    for name, est in [("infgram_rows, infgram", "infgram"), ("infgram_rows, sbis k=2", {"name": "sbis", "k": 2})]:
        rows, ts = timed(lambda: ix.infgram_rows(toks, estimator=est), args.repeat)
        per = [t * 1e6 / len(rows) for t in ts]
        print(f"{name:<34} {per[len(per) // 2]:>8.2f} {per[0]:>7.2f}–{per[-1]:<7.2f} {len(rows.ids) / len(rows):>8.1f}")
        base = base or per[len(per) // 2]
    n = min(args.prefixes, len(toks))

    def one_by_one():
        for j in range(n):
            ix.query({"query_type": "infgram_ntd", "input_ids": toks[max(0, j - 499) : j + 1].tolist()})

    _, ts = timed(one_by_one, args.repeat)
    per = [t * 1e6 / n for t in ts]
    print(f"{'infgram_ntd per prefix (Index.query)':<34} {per[len(per) // 2]:>8.2f} {per[0]:>7.2f}–{per[-1]:<7.2f}")
    print(f"batch rows are {per[len(per) // 2] / base:.0f}x faster than one query per prefix")


if __name__ == "__main__":
    main()
