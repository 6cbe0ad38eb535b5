"""The Linux interpolation protocol of issue #34 (BENCHMARKS.md, "Interpolation at scale").

Reference: Debian's Linux 6.1 source tree (`apt-get install linux-source-6.1`, then
`tar xf /usr/src/linux-source-6.1.tar.xz -C DIR`), indexed in SmolLM2 tokens, minus a held-out
set of files chosen by a hash of their path: sha1("infgram-mix:" + relative path) % 400 == 0
(about 0.25%). Of the held-out `.c` files, those with (hash // 400) even are scored and the others
fit λ; neither is in the reference.

    python python/bench/linux_mix.py split TREE WORK      # WORK/reference (hard links), WORK/score, WORK/fit
    python python/bench/linux_mix.py run WORK [--infgram target/release/infgram]

`run` indexes WORK/reference (once; `/usr/bin/time` gives seconds and peak memory), fits the
paper's two weights, the λ table and the λ model with features on the fit files, and scores the
scored files (each on its own, in 1,024-token windows moved by 512; files above 80% 13-gram
overlap left out of the headline, given beside it) with each mixer and with today's built-in
table. Each file is cut to its first --chars characters (the issue's sample: 4,000).
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


def run(work, infgram, n_score, n_fit, chars):
    index = os.path.join(work, "index")
    if not os.path.exists(index):
        _, secs, gb, _ = timed([infgram, "index", "--tokenizer", "smollm2-135m", "-o", index,
                                os.path.join(work, "reference")])
        print(f"index build: {secs:.0f} s, peak {gb:.1f} GB")
    scored = sample(work, "score", n_score, chars)
    fit = sample(work, "fit", n_fit, chars)
    features = os.path.join(work, "mix-features.json")
    table = os.path.join(work, "mix-table.json")
    two = os.path.join(work, "mix-two-weights.json")
    fit_cmd = [infgram, "mix", "fit", "--model", "smollm2-135m", "--index", index, "--text"] + fit
    _, secs, _, _ = timed(fit_cmd + ["--features", "-o", features])
    print(f"fit (table and λ model): {secs:.0f} s", flush=True)
    m = json.load(open(features))
    m.pop("features")
    json.dump(m, open(table, "w"), indent=1)
    _, secs, _, _ = timed(fit_cmd + ["--two-weights", "-o", two])
    print(f"fit (two weights): {secs:.0f} s", flush=True)
    stdout, secs, gb, _ = timed([infgram, "ppl", "--model", "smollm2-135m", "--index", index,
                                 "--json", "--max-overlap", "0.8", "--mix", features,
                                 "--compare", "default", table, two, "--text"] + scored)
    r = json.loads(stdout)
    json.dump(r, open(os.path.join(work, "ppl.json"), "w"), indent=1)
    print(f"scored {r['tokens']} tokens of {len(scored)} files in {secs:.0f} s (peak {gb:.1f} GB): "
          f"neural {r['neural_seconds']:.1f} s, ∞-gram {r['infgram_seconds']:.1f} s "
          f"({100 * r['infgram_seconds'] / r['neural_seconds']:.1f}% of the neural pass)")
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("tree")
    s.add_argument("work")
    r = sub.add_parser("run")
    r.add_argument("work")
    r.add_argument("--infgram", default="target/release/infgram")
    r.add_argument("--score", type=int, default=15)
    r.add_argument("--fit", type=int, default=25)
    r.add_argument("--chars", type=int, default=4000)
    a = ap.parse_args()
    if a.cmd == "split":
        split(a.tree, a.work)
    else:
        run(a.work, a.infgram, a.score, a.fit, a.chars)


if __name__ == "__main__":
    main()
