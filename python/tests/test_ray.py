"""infgram.ray on a local Ray cluster of three nodes on 127.0.0.1: a sharded index built
distributed answers every query type as one index of the same documents does (and as the
brute-force count), the query protocol, SBIS generation with the copy guard, and the HTTP API (a
Ray Serve deployment) answer as over one index, a killed shard actor never gives a wrong answer, a failed slice names its file and a
rerun finishes the build, and a manifest that does not match its slices is refused.

Loopback only; loops bounded in count and time; the cluster is shut down by the fixture."""

import gzip
import json
import os
import random
import shutil
import socket
import time
import urllib.error
import urllib.request

import pytest

# Before Ray is imported: every address on 127.0.0.1, and no usage reports.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

if os.environ.get("INFGRAM_REQUIRE_RAY"):
    import ray
else:
    ray = pytest.importorskip("ray")

import infgram  # noqa: E402
import infgram.ray as iray  # noqa: E402
from infgram import _native  # noqa: E402
from infgram.engine import InfiniGramEngine  # noqa: E402

ALPHABET = "ab c\nd"


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    c.wait_for_nodes()
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def random_text(rng, n_max=40):
    return "".join(rng.choice(ALPHABET + "é") for _ in range(rng.randint(0, n_max)))


def write_corpus(root, seed):
    """Text files, JSON-lines files (plain and gzip, blank lines, extra fields) in a tree;
    returns the documents' bytes in the order an index reads them."""
    rng = random.Random(seed)
    (root / "sub").mkdir(parents=True)
    files = {}
    for f in range(rng.randint(1, 3)):
        lines = []
        for i in range(rng.randint(1, 8)):
            lines.append(json.dumps({"text": random_text(rng), "i": i, "f": f}))
            if rng.random() < 0.2:
                lines.append("")
        files[f"c{f}.jsonl"] = "\n".join(lines) + "\n"
    for f in range(rng.randint(1, 3)):
        files[f"sub/t{f}.txt"] = random_text(rng, 80)
    gz = [json.dumps({"text": random_text(rng)}) for _ in range(rng.randint(1, 4))]
    (root / "z.jsonl.gz").write_bytes(gzip.compress(("\n".join(gz) + "\n").encode()))
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    docs = []
    for name in sorted(files) + ["z.jsonl.gz"]:  # the walk's order: c*.jsonl, sub/, z
        if name.endswith(".txt"):
            docs.append(files[name].encode())
        elif name.endswith(".gz"):
            docs += [json.loads(x)["text"].encode() for x in gz]
        else:
            docs += [json.loads(x)["text"].encode() for x in files[name].splitlines() if x]
    return docs


def brute_count(docs, q):
    return sum(1 for d in docs for i in range(len(d) - len(q) + 1) if list(d[i:i + len(q)]) == q)


def sample_queries(seed, docs, n=25):
    rng = random.Random(seed + 7)
    out = [[], [97], [97, 98], [200], [255]]
    for _ in range(n):
        d = rng.choice(docs)
        if d and rng.random() < 0.8:
            i = rng.randrange(len(d))
            out.append(list(d[i:i + rng.randint(1, 6)]))
        else:
            out.append([rng.choice(b"abcd \n") for _ in range(rng.randint(1, 3))])
    return out


def no_latency(text):
    v = json.loads(text)
    v.pop("latency", None)
    return v


def local_remote_index(index_dir):
    """The same HTTP API code over one local index (the oracle of the Serve answers)."""
    idx = infgram.Index(str(index_dir))
    ident = idx.identity()
    return _native.RemoteIndex(idx.answer_shard_queries, ident["shard_infos"], ident["separator"],
                               "bytes", ident["tokenizer"]["fingerprint"])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shards", [1, 2, 5])
