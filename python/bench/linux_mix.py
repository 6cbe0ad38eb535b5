"""The Linux interpolation protocol (BENCHMARKS.md, "Interpolation at scale").

Reference: Debian's Linux 6.1 source tree (`apt-get install linux-source-6.1`, then
`tar xf /usr/src/linux-source-6.1.tar.xz -C DIR`), indexed in SmolLM2 tokens, minus a held-out
set of files chosen by a hash of their path: sha1("infgram-mix:" + relative path) % 400 == 0
(about 0.25%). Of the held-out `.c` files, those with (hash // 400) even are scored and the others
fit λ; neither is in the reference.

    python python/bench/linux_mix.py run WORK --tree TREE [--infgram target/release/infgram]
    python python/bench/linux_mix.py split TREE WORK      # only the split: WORK/reference (hard links), WORK/score, WORK/fit
    python python/bench/linux_mix.py spec WORK [--rounds 3]
    python python/bench/linux_mix.py shakespeare WORK

`shakespeare` runs the same three fits on the Tiny Shakespeare protocol of `bench_decode -- mix`
(λ fitted on the last 5% of train with the first 95% indexed; val scored against all of train).

`spec` decodes three code continuations (the first --prompt-chars characters of the first three
scored files, raw, greedy, 128 tokens) with the mixture of `run`'s λ model: plain, then
speculative (the prompt and the Linux index draft, the mixture verifies); the outputs must be
identical, and the speed-up is the ratio of the two in each round.

`run` splits TREE into WORK first when WORK has no split yet, then indexes WORK/reference (once; `/usr/bin/time` gives seconds and peak memory), fits the
paper's two weights, the λ table and the λ model with features on the fit files, and scores the
scored files (each on its own, in 1,024-token windows moved by 512; files above 80% 13-gram
overlap left out of the headline, given beside it) with each mixer and with today's built-in
table. Each file is cut to its first --chars characters (the protocol's sample: 4,000).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

SALT = "infgram-mix:"
MODULUS = 400


def held_out(rel):
    """(held out, scored) of a path relative to the tree's root."""
    h = int(hashlib.sha1((SALT + rel).encode()).hexdigest(), 16)
    return h % MODULUS == 0, (h // MODULUS) % 2 == 0


def split(tree, work):
    ref = os.path.join(work, "reference")
    if os.path.exists(ref):
        sys.exit(f"{ref} exists: remove {work} to split again")
    counts = {"reference": 0, "score": 0, "fit": 0, "held_out_other": 0}
    for d, _, files in os.walk(tree):
        for f in sorted(files):
            src = os.path.join(d, f)
            rel = os.path.relpath(src, tree)
            if os.path.islink(src) or not os.path.isfile(src):
                continue
            held, scored = held_out(rel)
            if not held:
                dst = os.path.join(ref, rel)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.link(src, dst)
                counts["reference"] += 1
            elif f.endswith(".c"):
                part = "score" if scored else "fit"
                dst = os.path.join(work, part, rel.replace("/", "__"))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
                counts[part] += 1
            else:
                counts["held_out_other"] += 1
    print(json.dumps(counts))


def sample(work, part, n, chars):
    """The first `n` files of a part (sorted), each cut to `chars` characters, as files."""
    src = os.path.join(work, part)
    out = os.path.join(work, f"{part}-sample")
    os.makedirs(out, exist_ok=True)
    paths = []
    for name in sorted(os.listdir(src))[:n]:
        text = open(os.path.join(src, name), encoding="utf-8", errors="replace").read()[:chars]
        p = os.path.join(out, name)
        open(p, "w", encoding="utf-8").write(text)
        paths.append(p)
    return paths


def timed(cmd):
    t = time.time()
    r = subprocess.run(["/usr/bin/time", "-f", "@@%e %M"] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    line = [l for l in r.stderr.splitlines() if l.startswith("@@")][-1]
    secs, kb = line[2:].split()
    return r.stdout, float(secs), int(kb) / 1e6, time.time() - t


def fit_mixers(infgram, index, texts, work):
    """The three mixers compared, fitted on `texts`: the λ model with features (and its table),
    the table alone (the same file without the model), and the paper's two weights. Returns
    their paths."""
    features, table, two = (os.path.join(work, f"mix-{n}.json")
                            for n in ("features", "table", "two-weights"))
    fit_cmd = [infgram, "mix", "fit", "--model", "smollm2-135m", "--index", index, "--text"] + texts
    _, secs, _, _ = timed(fit_cmd + ["--features", "-o", features])
    print(f"fit (table and λ model): {secs:.0f} s", flush=True)
    m = json.load(open(features))
    m.pop("features")
    json.dump(m, open(table, "w"), indent=1)
    _, secs, _, _ = timed(fit_cmd + ["--two-weights", "-o", two])
    print(f"fit (two weights): {secs:.0f} s", flush=True)
    return features, table, two


def compare_mixers(infgram, index, texts, mixers, more=()):
    """`ppl --json` of the λ model on `texts`, the other mixers (and the built-in one) beside
    it; returns the report and the seconds and peak GB of the command."""
    features, table, two = mixers
    stdout, secs, gb, _ = timed([infgram, "ppl", "--model", "smollm2-135m", "--index", index,
                                 "--json", *more, "--mix", features,
                                 "--compare", "default", table, two, "--text"] + texts)
    return json.loads(stdout), secs, gb


def run(work, infgram, n_score, n_fit, chars, tree):
    if not os.path.exists(os.path.join(work, "reference")):
        if not tree or not os.path.isdir(tree):
            sys.exit("give the Linux 6.1 tree with --tree: `apt-get install linux-source-6.1`, then "
                     "`tar xf /usr/src/linux-source-6.1.tar.xz -C DIR` gives DIR/linux-source-6.1")
        split(tree, work)
    index = os.path.join(work, "index")
    if not os.path.exists(index):
        _, secs, gb, _ = timed([infgram, "index", "--tokenizer", "smollm2-135m", "-o", index,
                                os.path.join(work, "reference")])
        print(f"index build: {secs:.0f} s, peak {gb:.1f} GB")
    scored = sample(work, "score", n_score, chars)
    fit = sample(work, "fit", n_fit, chars)
    mixers = fit_mixers(infgram, index, fit, work)
    _, table, two = mixers
    r, secs, gb = compare_mixers(infgram, index, scored, mixers, ["--max-overlap", "0.8"])
    json.dump(r, open(os.path.join(work, "ppl.json"), "w"), indent=1)
    print(f"scored {r['tokens']} tokens of {len(scored)} files in {secs:.0f} s (peak {gb:.1f} GB): "
          f"neural {r['neural_seconds']:.1f} s, ∞-gram rows {r['infgram_seconds']:.1f} s "
          f"({100 * r['infgram_seconds'] / r['neural_seconds']:.1f}% of the neural pass), "
          f"smoothed ∞-gram perplexity {r['smoothed_seconds']:.1f} s")
    print(f"SmolLM2 alone {r['ppl_neural']:.3f}, ∞-gram (smoothed) {r['ppl_infgram']:.3f}, "
          f"bound for any λ {r['ppl_bound']:.3f} ({100 * r['relative_improvement_bound']:.1f}%), "
          f"13-gram overlap {100 * r['overlap']:.1f}%")
    names = {"default": "built-in table (Shakespeare)", table: "table fitted on code",
             two: "paper's two weights, fitted on code"}
    print("| mixer | mixture ppl | relative improvement | with left-out files |")
    print("|---|---:|---:|---:|")
    rows = [("λ model with features, fitted on code", r)] + [(names[c["mixer"]], c) for c in r.get("compare", [])]
    for name, c in rows:
        w = c.get("with_left_out")
        extra = f"{w['ppl']:.3f} ({100 * w['relative_improvement']:.1f}%)" if w else "–"
        print(f"| {name} | {c['ppl']:.3f} | {100 * c['relative_improvement']:.1f}% | {extra} |")
    left = [d["document"] for d in r["overlap_by_document"] if d["left_out"]]
    print(f"left out (overlap > 80%): {left}")


def spec(work, infgram, rounds, prompt_chars, max_tokens):
    index = os.path.join(work, "index")
    mixer = os.path.join(work, "mix-features.json")
    files = sorted(os.listdir(os.path.join(work, "score")))[:3]
    print("| prompt | plain mixture tok/s | speculative tok/s | speed-up (rounds) | tokens per pass | identical |")
    print("|---|---:|---:|---:|---:|---|")
    for name in files:
        text = open(os.path.join(work, "score", name), encoding="utf-8", errors="replace").read()
        prompt = text[:prompt_chars]
        base = [infgram, "gen", "--model", "smollm2-135m", "--index", index, "--mix", mixer, "--raw",
                "--prompt", prompt, "--max-tokens", str(max_tokens), "--temperature", "0", "--json"]
        plain_tps, spec_tps, ratios, same = [], [], [], True
        per_pass = 0.0
        for _ in range(rounds):
            a = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
            b = json.loads(subprocess.run(base + ["--speculative"], capture_output=True, text=True,
                                          check=True).stdout)
            same &= a["token_ids"] == b["token_ids"]
            plain_tps.append(a["tokens_per_second"])
            spec_tps.append(b["tokens_per_second"])
            ratios.append(b["tokens_per_second"] / a["tokens_per_second"])
            per_pass = b["tokens"] / max(b["stats"]["passes"], 1)
        med = lambda xs: sorted(xs)[len(xs) // 2]
        print(f"| {name} | {med(plain_tps):.1f} | {med(spec_tps):.1f} | {med(ratios):.2f}× "
              f"({min(ratios):.2f}–{max(ratios):.2f}) | {per_pass:.2f} | {'yes' if same else 'NO'} |",
              flush=True)


def shakespeare(work, infgram):
    os.makedirs(work, exist_ok=True)
    text = subprocess.run(["zstd", "-dc", os.path.join(os.path.dirname(__file__), "..", "..", "data",
                                                        "tinyshakespeare.txt.zst")],
                          capture_output=True, text=True, check=True).stdout
    train, val = text[:len(text) * 9 // 10], text[len(text) * 9 // 10:]
    cut = len(train) * 95 // 100
    files = {"train.txt": train, "train95.txt": train[:cut], "heldout.txt": train[cut:], "val.txt": val}
    for name, t in files.items():
        open(os.path.join(work, name), "w").write(t)
    p = lambda name: os.path.join(work, name)
    for name, corpus in [("index95", "train95.txt"), ("index", "train.txt")]:
        if not os.path.exists(p(name)):
            timed([infgram, "index", "--tokenizer", "smollm2-135m", "-o", p(name), p(corpus)])
    mixers = fit_mixers(infgram, p("index95"), [p("heldout.txt")], work)
    r, _, _ = compare_mixers(infgram, p("index"), [p("val.txt")], mixers)
    print(f"val: {r['tokens']} tokens; SmolLM2 {r['ppl_neural']:.3f}, ∞-gram (smoothed) {r['ppl_infgram']:.3f}, "
          f"bound {r['ppl_bound']:.3f} ({100 * r['relative_improvement_bound']:.1f}%)")
    names = {"default": "built-in table", p("mix-table.json"): "table fitted here",
             p("mix-two-weights.json"): "two weights fitted here"}
    for name, c in [("λ model with features", r)] + [(names[c["mixer"]], c) for c in r["compare"]]:
        print(f"| {name} | {c['ppl']:.3f} | {100 * c['relative_improvement']:.1f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("tree")
    s.add_argument("work")
    # What the other commands share: the work directory and the binary.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("work")
    common.add_argument("--infgram", default="target/release/infgram")
    r = sub.add_parser("run", parents=[common])
    r.add_argument("--score", type=int, default=15)
    r.add_argument("--fit", type=int, default=25)
    r.add_argument("--chars", type=int, default=4000)
    r.add_argument("--tree", help="the unpacked Linux 6.1 tree (split into WORK on first use)")
    sp = sub.add_parser("spec", parents=[common])
    sp.add_argument("--rounds", type=int, default=3)
    sp.add_argument("--prompt-chars", type=int, default=1500)
    sp.add_argument("--max-tokens", type=int, default=128)
    sub.add_parser("shakespeare", parents=[common])
    a = ap.parse_args()
    if a.cmd == "split":
        split(a.tree, a.work)
    elif a.cmd == "shakespeare":
        shakespeare(a.work, a.infgram)
    elif a.cmd == "spec":
        spec(a.work, a.infgram, a.rounds, a.prompt_chars, a.max_tokens)
    else:
        run(a.work, a.infgram, a.score, a.fit, a.chars, a.tree)


if __name__ == "__main__":
    main()
