"""infgram.Drafter and infgram.speculative: drafts for another engine's loop.

The reference loop with a tiny numpy model gives plain decoding's output exactly (greedy) and
its distribution (sampled); Python's drafts are the HTTP route's; 32 threads drafting for 256
interleaved requests get what one thread gets; past outputs are kept in their file.
"""

import json
import threading

import numpy as np
import pytest

import infgram
from conftest import served
from infgram import speculative


class TinyModel:
    """A bigram model over `vocab` ids with a cache: the logits after token x are table[x]."""

    def __init__(self, vocab=40, seed=0, scale=3.0):
        rng = np.random.default_rng(seed)
        self.table = rng.normal(size=(vocab, vocab)) * scale
        self.cache = []

    def __call__(self, new_ids):
        self.cache.extend(new_ids)
        return self.table[np.asarray(new_ids)]

    def rollback(self, length):
        del self.cache[length:]


def random_prompt(rng, vocab, n=30):
    # A repeated phrase in noise: prompt lookup has something to draft.
    phrase = list(rng.integers(0, vocab, size=6))
    return [int(t) for t in list(rng.integers(0, vocab, size=n)) + phrase + list(rng.integers(0, vocab, size=5)) + phrase[:3]]


def test_greedy_speculative_equals_plain_decoding(tmp_path):
    rng = np.random.default_rng(1)
    docs = [[int(t) for t in rng.integers(0, 40, size=200)] for _ in range(5)]
    infgram.build_index_from_ids(docs, str(tmp_path / "ix"), 40)
    index = infgram.Index(str(tmp_path / "ix"))
    accepted = 0
    for case in range(12):
        prompt = random_prompt(rng, 40) + docs[case % 5][:20]
        plain = speculative.generate(TinyModel(seed=case), prompt, None, max_tokens=60)
        for drafter in (infgram.Drafter(), infgram.Drafter(index=index)):
            stats = {}
            spec = speculative.generate(TinyModel(seed=case), prompt, drafter, max_tokens=60, stats=stats)
            assert spec == plain, case
            accepted += stats["accepted"]
            assert drafter.open_requests == 0
    assert accepted > 50


def test_sampled_speculative_keeps_the_distribution():
    vocab, n = 5, 3000
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]

    def pairs(drafter, offset):
        counts = np.zeros((vocab, vocab))
        for i in range(n):
            out = speculative.generate(TinyModel(vocab=vocab, seed=3, scale=1.0), prompt, drafter,
                                       max_tokens=2, temperature=1.0, seed=offset + i)
            counts[out[0], out[1]] += 1
        return counts / n

    plain = pairs(None, 0)
    spec = pairs(infgram.Drafter(), 10_000_000)
    # The exact distribution of the first two tokens under the model.
    table = TinyModel(vocab=vocab, seed=3, scale=1.0).table

    def softmax(z):
        e = np.exp(z - z.max())
        return e / e.sum()

    first = softmax(table[prompt[-1]])
    exact = np.array([[first[a] * softmax(table[a])[b] for b in range(vocab)] for a in range(vocab)])
    tv_plain = 0.5 * np.abs(plain - exact).sum()
    tv_spec = 0.5 * np.abs(spec - exact).sum()
    assert tv_plain < 0.06 and tv_spec < 0.06, (tv_plain, tv_spec)


def assert_same_draft(http, mine, case):
    """The route's draft (JSON) is the Drafter's: tokens, tree, sources, probabilities."""
    assert http["token_ids"] == mine["token_ids"] and http["parents"] == mine["parents"], case
    assert http["sources"] == mine["sources"], case
    assert np.allclose(http["probs"], mine["probs"], rtol=0, atol=1e-12), case