def test_every_query_equals_one_index(cluster, tmp_path, seed, shards):
    data = tmp_path / "data"
    docs = write_corpus(data, seed)
    manifest = iray.build([str(data)], str(tmp_path / "sharded"), shards=shards)
    assert len(manifest["slices"]) == min(shards, len(docs))
    assert manifest["documents"] == len(docs)
    infgram.build_index([str(data)], str(tmp_path / "one"), progress=False)
    width = manifest["token_width"]
    one = InfiniGramEngine(str(tmp_path / "one"), eos_token_id=10, vocab_size=256,
                           token_dtype=f"u{8 * width}")
    dirs = [s["dir"] for s in manifest["slices"]]
    same = InfiniGramEngine(dirs, eos_token_id=10, vocab_size=256, token_dtype=f"u{8 * width}")
    with iray.Engine(str(tmp_path / "sharded"), eos_token_id=10, vocab_size=256) as e:
        assert e.get_total_doc_cnt() == one.get_total_doc_cnt() == len(docs)
        assert e.get_num_shards() == same.get_num_shards()
        for q in sample_queries(seed, docs):
            assert e.count(q) == one.count(q), q
            if q:
                assert e.count(q)["count"] == brute_count(docs, q), q
                assert e.prob(q[:-1] or [97], q[-1]) == one.prob(q[:-1] or [97], q[-1]), q
                assert e.infgram_prob(q[:-1], q[-1]) == one.infgram_prob(q[:-1], q[-1]), q
                assert e.search_docs(q, maxnum=3) == same.search_docs(q, maxnum=3), q
                assert e.search_docs(q, maxnum=3)["cnt"] == one.search_docs(q)["cnt"], q
                assert e.count_cnf([[q], [[97], [98]]]) == one.count_cnf([[q], [[97], [98]]]), q
            assert e.ntd(q) == one.ntd(q), q
            assert e.infgram_ntd(q) == one.infgram_ntd(q), q
            assert e.find(q) == same.find(q), q
            assert e.find(q)["cnt"] == one.find(q)["cnt"], q
            assert e.creativity(q) == one.creativity(q), q
            spans = e.attribute(q, [], 1, 2, False)
            assert spans == same.attribute(q, [], 1, 2, False), q
            key = [(s["l"], s["r"], s["count"]) for s in spans["spans"]]
            assert key == [(s["l"], s["r"], s["count"])
                           for s in one.attribute(q, [], 1, 2, False)["spans"]], q
        for i in range(len(docs)):
            assert e.get_doc_by_ix(i, max_disp_len=200) == one.get_doc_by_ix(i, max_disp_len=200)
        assert e.get_docs_by_ixs([0, len(docs) - 1]) == one.get_docs_by_ixs([0, len(docs) - 1])
        for s, seg in enumerate(same.find([97])["segment_by_shard"]):
            for rank in range(seg[0], seg[1]):
                assert e.get_doc_by_rank(s, rank) == same.get_doc_by_rank(s, rank)
                assert e.get_doc_by_rank_2(s, rank, 1, 5) == same.get_doc_by_rank_2(s, rank, 1, 5)
            assert e.get_doc_by_ptr(s, 0) == same.get_doc_by_ptr(s, 0)
        assert e.get_doc_by_ix(len(docs)) == one.get_doc_by_ix(len(docs))  # the error dict
        assert e.get_doc_by_rank(len(dirs) + 9, 0) == same.get_doc_by_rank(len(dirs) + 9, 0)

        # infgram's protocol over the same actors, and the HTTP API's code.
        remote = e.router.index()
        local = infgram.Index(str(tmp_path / "one"))
        oracle = local_remote_index(tmp_path / "one")
        for request in [{"query_type": "count", "text": "ab"},
                        {"query_type": "infgram_ntd", "text": "a b"},
                        {"query_type": "infgram_rows", "text": "ab a b", "window": 4,
                         "estimator": {"name": "sbis", "k": 2}},
                        {"query_type": "get_doc_by_ix", "doc_ix": 0},
                        {"query_type": "creativity", "text": "abc d"},
                        {"query_type": "count", "text": "x" * 3000}]:
            assert json.loads(remote.query_json(json.dumps(request))) == local.query(request)
        # SBIS generation, with and without the copy guard, over the same actors.
        for seed, guard in [(1, None), (2, 3), (3, 1)]:
            args = dict(max_tokens=30, seed=seed, temperature=0.9, guard=guard)
            assert remote.generate("a b", **args) == local.generate("a b", **args), args
        for body in [{"query_type": "count", "query": "ab"},
                     {"query_type": "infgram_prob", "query": "a b"},
                     {"query_type": "ntd", "query_ids": [97]},
                     {"query_type": "search_docs", "query": "a AND b", "maxnum": 1},
                     {"query_type": "nope", "query": "a"}]:
            raw = json.dumps(body).encode()
            (s1, t1), (s2, t2) = remote.api(raw), oracle.api(raw)
            if body["query_type"] == "search_docs":
                assert s1 == s2 == 200 and no_latency(t1)["cnt"] == no_latency(t2)["cnt"]
            else:
                assert (s1, no_latency(t1)) == (s2, no_latency(t2)), body


def test_a_killed_shard_actor_never_gives_a_wrong_answer(cluster, tmp_path):
    data = tmp_path / "data"
    docs = write_corpus(data, 3)
    manifest = iray.build([str(data)], str(tmp_path / "sharded"), shards=3)
    infgram.build_index([str(data)], str(tmp_path / "one"), progress=False)
    w = manifest["token_width"]
    one = InfiniGramEngine(str(tmp_path / "one"), eos_token_id=10, token_dtype=f"u{8 * w}")
    qs = sample_queries(3, docs, n=20)
    expected = [(one.infgram_ntd(q), one.count(q)) for q in qs]
    with iray.Engine(manifest, eos_token_id=10, retries=4, timeout_s=20) as e:
        wrong, failed, answered = 0, 0, []
        deadline = time.time() + 120
        for it in range(60):
            if time.time() > deadline:
                break
            if it in (5, 20, 35):
                ray.kill(e.router.actors[it % 3], no_restart=False)
            k = it % len(qs)
            try:
                got = (e.infgram_ntd(qs[k]), e.count(qs[k]))
            except RuntimeError as err:
                assert "slice" in str(err), err
                failed += 1
                answered.append(False)
                continue
            if any("error" in g for g in got):
                assert all("slice" in g.get("error", "slice") for g in got), got
                failed += 1
                answered.append(False)
                continue
            wrong += got != expected[k]
            answered.append(True)
        assert wrong == 0
        assert all(answered[-10:]), answered  # recovered

    # Past the retry budget: an error naming the slice, not a partial count.
    with iray.Engine(manifest, eos_token_id=10, retries=1, timeout_s=5) as e:
        dead = e.router.actors[1]
        ray.kill(dead, no_restart=True)
        # ray.kill returns before the actor is gone (a call right after may still reach it):
        # wait, bounded, until a call to it fails.
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                ray.get(dead.ready.remote(), timeout=5)
            except Exception:
                break
            time.sleep(0.1)
        with pytest.raises(RuntimeError, match=r"slice 1 .* did not answer after 2 tries"):
            e.count([97])
        with pytest.raises(RuntimeError, match=r"^slice 1 "):
            e.infgram_ntd([97])
        assert "slice 1" in e.search_docs([97])["error"]
        with pytest.raises(RuntimeError, match=r"slice 1 .* did not answer"):
            e.router.index().generate("ab", max_tokens=20, guard=3)


