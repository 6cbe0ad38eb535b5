"""`infgram.Model`: a neural model (SmolLM2-135M, fetched into the cache by `cargo test` on first
use) run by infgram from Python. One generation request gives one report through the CLI, the
HTTP server and Python, and the model is a `step` of the reference speculative loop
whose greedy output is plain decoding's."""

import json
import subprocess

import numpy as np
import pytest

import infgram
from infgram import speculative
from conftest import infgram_binary, served

MODEL = "smollm2-135m"
CORPUS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
    "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n\n"
    "All:\nWe know't, we know't.\n\nFirst Citizen:\nLet us kill him, and we'll have corn at our own "
    "price. Is't a verdict?\n\nAll:\nNo more talking on't; let it be done: away, away!\n\n"
)
PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n"


@pytest.fixture(scope="module")
def model_index(tmp_path_factory):
    """An index of a short corpus in SmolLM2's tokens (the wheel reads the GGUF tokenizer)."""
    tmp = tmp_path_factory.mktemp("model")
    corpus = tmp / "c.txt"
    corpus.write_text(CORPUS * 3)
    idx = tmp / "idx"
    infgram.build_index([str(corpus)], str(idx), tokenizer=MODEL, progress=False)
    return idx


# The report's fields that do not depend on timing. How drafts are planned does: the decode
# loop learns what its passes cost from their times (after three of a size), so the passes,
# drafts and acceptance of the same greedy text can differ between two runs of one front end
# (seen with the server: 10 passes and 17 drafted tokens, or 11 and 16), and are checked for
# sense rather than equality.
SAME = ["text", "token_ids", "tokens", "prompt_tokens", "natural_end", "cancelled", "guard_exhausted",
        "max_copied_span", "guard_blocked", "speculative", "mix", "identical", "context_tokens"]
SAME_STATS = ["exhausted"]


def test_one_model_generation_through_cli_http_and_python(model_index, tmp_path):
    """Speculative decoding of the guarded mixture, drafting from past outputs too, with
    `compare`'s plain run: the CLI (`gen --json`), the server (`/v1/completions`, its `infgram`
    field) and `Model.generate` give the same report. Each front end runs the request twice
    over its own copy of the past outputs, so the second run drafts from the first's output."""
    binary = infgram_binary()
    max_tokens = 24
    python_past, cli_past, http_past = (tmp_path / f"{n}.past" for n in ("python", "cli", "http"))
    model = infgram.Model(MODEL, index=str(model_index), past_outputs=str(python_past), threads=1)
    python = [model.generate(PROMPT, raw=True, max_tokens=max_tokens, temperature=0, speculative=True,
                             mix=True, guard=4, compare=True) for _ in range(2)]
    cli = []
    for _ in range(2):
        out = subprocess.run(
            [binary, "gen", "--model", MODEL, "--index", str(model_index), "--speculative", "--mix", "default",
             "--guard", "4", "--compare", "--past-outputs", str(cli_past), "--temperature", "0",
             "--max-tokens", str(max_tokens), "--raw", "--threads", "1", "--json", "--prompt", PROMPT],
            capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        cli.append(json.loads(out.stdout))
    with served("--model", MODEL, "--threads", "1", "--index", f"ts={model_index}",
                "--past-outputs", str(http_past)) as server:
        http = [server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                                                "mode": "mix", "speculative": True, "index": "ts", "guard": 4,
                                                "compare": True}) for _ in range(2)]
    for run in range(2):
        p, c, h = python[run], cli[run], http[run]["infgram"]
        assert p["text"] == http[run]["choices"][0]["text"], run
        for key in SAME:
            assert key in p, key
            assert p.get(key) == c.get(key) == h.get(key, p["text"] if key == "text" else None), (run, key, p, c, h)
        for key in SAME_STATS:
            assert p["stats"][key] == c["stats"][key] == h["stats"][key], (run, key)
        for r in (p, c, h):
            s = r["stats"]
            assert 0 < s["accepted"] <= s["drafted"] and s["passes"] <= s["tokens"], r
            assert s["accepted"] == sum(s["accepted_by_drafter"].values()), r
        assert p["speculative"] and p["mix"] and p["identical"], p
    # The second run drafted from the first's output (kept by each front end).
    assert python[1]["stats"]["accepted_by_drafter"].get("past", 0) > 0, python[1]
    assert model.past_outputs()["outputs"] == 2


def test_model_generate_checks_its_arguments(model_index):
    model = infgram.Model(MODEL, threads=1)
    for kwargs, name in [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                         ({"max_tokens": 0}, "max_tokens"), ({"draft_max": 0}, "draft_max"),
                         ({"guard": 0}, "guard"), ({"prompt_ids": [10 ** 9]}, "prompt_ids")]:
        with pytest.raises(ValueError, match=name):
            model.generate("Hi" if "prompt_ids" not in kwargs else None, **kwargs)
    with pytest.raises(ValueError, match="mixing needs an index"):
        model.generate("Hi", mix=True, max_tokens=2)
    with pytest.raises(ValueError, match="not both"):
        model.generate("Hi", speculative=True, drafters=["corpus"])
    with pytest.raises(ValueError, match="drafter"):
        model.generate("Hi", drafters=["telepathy"])
    with pytest.raises(ValueError, match="device"):
        infgram.Model(MODEL, device="tpu")
    # An index in other tokens is refused when the model is made, naming the tokenizer.
    other = model_index.parent / "bytes-idx"
    (model_index.parent / "b.txt").write_text(CORPUS)
    infgram.build_index([str(model_index.parent / "b.txt")], str(other), progress=False)
    with pytest.raises(ValueError, match="tokenizer"):
        infgram.Model(MODEL, index=str(other))