@pytest.mark.parametrize("rule", ["sbis", "longest_suffix"])
def test_python_drafts_are_the_http_route_drafts(tmp_path, rule):
    """Under either corpus rule (the server's --corpus-rule, the Drafter's corpus_rule)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat and the dog sat on the log. the cat ran. " * 20)
    idx = tmp_path / "idx"
    infgram.build_index([str(corpus)], str(idx), progress=False)
    index = infgram.Index(str(idx))
    drafter = infgram.Drafter(index=index, corpus_rule=rule)
    text = index.tokenize("the cat sat on the mat and the dog sat on the log. the cat ran. the dog sat")
    rng = np.random.default_rng(5)
    with pytest.raises(ValueError, match="longest_suffix"):
        infgram.Drafter(index=index, corpus_rule="shortest")
    with served("--index", f"t={idx}", "--corpus-rule", rule.replace("_", "-")) as server:
        for case in range(30):
            cut = int(rng.integers(2, len(text)))
            max_tokens, tree = int(rng.integers(1, 17)), bool(case % 2)
            http = server.post("/v1/drafts", {"context_ids": text[:cut], "max_tokens": max_tokens, "tree": tree})
            mine = drafter.draft_once(text[:cut], max_tokens, tree).to_dict()
            assert_same_draft(http, mine, case)


def test_http_drafts_are_python_drafts_over_three_shards(tmp_path):
    """The route and the Drafter over an index of three shards, sessions grown by the
    route's whole-context calls (`request_id`) and by `extend`."""
    rng = np.random.default_rng(13)
    docs = [[int(t) for t in rng.integers(1, 12, size=int(rng.integers(10, 80)))] for _ in range(9)]
    infgram.build_index_from_ids(docs, str(tmp_path / "ix"), 12, docs_per_shard=3)
    index = infgram.Index(str(tmp_path / "ix"))
    assert len(index.identity()["shard_infos"]) == 3
    from_corpus = 0
    for rule in ["sbis", "longest_suffix"]:
        drafter = infgram.Drafter(index=index, corpus_rule=rule)
        with served("--index", f"t={tmp_path / 'ix'}", "--corpus-rule", rule.replace("_", "-")) as server:
            for r in range(8):
                doc = docs[r]
                ctx = doc[: 3 + r]
                drafter.start(f"q{r}", ctx)
                for step in range(4):
                    tree = bool((r + step) % 2)
                    body = {"context_ids": ctx, "max_tokens": 10, "tree": tree, "request_id": f"q{r}"}
                    http = server.post("/v1/drafts", body)
                    mine = drafter.draft(f"q{r}", 10, tree=tree).to_dict()
                    assert_same_draft(http, mine, (rule, r))
                    from_corpus += mine["sources"].count("corpus")
                    kept = doc[len(ctx): len(ctx) + 2] or [1]
                    ctx = ctx + kept
                    drafter.extend(f"q{r}", kept)
    assert from_corpus > 10, from_corpus


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("rule", ["sbis", "longest_suffix"])
def test_drafts_over_shards_held_elsewhere_are_the_local_drafts(tmp_path, shards, rule):
    """A Drafter over an Index whose shards a callable answers for (as the Ray router's do),
    built in `shards` slices of the documents, drafts what a Drafter over one local index of
    the same documents drafts: chains and trees, requests grown by extend, past outputs off."""
    rng = np.random.default_rng(11 + shards)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "its", "log"]
    data = tmp_path / "data.jsonl"
    with open(data, "w") as f:
        for _ in range(24):
            f.write(json.dumps({"text": " ".join(rng.choice(words, size=int(rng.integers(5, 40))))}) + "\n")
    infgram.build_index([str(data)], str(tmp_path / "whole"), progress=False)
    whole = infgram.Index(str(tmp_path / "whole"))
    slices = []
    for i, (a, b, _) in enumerate(infgram._native.plan_slices([str(data)], shards)):
        infgram.build_index([str(data)], str(tmp_path / f"s{i}"), progress=False, docs=(a, b))
        slices.append(infgram.Index(str(tmp_path / f"s{i}")))
    assert len(slices) == shards
    infos, owner = [], []
    for i, s in enumerate(slices):
        for k, info in enumerate(s.identity()["shard_infos"]):
            infos.append(info)
            owner.append((i, k))

    def ask(requests):
        return [slices[owner[s][0]].answer_shard_queries([(owner[s][1], q)])[0] for s, q in requests]

    ident = whole.identity()
    remote = infgram.Index(ask=ask, shard_infos=infos, separator=ident["separator"], tokenizer="bytes",
                           fingerprint=ident["tokenizer"]["fingerprint"], name="sliced")
    here, there = infgram.Drafter(index=whole, corpus_rule=rule), infgram.Drafter(index=remote, corpus_rule=rule)
    text = whole.tokenize(" ".join(rng.choice(words, size=60)))
    drafted = 0
    for r in range(10):
        cut = int(rng.integers(4, 30))
        for d in (here, there):
            d.start(f"r{r}", text[:cut])
        for step in range(4):
            tree = bool((r + step) % 2)
            a = here.draft(f"r{r}", 12, tree=tree).to_dict()
            b = there.draft(f"r{r}", 12, tree=tree).to_dict()
            assert a == b, (r, step)
            drafted += a["sources"].count("corpus")
            kept = text[cut: cut + 3]
            cut += 3
            for d in (here, there):
                d.extend(f"r{r}", kept)
        for d in (here, there):
            d.finish(f"r{r}")
    assert drafted > 10, drafted
    with pytest.raises(ValueError, match="vocabulary"):
        there.draft_once([5, 300], 4)