def test_a_failed_slice_names_its_file_and_a_rerun_finishes(cluster, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for f in range(3):
        lines = [json.dumps({"text": f"doc {f} {i} abc"}) for i in range(4)]
        if f == 2:
            lines[2] = "{not json"
        (data / f"p{f}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "sharded"
    with pytest.raises(RuntimeError, match=r"p2\.jsonl:3: not a JSON object"):
        iray.build([str(data)], str(out), shards=3)
    kept = sorted(p.name for p in out.iterdir())
    assert kept == ["plan.json", "slice-0000", "slice-0000.json", "slice-0001", "slice-0001.json"]
    built = {p: (out / p / "index.json").stat().st_mtime_ns for p in ("slice-0000", "slice-0001")}
    lines = (data / "p2.jsonl").read_text().splitlines()
    lines[2] = json.dumps({"text": "doc 2 2 fixed, and longer than it was"})
    (data / "p2.jsonl").write_text("\n".join(lines) + "\n")
    manifest = iray.build([str(data)], str(out), shards=3)
    assert {p: (out / p / "index.json").stat().st_mtime_ns for p in built} == built
    with iray.Engine(manifest, eos_token_id=10) as e:
        assert e.get_total_doc_cnt() == 12
        assert e.count(list(b"fixed"))["count"] == 1
        assert e.get_doc_by_ix(10)["token_ids"][:5] == list(b"doc 2")
    with pytest.raises(ValueError, match="words"):
        iray.build([str(data)], str(tmp_path / "w"), shards=2, tokenizer="words")


def test_a_manifest_that_does_not_match_its_slices_is_refused(cluster, tmp_path):
    data = tmp_path / "data"
    write_corpus(data, 5)
    manifest = iray.build([str(data)], str(tmp_path / "sharded"), shards=2)
    bad = json.loads(json.dumps(manifest))
    bad["slices"][1]["header_crc32"] ^= 1
    with pytest.raises(ValueError, match="refused at start.*header checksum"):
        iray.Engine(bad, eos_token_id=10)
    other = json.loads(json.dumps(manifest))
    other["slices"][0]["fingerprint"] = "0000"
    with pytest.raises(ValueError, match="slice 0 .* another tokenizer"):
        iray.Engine(other, eos_token_id=10)
    # A slice rebuilt behind the manifest's back (another checksum) is refused too.
    shutil.rmtree(manifest["slices"][0]["dir"])
    infgram.build_index([str(data / "sub")], manifest["slices"][0]["dir"], progress=False)
    with pytest.raises(ValueError, match="refused at start"):
        iray.Engine(manifest, eos_token_id=10)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=30):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_ray_serve_answers_the_http_api_as_one_index(cluster, tmp_path):
    from ray import serve

    data = tmp_path / "data"
    write_corpus(data, 8)
    manifest = iray.build([str(data)], str(tmp_path / "sharded"), shards=3)
    infgram.build_index([str(data)], str(tmp_path / "one"), progress=False)
    oracle = local_remote_index(tmp_path / "one")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(iray.serve_app(manifest), name="infgram", route_prefix="/")
        bodies = [{"query_type": "count", "query": "a b"},
                  {"query_type": "infgram_ntd", "query": "ab"},
                  {"query_type": "prob", "query_ids": [97, 98]},
                  {"query_type": "get_doc_by_ix", "doc_ix": 1},
                  {"query_type": "creativity", "query": "abc"},
                  {"query_type": "count", "query": "x" * 2000},
                  {"index": "other", "query_type": "count", "query": "a"}]
        for body in bodies:
            raw = json.dumps(body).encode()
            status, text = post(port, raw)
            want_status, want = oracle.api(raw)
            assert (status, no_latency(text)) == (want_status, no_latency(want)), body
        status, text = post(port, b"{not json")
        assert status == 400 and "error" in json.loads(text)
        assert post(port, json.dumps(bodies[0]).encode())[0] == 200  # and it goes on serving
    finally:
        serve.shutdown()
