"""The same prompts through Hugging Face transformers on the same GPU: plain greedy decoding and
prompt lookup decoding (`prompt_lookup_num_tokens`), tokens per second per prompt set.

Reads the prompt sets from `bench_decode prompts` (JSON lines on standard input) and the
model from a GGUF file (transformers dequantizes it; needs the `gguf` package). Prints one
Markdown table; prints why and exits 0 where transformers, gguf or a GPU is missing, so that
scripts/device-check.sh goes on to its next step.

    bench_decode prompts | python3 scripts/hf_baseline.py MODEL.gguf [--per-set N]
"""

import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--per-set", type=int, default=3, help="prompts per set (the first N)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    args = ap.parse_args()
    prompts = [json.loads(line) for line in sys.stdin if line.strip()]
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import transformers
    except Exception as e:  # noqa: BLE001 - any import failure means no baseline here
        print(f"transformers baseline: not available here ({e})")
        return
    if not torch.cuda.is_available():
        print("transformers baseline: no GPU visible to PyTorch")
        return
    folder, name = os.path.split(os.path.abspath(args.gguf))
    try:
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, torch_dtype=torch.bfloat16
        ).to("cuda")
    except Exception as e:  # noqa: BLE001
        print(f"transformers baseline: could not load {name} ({e})")
        return
    model.eval()
    gemma_turns = "<start_of_turn>" in tok.get_vocab()
    chat_template = bool(getattr(tok, "chat_template", None))

    def text_of(p):
        if not (p["chat"] and chat_template):
            return p["prompt"]
        if gemma_turns:
            return f"<start_of_turn>user\n{p['prompt']}<end_of_turn>\n<start_of_turn>model\n"
        return f"<|im_start|>user\n{p['prompt']}<|im_end|>\n<|im_start|>assistant\n"

    def run(ids, lookup):
        extra = {"prompt_lookup_num_tokens": 10} if lookup else {}
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=args.max_new_tokens, do_sample=False, **extra
            )
        torch.cuda.synchronize()
        new = out.shape[1] - ids.shape[1]
        return new / (time.perf_counter() - t), out[0, ids.shape[1]:].tolist()

    print(
        f"transformers {transformers.__version__}, PyTorch {torch.__version__}, "
        f"{torch.cuda.get_device_name(0)}, bf16, eager; {name}; greedy, "
        f"{args.max_new_tokens} new tokens at most; the first {args.per_set} prompts of each set\n"
    )
    print("| prompt set | plain tokens/s | prompt lookup tokens/s | ratio (min–max) | identical |")
    print("|---|---:|---:|---:|---:|")
    sets = []
    for p in prompts:
        if p["set"] not in sets:
            sets.append(p["set"])
    for s in sets:
        chosen = [p for p in prompts if p["set"] == s][: args.per_set]
        plain, lookup, ratios, same = [], [], [], 0
        for p in chosen:
            ids = tok(text_of(p), return_tensors="pt").input_ids.to("cuda")
            run(ids[:, :8], False)  # warm-up
            a, out_a = run(ids, False)
            b, out_b = run(ids, True)
            plain.append(a)
            lookup.append(b)
            ratios.append(b / a)
            same += out_a == out_b
        n = len(chosen)
        print(
            f"| {s} | {sum(plain) / n:.1f} | {sum(lookup) / n:.1f} | "
            f"{sum(ratios) / n:.2f}× ({min(ratios):.2f}–{max(ratios):.2f}) | {same}/{n} |"
        )


if __name__ == "__main__":
    main()
