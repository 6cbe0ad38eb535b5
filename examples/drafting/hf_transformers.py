"""Speculative decoding of a Hugging Face model with infgram's drafts.

    python examples/drafting/hf_transformers.py MODEL INDEX_DIR "prompt"

MODEL is a transformers causal LM (a Hub name or a folder); INDEX_DIR an infgram index built
with the model's tokenizer (`infgram index --tokenizer MODEL`). Prints the greedy output of
plain and speculative decoding (the same text) and both speeds.
"""

import sys
import time

import infgram
from infgram import speculative


class HFStep:
    """A transformers model as `speculative.generate` takes it: scores new tokens against its
    KV cache, and cuts the cache back."""

    def __init__(self, model):
        self.model = model
        self.past = None

    def __call__(self, new_ids):
        import torch

        ids = torch.tensor([list(new_ids)], device=self.model.device)
        with torch.no_grad():
            out = self.model(input_ids=ids, past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0].float().cpu().numpy()

    def rollback(self, length):
        self.past.crop(length)


def main():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, index_dir, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
    tok = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name)
    ids = tok(prompt)["input_ids"]
    drafter = infgram.Drafter(index=infgram.Index(index_dir))
    for label, d in (("plain", None), ("speculative", drafter)):
        t = time.perf_counter()
        out = speculative.generate(HFStep(model), ids, d, max_tokens=128, eos_ids=[tok.eos_token_id])
        secs = time.perf_counter() - t
        print(f"{label}: {len(out) / secs:.1f} tokens/s\n{tok.decode(out)}\n")


if __name__ == "__main__":
    main()