def test_threads_draft_what_one_thread_drafts(tmp_path):
    rng = np.random.default_rng(9)
    docs = [[int(t) for t in rng.integers(0, 30, size=300)] for _ in range(8)]
    infgram.build_index_from_ids(docs, str(tmp_path / "ix"), 30, docs_per_shard=3)
    index = infgram.Index(str(tmp_path / "ix"))
    requests = []
    for r in range(256):
        doc = docs[r % 8]
        cut = 20 + r % 50
        requests.append((doc[:cut], [doc[cut + 4 * k: cut + 4 * k + 4] for k in range(3)]))

    def run(drafter, rs, out):
        for r in rs:
            drafter.start(f"req-{r}", requests[r][0])
        for k in range(3):
            for r in rs:
                out.setdefault(r, []).append(list(drafter.draft(f"req-{r}", 8, tree=True).token_ids))
                drafter.extend(f"req-{r}", requests[r][1][k])
        for r in rs:
            drafter.finish(f"req-{r}")

    alone = {}
    run(infgram.Drafter(index=index), range(256), alone)
    shared, together = infgram.Drafter(index=index), {}
    threads = [threading.Thread(target=run, args=(shared, range(t, 256, 32), together)) for t in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert together == alone
    assert shared.open_requests == 0
    batch = infgram.Drafter(index=index)
    for r in range(4):
        batch.start(f"b{r}", requests[r][0])
    many = batch.draft_many([(f"b{r}", 8) for r in range(4)])
    assert [list(d.token_ids) for d in many] == [alone[r][0] for r in range(4)]


def test_past_outputs_are_kept_in_their_file(tmp_path):
    rng = np.random.default_rng(2)
    docs = [[int(t) for t in rng.integers(0, 30, size=100)] for _ in range(3)]
    infgram.build_index_from_ids(docs, str(tmp_path / "ix"), 30)
    index = infgram.Index(str(tmp_path / "ix"))
    past = tmp_path / "past.bin"
    answer = [29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18]
    d = infgram.Drafter(index=index, past_outputs=str(past), prompt_lookup=False)
    d.start("a", [1, 2, 3])
    d.extend("a", answer)
    d.finish("a")
    assert past.exists()
    again = infgram.Drafter(index=index, past_outputs=str(past), prompt_lookup=False)
    draft = again.draft_once([5, 6, 29, 28, 27], 8)
    assert draft.token_ids[:3] == [26, 25, 24] and "past" in draft.sources, draft
    with pytest.raises(KeyError):
        again.draft("never-started", 4)
    with pytest.raises(ValueError):
        again.draft_once([1, 2], 100_000)
    with pytest.raises(ValueError):
        infgram.Drafter(past_outputs=str(past))


def test_requests_are_bounded_in_bytes_and_a_failed_save_is_an_os_error(tmp_path):
    """Open requests hold at most `session_bytes` (the least recently used
    end past it, counted); past outputs that cannot be saved raise OSError, not ValueError."""
    rng = np.random.default_rng(5)
    docs = [[int(t) for t in rng.integers(0, 30, size=100)] for _ in range(3)]
    infgram.build_index_from_ids(docs, str(tmp_path / "ix"), 30)
    index = infgram.Index(str(tmp_path / "ix"))
    bound = 1 << 20
    d = infgram.Drafter(index=index, session_bytes=bound)
    for r in range(200):
        d.start(f"r{r}", [int(t) for t in rng.integers(0, 30, size=1000)])
        d.draft(f"r{r}", 4)
        assert d.session_bytes <= bound
    assert d.dropped_requests > 0 and d.open_requests + d.dropped_requests == 200
    assert d.draft("r199", 4) is not None  # the newest is kept
    with pytest.raises(KeyError):
        d.draft("r0", 4)  # the oldest was dropped
    past = tmp_path / "past.bin"
    saver = infgram.Drafter(index=index, past_outputs=str(past))
    saver.start("a", [1, 2, 3])
    saver.extend("a", [4, 5])
    past.mkdir()  # what the save would replace is now a directory
    with pytest.raises(OSError, match="not be saved"):
        saver.finish("a")
