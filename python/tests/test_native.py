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


def infgram_binary():
    """The `infgram` command built by `cargo test --release` (or `cargo build --release`) in
    this checkout; `INFGRAM_BIN` names another."""
    import os
    from pathlib import Path

    path = Path(os.environ.get("INFGRAM_BIN", Path(__file__).resolve().parents[2] / "target" / "release" / "infgram"))
    if not path.exists():
        pytest.skip(f"no infgram binary at {path}: run `cargo build --release` first")
    return str(path)


def test_one_generation_through_cli_http_and_python(tmp_path):
    """The same request, through the CLI, the HTTP server and Python, gives the same text: one
    request type, one set of defaults (the temperature is left out on purpose). The server runs
    on 127.0.0.1, answers a bounded number of requests and is stopped by the test."""
    import subprocess
    import urllib.request

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat and the dog sat on the log. " * 20)
    idx = tmp_path / "idx"
    infgram.build_index([str(corpus)], str(idx), progress=False)
    binary = infgram_binary()
    for seed in (1, 7, 42):
        prompt, max_tokens = "the ", 40
        python = infgram.Index(str(idx)).generate(prompt, max_tokens=max_tokens, seed=seed)["text"]
        cli = subprocess.run(
            [binary, "gen", "--index", str(idx), "--prompt", prompt, "--seed", str(seed),
             "--max-tokens", str(max_tokens), "--json"],
            capture_output=True, text=True, timeout=120, check=True)
        assert json.loads(cli.stdout)["text"] == python, (seed, cli.stdout, python)
        server = subprocess.Popen(
            [binary, "serve", "--addr", "127.0.0.1:0", "--index", f"t={idx}", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            addr = None
            for _ in range(200):
                line = server.stderr.readline()
                if line.startswith("listening on http://"):
                    addr = line.split("http://", 1)[1].split()[0]
                    break
                if not line and server.poll() is not None:
                    break
            assert addr and addr.startswith("127.0.0.1:"), "the server did not start"
            body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "seed": seed}).encode()
            request = urllib.request.Request(f"http://{addr}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as response:
                http = json.loads(response.read())["choices"][0]["text"]
            assert http == python, (seed, http, python)
        finally:
            server.terminate()
            server.wait(timeout=30)


def test_generation_errors_name_python_parameters(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. " * 5)
    infgram.build_index([str(corpus)], str(tmp_path / "idx"), progress=False)
    ix = infgram.Index(str(tmp_path / "idx"))
    for kwargs, name in [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                         ({"max_tokens": 0}, "max_tokens"), ({"k": 0}, "k"), ({"context": 0}, "context")]:
        with pytest.raises(ValueError, match=name):
            ix.generate("the", **kwargs)
