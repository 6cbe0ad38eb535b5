"""Reference token ids for tests/tokenizer_gguf.rs, from an implementation independent of ours.

Our tokenizer is the `tokenizers` crate driven by a tokenizer built from the GGUF's metadata.
This script rebuilds SmolLM2's tokenizer with OpenAI's `tiktoken` (its own regex engine and BPE)
from the same GGUF fields, read by the `gguf` package, and prints the ids of test strings:

    pip install --target /tmp/pylib tiktoken==0.14.0 gguf==0.19.0
    PYTHONPATH=/tmp/pylib python3 tests/reference/tokenizer_ids.py models/SmolLM2-135M-Instruct.Q4_1.gguf

Why tiktoken gives the same BPE: tiktoken merges the adjacent pair whose concatenation has the
lowest rank; Hugging Face BPE merges the pair listed first in `merges`. With rank = token id the
two agree when the id of each merge's result increases with the merge's position and every
multi-byte token is the result of a merge; the script checks both before printing anything.
SmolLM2's pre-tokenizer ("smollm" in the GGUF) isolates every numeric character, then applies
GPT-2's byte-level regex to what lies between; special tokens are matched whole first.
"""
import sys

import regex
import tiktoken
from gguf import GGUFReader

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

STRINGS = [
    "12345 + 678 = 13023, 3.14159 and 2026-11-22",
    "  leading, double  and   triple   spaces  ",
    "line one\nline two\n\n\tindented\r\nend\n",
    "naïve café — 日本語のテキスト 🙂👍🏽",
    "Ünïcödé ½ ² ३४५ Ⅻ ٣",
    "<|im_start|>user\nHi there!<|im_end|>\n",
    "It's what we'll do, they're sure: don't 'quote' me",
    'fn main() {\n    println!("{}", 42);\n}\n',
]


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters (the vocabulary's spelling)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def field_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def main(path):
    reader = GGUFReader(path)
    tokens = field_strings(reader, "tokenizer.ggml.tokens")
    merges = field_strings(reader, "tokenizer.ggml.merges")
    f = reader.fields["tokenizer.ggml.token_type"]
    kinds = [int(f.parts[i][0]) for i in f.data]
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    special = {t: i for i, t in enumerate(tokens) if kinds[i] == 3}  # CONTROL
    ranks = {}
    for i, t in enumerate(tokens):
        if t not in special:
            ranks[bytes(byte_of[c] for c in t)] = i
    # Merge order must equal id order, and every multi-byte token must come from a merge.
    ids = {t: i for i, t in enumerate(tokens)}
    merged = [ids["".join(m.split(" "))] for m in merges]
    assert all(x < y for x, y in zip(merged, merged[1:])), "merge order differs from id order"
    multi = {i for b, i in ranks.items() if len(b) > 1}
    assert multi == set(merged), "a multi-byte token is not the result of a merge"
    enc = tiktoken.Encoding(
        "smollm2-reference", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    specials = regex.compile("(" + "|".join(map(regex.escape, special)) + ")")
    digits = regex.compile(r"(\p{N})")
    for s in STRINGS:
        out = []
        for part in specials.split(s):
            if part in special:
                out.append(special[part])
                continue
            for piece in digits.split(part):
                if piece:
                    out.extend(enc.encode_ordinary(piece))
        print(f"    ({s!r}, &{out}),")


if __name__ == "__main__":
    main(sys.argv[1])
