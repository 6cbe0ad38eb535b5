"""Peak memory of a fixed-order n-gram model over shards held elsewhere, against the same index
here.

`python bench_remote_ngram_memory.py TEXT [ORDER ...]`: indexes TEXT (bytes) once, then for
each order and each side (the index here, or its shards behind an in-process callable: the Ray
router's form without the network) estimates the modified Kneser-Ney model in a fresh process
and prints the growth of its peak resident memory (ru_maxrss) over the index opened, in MB.
Over shards elsewhere each shard sends its suffix groups a page at a time (65,536 suffixes),
so the growth stays within the local build's plus a page per shard.
"""
import json
import resource
import subprocess
import sys
import tempfile

import infgram

CHILD = r"""
import json, resource, sys
import infgram
d, order, side = sys.argv[1], int(sys.argv[2]), sys.argv[3]
local = infgram.Index(f"{d}/idx")
ident = local.identity()
index = local if side == "local" else infgram.Index(
    ask=local.answer_shard_queries, shard_infos=ident["shard_infos"], separator=ident["separator"],
    tokenizer="bytes", fingerprint=ident["tokenizer"]["fingerprint"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = index.ngram_model(order, discount_fallback=[0.5, 1.0, 1.5])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_mb": (after - before) / 1024, "peak_mb": after / 1024}))
"""


def main():
    text_path = sys.argv[1]
    orders = [int(o) for o in sys.argv[2:]] or [5, 12]
    with tempfile.TemporaryDirectory() as d:
        infgram.build_index([text_path], f"{d}/idx", progress=False)
        print("| order | where | peak growth | peak |")
        print("|---:|---|---:|---:|")
        for order in orders:
            for side in ["local", "remote"]:
                out = subprocess.run([sys.executable, "-c", CHILD, d, str(order), side],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out)
                where = "index here" if side == "local" else "shards behind a callable"
                print(f"| {order} | {where} | {r['grew_mb']:.0f} MB | {r['peak_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