def test_a_model_drafts_from_shards_held_elsewhere(model_index, tmp_path):
    """`Model(index=Index(ask=...))`: drafts, mixing and the guard over shards held elsewhere
    (here the index's own shard server as the callable) give the text and copied span of the
    index here (how many tokens are drafted depends on what each draft costs, a timing: not
    compared); shards in another tokenizer are refused when the model is made."""
    local = infgram.Index(str(model_index))
    ident = local.identity()

    def elsewhere(tokenizer, fingerprint):
        return infgram.Index(ask=local.answer_shard_queries, shard_infos=ident["shard_infos"],
                             separator=ident["separator"], tokenizer=tokenizer, fingerprint=fingerprint)

    remote = elsewhere(MODEL, ident["tokenizer"]["fingerprint"])
    models = [infgram.Model(MODEL, index=index, threads=1) for index in (local, remote)]
    for args in [dict(speculative=True, mix=True, guard=4), dict(drafters=["corpus"])]:
        here, there = (m.generate(PROMPT, raw=True, max_tokens=24, temperature=0, **args) for m in models)
        assert there["text"] == here["text"] and there["speculative"], args
        assert there.get("max_copied_span") == here.get("max_copied_span"), args
    assert there["stats"]["drafted"] > 0, there["stats"]
    (tmp_path / "b.txt").write_text(CORPUS)
    infgram.build_index([str(tmp_path / "b.txt")], str(tmp_path / "bytes-idx"), progress=False)
    bytes_fp = infgram.Index(str(tmp_path / "bytes-idx")).identity()["tokenizer"]["fingerprint"]
    with pytest.raises(ValueError, match="tokenizer"):
        infgram.Model(MODEL, index=elsewhere("bytes", bytes_fp))


def test_infgram_model_steps_the_reference_loop(model_index):
    """`Model` as `speculative.generate`'s step: plain and speculative greedy decoding give
    `Model.generate`'s plain greedy output, token for token."""
    model = infgram.Model(MODEL, threads=1)
    ids = model.prompt_ids(PROMPT, raw=True)
    want = model.generate(prompt_ids=ids, temperature=0, max_tokens=32)["token_ids"]
    drafter = infgram.Drafter(index=infgram.Index(str(model_index)))
    for d in (None, drafter):
        model.reset()
        stats = {}
        got = speculative.generate(model, ids, d, max_tokens=32, eos_ids=model.eos_ids, stats=stats)
        assert got == want, (d, got, want)
        if d is not None:
            assert stats["accepted"] > 0 and stats["passes"] < len(want), stats
    # The rows are the model's logits: one per fed token, argmax the greedy token.
    model.reset()
    rows = model.step(ids)
    assert rows.shape == (len(ids), model.vocab_size) and rows.dtype == np.float32
    assert int(rows[-1].argmax()) == want[0]
    assert model.cache_len == len(ids)
    model.rollback(1)
    assert model.cache_len == 1
    with pytest.raises(ValueError, match="cache holds"):
        model.rollback(5)


def test_generations_from_several_threads_share_the_batch_and_answer_as_alone():
    """`Model(parallel=4)`: `generate` from four Python threads at once (greedy, seeded
    sampling, speculative, a chat) gives each the text it gives alone, on a model of one
    sequence at a time; `step`'s own calls still work beside the batcher."""
    import threading

    calls = [
        dict(prompt=PROMPT, raw=True, max_tokens=24, temperature=0),
        dict(prompt=PROMPT, raw=True, max_tokens=24, temperature=0.8, seed=3),
        dict(prompt=PROMPT, raw=True, max_tokens=24, temperature=0, speculative=True),
        dict(messages=[("user", "Name three colours.")], max_tokens=16, temperature=0),
    ]
    alone = infgram.Model(MODEL, threads=2)
    want = [alone.generate(**c)["text"] for c in calls]
    shared = infgram.Model(MODEL, threads=2, parallel=4)
    got = [None] * len(calls)

    def run(i):
        got[i] = shared.generate(**calls[i])["text"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == want
    ids = shared.prompt_ids(PROMPT, raw=True)
    assert shared.step(ids).shape[0] == len(ids)


def test_a_prompt_that_starts_as_an_earlier_one_reads_only_the_rest():
    """On the native backend a model keeps the caches of its ended generations: the same
    prompt again reads only its last token, and one that goes on after an earlier answer reads
    only what follows it; each answer is the one a fresh model gives."""
    model = infgram.Model(MODEL, threads=2)
    ask = dict(raw=True, max_tokens=16, temperature=0)
    first = model.generate(prompt=PROMPT, **ask)
    assert first["stats"]["cached_prompt_tokens"] == 0
    again = model.generate(prompt=PROMPT, **ask)
    assert again["text"] == first["text"]
    assert again["stats"]["cached_prompt_tokens"] == again["prompt_tokens"] - 1
    longer = PROMPT + first["text"] + "\n\nFirst Citizen:\n"
    cold = infgram.Model(MODEL, threads=2).generate(prompt=longer, **ask)
    warm = model.generate(prompt=longer, **ask)
    assert warm["text"] == cold["text"]
    assert cold["stats"]["cached_prompt_tokens"] == 0
    assert warm["prompt_tokens"] - 1 > warm["stats"]["cached_prompt_tokens"] >= first["prompt_tokens"]
