"""A fixed-order n-gram model over shards held elsewhere against the same index here.

`python bench_remote_ngram.py TEXT [ORDER ...]`: indexes the first 90% of TEXT (bytes), opens
it as an index here and as shards behind an in-process callable (`Index(ask=...)`, the Ray
router's form without the network), and for each order estimates the modified Kneser-Ney model
over both and scores the 5,000 characters that follow the indexed part. Prints the seconds of
each and the perplexity, which must be the same.
"""
import sys
import tempfile
import time

import infgram


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    orders = [int(o) for o in sys.argv[2:]] or [3, 5]
    cut = len(text) * 9 // 10
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/train.txt", "w", encoding="utf-8") as f:
            f.write(text[:cut])
        infgram.build_index([f"{d}/train.txt"], f"{d}/idx", progress=False)
        local = infgram.Index(f"{d}/idx")
        ident = local.identity()
        remote = infgram.Index(ask=local.answer_shard_queries, shard_infos=ident["shard_infos"],
                               separator=ident["separator"], tokenizer="bytes",
                               fingerprint=ident["tokenizer"]["fingerprint"], name="idx")
        held = text[cut:cut + 5000]
        for order in orders:
            ppls = set()
            for name, index in [("local index", local), ("shards behind a callable", remote)]:
                t0 = time.perf_counter()
                model = index.ngram_model(order, discount_fallback=[0.5, 1.0, 1.5])
                t1 = time.perf_counter()
                report = model.perplexity(held)
                t2 = time.perf_counter()
                ppls.add(report["ppl"])
                print(f"| {order} | {name} | {t1 - t0:.3f} s | {t2 - t1:.3f} s | {report['ppl']:.6f} |")
            assert len(ppls) == 1, ppls


if __name__ == "__main__":
    main()
