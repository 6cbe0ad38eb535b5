"""infgram's own Python API: building (from files and from ids), the JSON query protocol,
SBIS generation and perplexity."""

import json

import pytest

import infgram


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
