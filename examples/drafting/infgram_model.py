"""Speculative decoding of infgram's own model in the reference loop, drafted by infgram.

    python examples/drafting/infgram_model.py INDEX_DIR "prompt" [MODEL]

MODEL (default smollm2-135m) is any model `infgram gen --model` takes; INDEX_DIR an infgram
index built with its tokenizer (`infgram index --tokenizer smollm2-135m -o INDEX_DIR FILES`).
`infgram.Model` is the loop's `step`: `model(new_ids)` feeds tokens after its cache and returns
their logits, `model.rollback(n)` cuts the cache. Prints the greedy output of plain and
speculative decoding (the same text), both speeds, and what `Model.generate` (the same
decoding, in Rust) reports for comparison.
"""

import sys
import time

import infgram
from infgram import speculative


def main():
    index_dir, prompt = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "smollm2-135m"
    model = infgram.Model(name, index=index_dir)
    ids = model.prompt_ids(prompt, raw=True)
    drafter = infgram.Drafter(index=infgram.Index(index_dir))
    for label, d in (("plain", None), ("speculative", drafter)):
        model.reset()
        stats = {}
        t = time.perf_counter()
        out = speculative.generate(model, ids, d, max_tokens=128, eos_ids=model.eos_ids, stats=stats)
        secs = time.perf_counter() - t
        print(f"{label}: {len(out) / secs:.1f} tokens/s, {stats['passes']} passes\n{model.detokenize(out)}\n")
    report = model.generate(prompt_ids=ids, max_tokens=128, temperature=0, speculative=True, compare=True)
    print(f"Model.generate: {report['tokens_per_second']:.1f} tokens/s speculative, "
          f"{report['speedup']:.2f}x plain, identical: {report['identical']}")


if __name__ == "__main__":
    main()
