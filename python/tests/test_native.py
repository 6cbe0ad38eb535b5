"""infgram's own Python API: building (from files and from ids), the JSON query protocol,
SBIS generation and perplexity."""

import json

import pytest

import infgram
from conftest import infgram_binary, served


def test_build_query_generate_perplexity(tmp_path):
    corpus = tmp_path / "c.jsonl"
    lines = [{"text": "the cat sat on the mat. " * 3, "id": 1}, {"text": "the dog sat on the log. " * 3, "id": 2}]
    corpus.write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = infgram.build_index([str(corpus)], str(tmp_path / "idx"), progress=False)
    assert summary["documents"] == 2 and summary["tokens"] == sum(len(x["text"]) for x in lines)
    ix = infgram.Index(str(tmp_path / "idx"))
    assert ix.query({"query_type": "count", "text": "sat on the"}) == {"count": 6, "approx": False}
    r = ix.query({"query_type": "ntd", "text": "sat on the ", "eos_token_id": 0})
    assert r["prompt_cnt"] == 6 and set(r["result_by_token_id"]) == {str(ord("m")), str(ord("l"))}
    assert "error" in ix.query({"query_type": "count"}) or ix.query({"query_type": "count"})["count"] > 0
    assert "error" in ix.query({"query_type": "no_such_query", "text": "a"})
    g = ix.generate("the c", max_tokens=20, seed=1, temperature=0.0)
    assert g["text"].startswith("at sat on the") and len(g["tokens"]) <= 20
    p = ix.perplexity("the cat sat on the log.")
    assert 1.0 <= p["ppl"] < 10.0 and p["tokens"] > 0
    # The library's defaults (all levels, decay 0.1, 200 tokens) and its range checks.
    explicit = ix.perplexity("the cat sat on the log.", k=-1, decay=0.1, context=200)
    assert (explicit["ppl"], explicit["tokens"]) == (p["ppl"], p["tokens"])
    for kwargs, name in [({"context": 0}, "context"), ({"k": 0}, "k"), ({"decay": 0.0}, "decay")]:
        with pytest.raises(ValueError, match=name):
            ix.perplexity("the cat sat on the log.", **kwargs)
    # An existing index is not overwritten without overwrite=True; nothing half-built is left.
    with pytest.raises(ValueError):
        infgram.build_index([str(corpus)], str(tmp_path / "idx"), progress=False)
    with pytest.raises(ValueError):
        infgram.build_index([str(tmp_path / "missing.txt")], str(tmp_path / "idx2"), progress=False)
    assert not (tmp_path / "idx2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]


def test_build_from_ids_refuses_bad_ids(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        infgram.build_index_from_ids([[1, 300]], str(tmp_path / "x"), 255)
    with pytest.raises((ValueError, OverflowError, TypeError)):
        infgram.build_index_from_ids([[1, -1]], str(tmp_path / "x"), 255)
    assert not (tmp_path / "x").exists()
    s = infgram.build_index_from_ids([[1, 2], [3]], str(tmp_path / "y"), 255, docs_per_shard=1)
    assert s["shards"] == 2 and s["documents"] == 2
    ix = infgram.Index(str(tmp_path / "y"))
    assert ix.query({"query_type": "count", "input_ids": [2]}) == {"count": 1, "approx": False}
    assert "error" in ix.query({"query_type": "count", "text": "x"})


def test_one_generation_through_cli_http_and_python(tmp_path):
    """The same request, through the CLI, the HTTP server and Python, gives the same report:
    one request type, one set of defaults (the temperature is left out on purpose), one
    generation call. The server runs
    on 127.0.0.1, answers a bounded number of requests and is stopped by the test."""
    import subprocess

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat and the dog sat on the log. " * 20)
    idx = tmp_path / "idx"
    infgram.build_index([str(corpus)], str(idx), progress=False)
    binary = infgram_binary()
    for seed in (1, 7, 42):
        prompt, max_tokens = "the ", 40
        python = infgram.Index(str(idx)).generate(prompt, max_tokens=max_tokens, seed=seed)
        cli = subprocess.run(
            [binary, "gen", "--index", str(idx), "--prompt", prompt, "--seed", str(seed),
             "--max-tokens", str(max_tokens), "--json"],
            capture_output=True, text=True, timeout=120, check=True)
        cli = json.loads(cli.stdout)
        with served("--index", f"t={idx}") as server:
            http = server.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "seed": seed})
        # One generation call, one report: the same fields through all three.
        report = http["infgram"]
        assert cli["text"] == python["text"] == http["choices"][0]["text"], (seed, cli, python, http)
        assert cli["token_ids"] == python["tokens"] == report["token_ids"], seed
        assert cli["natural_end"] == python["natural_end"] == report["natural_end"], seed
        assert cli["prompt_tokens"] == python["prompt_tokens"] == report["prompt_tokens"], seed
        assert cli["stopped_at_document_end"] == python["hit_end"] == report["stopped_at_document_end"], seed
        assert http["choices"][0]["finish_reason"] == ("stop" if cli["natural_end"] else "length")


def test_generation_errors_name_python_parameters(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. " * 5)
    infgram.build_index([str(corpus)], str(tmp_path / "idx"), progress=False)
    ix = infgram.Index(str(tmp_path / "idx"))
    for kwargs, name in [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                         ({"max_tokens": 0}, "max_tokens"), ({"k": 0}, "k"), ({"context": 0}, "context")]:
        with pytest.raises(ValueError, match=name):
            ix.generate("the", **kwargs)


def test_one_index_class_over_shards_here_or_elsewhere(tmp_path):
    """`Index(path)` and `Index(ask=...)` over the same shards (here: a local index's own shard
    server as the callable) answer alike: queries, the infini-gram API, generation, perplexity,
    fixed-order n-gram models, the sizes of `stats` and answers to shard queries (passed on to
    the shards). What needs the files (rows, identity, the files' fields of `stats`) is refused
    or None over shards held elsewhere; the old `RemoteIndex` constructor makes the same class."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. the dog sat on the log. a cat ate. " * 4)
    infgram.build_index([str(corpus)], str(tmp_path / "idx"), progress=False)
    local = infgram.Index(str(tmp_path / "idx"))
    ident = local.identity()
    remote = infgram.Index(ask=local.answer_shard_queries, shard_infos=ident["shard_infos"],
                           separator=ident["separator"], tokenizer="bytes",
                           fingerprint=ident["tokenizer"]["fingerprint"], name="idx")
    assert isinstance(remote, infgram.Index) and remote.is_remote and not local.is_remote
    for q in [{"query_type": "count", "text": "sat on"}, {"query_type": "ntd", "text": "the ", "eos_token_id": 0},
              {"query_type": "prob", "text": "the ca", "cont_text": "t"}, {"query_type": "find", "text": "cat"}]:
        assert remote.query(q) == local.query(q), q
    args = {"max_tokens": 30, "seed": 3, "temperature": 1.0, "guard": 8}
    assert remote.generate("the ", **args) == local.generate("the ", **args)
    body = json.dumps({"query_type": "count", "query": "cat"}).encode()

    def answer(index):
        status, text = index.api(body)
        v = json.loads(text)
        v.pop("latency", None)
        return status, v

    assert answer(remote) == answer(local) and answer(local)[1]["count"] == 8
    assert remote.api(json.dumps({"index": "other", "query_type": "count", "query": "cat"}).encode())[0] == 404
    def ppl(index):
        report = index.perplexity("the cat sat on the log.")
        report.pop("seconds")
        return report

    assert ppl(remote) == ppl(local) and ppl(local)["tokens"] > 10

    def ngram(index, estimator):
        model = index.ngram_model(3, estimator=estimator, alpha=0.5, discount_fallback=[0.5, 1.0, 1.5])
        report = model.perplexity("the cat sat on the log.")
        report.pop("seconds")
        return model.discounts, report

    for estimator in ["mkn", "add_alpha"]:
        assert ngram(remote, estimator) == ngram(local, estimator), estimator
    with pytest.raises(ValueError, match="files here"):
        remote.identity()
    here, there = local.stats(), remote.stats()
    assert {k: there[k] for k in ["tokens", "documents", "shards"]} == {k: here[k] for k in ["tokens", "documents", "shards"]}
    assert here["tokens"] == 4 * len("the cat sat on the mat. the dog sat on the log. a cat ate. ")
    assert there["token_width"] is None and there["format"] is None and here["format"] == "infgram"
    asks = [(0, json.dumps({"ask": "find", "q": list(b"cat")})), (0, json.dumps({"ask": "longest_suffix", "prompt": list(b"a dog")}))]
    assert remote.answer_shard_queries(asks) == local.answer_shard_queries(asks)
    with pytest.raises(ValueError, match="shard 3 does not exist"):
        remote.answer_shard_queries([(3, asks[0][1])])
    with pytest.raises(ValueError, match="not both"):
        infgram.Index(str(tmp_path / "idx"), ask=local.answer_shard_queries)
    with pytest.raises(ValueError, match="needs ask"):
        infgram.Index(ask=local.answer_shard_queries)
    old = infgram._native.RemoteIndex(local.answer_shard_queries, ident["shard_infos"], ident["separator"],
                                      "bytes", ident["tokenizer"]["fingerprint"])
    assert isinstance(old, infgram._native.Index) and old.query_json('{"query_type": "count", "text": "cat"}') \
        == local.query_json('{"query_type": "count", "text": "cat"}')


def _hostile(tmp_path, alter):
    """A local index of a small corpus, and an `Index(ask=...)` over its shards whose `ask`
    passes every answer through `alter(question, answer)` (JSON dicts): a shard that answers
    wrongly."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = tmp_path / "c.txt"
    corpus.write_text("ROMEO: the cat sat on the mat. JULIET: the dog sat on the log. " * 20)
    infgram.build_index([str(corpus)], str(tmp_path / "idx"), progress=False)
    local = infgram.Index(str(tmp_path / "idx"))
    ident = local.identity()

    def ask(requests):
        answers = local.answer_shard_queries(requests)
        return [json.dumps(alter(json.loads(q), json.loads(a))) for (_, q), a in zip(requests, answers)]

    remote = infgram.Index(ask=ask, shard_infos=ident["shard_infos"], separator=ident["separator"],
                           tokenizer="bytes", fingerprint=ident["tokenizer"]["fingerprint"])
    return local, remote


def _within(seconds, f):
    """`f()`'s value or exception, run on a thread: a call still running after `seconds` fails
    the test (a hang) instead of holding it."""
    import threading
    out = {}

    def run():
        try:
            out["value"] = f()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the call did not return: a hang"
    return out


def test_a_shard_that_answers_wrongly_is_an_error_never_a_hang_or_a_panic(tmp_path):
    """Each answer is checked against its question and the shard's figures: a level longer than
    2**32, a token past the vocabulary, a suffix longer than the prompt, a reversed range, a
    match longer than the text. Generation, perplexity, queries, the API and attribution end
    with an `Exception` (the API with a 5xx) naming the shard, in well under a second each."""

    def levels_len(q, a):
        if a.get("answer") == "levels" and a["of"]["points"]:
            a["of"]["points"][0]["len"] = 2 ** 32
        return a

    def levels_token(q, a):
        if a.get("answer") == "levels" and a["of"]["points"] and a["of"]["points"][0]["counts"]:
            a["of"]["points"][0]["counts"][0][0] = 999
        return a

    def suffix_len(q, a):
        if a.get("answer") == "suffix":
            a["of"]["len"] = 100
        return a

    def range_reversed(q, a):
        if a.get("answer") == "range":
            a["of"]["range"] = [5, 2]
        return a

    def matches_len(q, a):
        if a.get("answer") == "matches" and a["of"]["matches"]:
            a["of"]["matches"][-1]["len"] = 1000
        return a

    calls = {
        "generate": lambda ix: ix.generate("ROMEO:", max_tokens=20, seed=1),
        "perplexity": lambda ix: {k: v for k, v in ix.perplexity("ROMEO: the cat").items() if k != "seconds"},
        "infgram_ntd": lambda ix: ix.query({"query_type": "infgram_ntd", "text": "ROMEO: the cat"}),
        "count": lambda ix: ix.query({"query_type": "count", "text": "the cat"}),
        "attribute": lambda ix: ix.query({"query_type": "attribute", "text": "the cat sat", "min_len": 2}),
        "api": lambda ix: ix.api(json.dumps({"query_type": "infgram_prob", "query": "ROMEO: the ca",
                                             "cont_text": "t"}).encode()),
    }
    for alter in [levels_len, levels_token, suffix_len, range_reversed, matches_len]:
        local, remote = _hostile(tmp_path / alter.__name__, alter)
        for name, call in calls.items():
            out = _within(20, lambda: call(remote))
            err = out.get("error")
            assert err is None or isinstance(err, Exception), (alter.__name__, name, err)
            if name == "api":
                status, text = out["value"]
                assert status == 200 or status >= 500, (alter.__name__, text)
                if status != 200:
                    assert "answered wrongly" in json.loads(text)["error"]
                continue
            value = out.get("value")
            if isinstance(value, dict) and "error" in value:
                err = value["error"]
            if err is not None:
                assert "answered wrongly" in str(err), (alter.__name__, name, err)
            else:
                assert value == call(local), (alter.__name__, name, "a wrong answer passed through")


def test_a_keyboard_interrupt_in_ask_is_raised_as_itself(tmp_path):
    """A `KeyboardInterrupt` or `SystemExit` raised inside `ask` comes out of the call as itself,
    not as an error dict or a `RuntimeError` with an empty message; an ordinary exception is
    an error naming it."""
    for raised in [KeyboardInterrupt, SystemExit]:
        def alter(q, a, raised=raised):
            raise raised()

        _, remote = _hostile(tmp_path / raised.__name__, alter)
        for call in [lambda: remote.query({"query_type": "count", "text": "cat"}),
                     lambda: remote.generate("ROMEO:", max_tokens=5),
                     lambda: remote.perplexity("the cat"),
                     lambda: remote.api(b'{"query_type": "count", "query": "cat"}')]:
            with pytest.raises(raised):
                call()

    def fails(q, a):
        raise ConnectionError("shard 0 is down")

    _, remote = _hostile(tmp_path / "down", fails)
    assert "shard 0 is down" in remote.query({"query_type": "count", "text": "cat"})["error"]
    with pytest.raises(RuntimeError, match="shard 0 is down"):
        remote.generate("ROMEO:", max_tokens=5)


def test_remote_figures_that_no_index_has_are_refused(tmp_path):
    """A separator inside the vocabulary and impossible shard figures are refused when the
    index is made, saying what to pass."""
    _, _ = _hostile(tmp_path, lambda q, a: a)
    local = infgram.Index(str(tmp_path / "idx"))
    ident = local.identity()
    common = dict(ask=local.answer_shard_queries, tokenizer="bytes", fingerprint=ident["tokenizer"]["fingerprint"])
    with pytest.raises(ValueError, match="separator 10 is an id of the tokenizer"):
        infgram.Index(shard_infos=ident["shard_infos"], separator=10, **common)
    with pytest.raises(ValueError, match="no shard's"):
        infgram.Index(shard_infos=[(2 ** 63, 2 ** 63)], separator=ident["separator"], **common)
    with pytest.raises(ValueError, match="no shard's"):
        infgram.Index(shard_infos=[(5, 9)], separator=ident["separator"], **common)


def test_python_errors_name_python_parameters(tmp_path):
    """The library's suggestions name Python's keyword arguments (`floor=`,
    `discount_fallback=`), not the command line's flags."""
    _, _ = _hostile(tmp_path, lambda q, a: a)
    local = infgram.Index(str(tmp_path / "idx"))
    with pytest.raises(ValueError, match="floor=") as e:
        local.perplexity("zzz qqq")
    assert "--floor" not in str(e.value)
    assert local.perplexity("zzz qqq", floor=1e-6)["floored"] > 0
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a b")
    infgram.build_index([str(tiny)], str(tmp_path / "tiny"), progress=False)
    with pytest.raises(ValueError, match="discount_fallback=") as e:
        infgram.Index(str(tmp_path / "tiny")).ngram_model(3)
    assert "--discount-fallback" not in str(e.value)


def test_a_fixed_order_model_over_shards_elsewhere_holds_a_page_per_shard(tmp_path):
    """The counting pass over shards held elsewhere asks each shard for its suffix groups a page
    at a time: the peak memory of an order-12 model over a 1 MB corpus grows by tens of MB over
    the index's (5 GB when each shard sent all its groups in one answer)."""
    import random
    import subprocess
    import sys
    rng = random.Random(5)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "log", "of", "king"]
    (tmp_path / "c.txt").write_text(" ".join(rng.choice(words) for _ in range(250_000))[:1_000_000])
    infgram.build_index([str(tmp_path / "c.txt")], str(tmp_path / "idx"), progress=False)
    child = r"""
import resource, sys, infgram
local = infgram.Index(sys.argv[1])
ident = local.identity()
index = local if sys.argv[2] == "here" else infgram.Index(
    ask=local.answer_shard_queries, shard_infos=ident["shard_infos"], separator=ident["separator"],
    tokenizer="bytes", fingerprint=ident["tokenizer"]["fingerprint"])
index.ngram_model(12, discount_fallback=[0.5, 1.0, 1.5])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""
    peak = {side: int(subprocess.run([sys.executable, "-c", child, str(tmp_path / "idx"), side], check=True,
                                     capture_output=True, text=True).stdout) for side in ["here", "elsewhere"]}
    assert peak["elsewhere"] - peak["here"] < 200, peak
