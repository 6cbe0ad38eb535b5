"""infgram.engine.InfiniGramEngine against infini-gram 2.6.0's engine, method by method, on
random corpora (u8 and u16 ids, several documents, several shards), over indexes written by
infini-gram's indexer and by infgram; CNF counts against a brute-force oracle; bad arguments
and damaged directories."""

import shutil

import pytest

from conftest import infgram_index, infini_gram_index, queries, random_corpus

CASES = [(seed, dtype, shards) for seed in range(6) for dtype in ("u8", "u16") for shards in (1, 3)]


def occurrences(docs, q):
    """(doc, start) of every occurrence of q inside a document."""
    return [(i, j) for i, d in enumerate(docs) for j in range(len(d) - len(q) + 1) if q and d[j:j + len(q)] == q]


def same(theirs, ours, what):
    assert ours == theirs, f"{what}: infini-gram {theirs} vs infgram {ours}"


def brute_count(docs, q):
    return sum(len(d) + 1 for d in docs) if not q else len(occurrences(docs, q))


def brute_ntd(docs, q, eos=0):
    """infini-gram's ntd: every occurrence has a next token, a document's end counting as eos."""
    counts = {}
    if not q:
        nexts = [t for d in docs for t in d + [eos]]
    else:
        nexts = [docs[d][j + len(q)] if j + len(q) < len(docs[d]) else eos for d, j in occurrences(docs, q)]
    for t in nexts:
        counts[t] = counts.get(t, 0) + 1
    n = len(nexts)
    return {"prompt_cnt": n, "result_by_token_id": {t: {"cont_cnt": c, "prob": c / n} for t, c in sorted(counts.items())}, "approx": False}


def brute_infgram_ntd(docs, q, eos=0):
    l = next((l for l in range(len(q), 0, -1) if brute_count(docs, q[len(q) - l:])), 0)
    return dict(brute_ntd(docs, q[len(q) - l:], eos), suffix_len=l)


# infini-gram 2.6.0's ntd sometimes reports continuations as eos (0) on small ranges; infgram's
# answer is checked against brute force first, so such cases are recorded, not compared.
KNOWN_NTD_BUG = []


def moved_to_eos(theirs, ours):
    """Whether infini-gram's answer is the right one (ours, checked by brute force) with some
    continuations counted under eos (id 0) instead."""
    a, b = theirs["result_by_token_id"], ours["result_by_token_id"]
    cnt = lambda r, t: r.get(t, {"cont_cnt": 0})["cont_cnt"]
    return (
        theirs["prompt_cnt"] == ours["prompt_cnt"]
        and cnt(a, 0) > cnt(b, 0)
        and all(cnt(a, t) <= cnt(b, t) for t in a if t != 0)
    )


def check_ntd(theirs, ours, docs, q, dtype):
    for method, oracle in (("ntd", brute_ntd), ("infgram_ntd", brute_infgram_ntd)):
        b = getattr(ours, method)(q)
        same(oracle(docs, q), b, f"brute-force {method} {q}")
        a = getattr(theirs, method)(q)
        if a["approx"]:
            continue  # infini-gram sampled (max_support); infgram is exact
        if a != b and moved_to_eos(a, b):
            KNOWN_NTD_BUG.append((method, q))
            continue
        same(a, b, f"{method} {q}")


KNOWN_CREATIVITY_BUG = []  # infini-gram 2.6.0 misses some spans that start with id 0


def check_creativity(theirs, ours, docs, q):
    want = [i + max((l for l in range(len(q) - i + 1) if brute_count(docs, q[i:i + l]) or l == 0), default=0)
            for i in range(len(q))]
    b = ours.creativity(q)
    same({"rs": want}, b, f"brute-force creativity {q}")
    a = theirs.creativity(q)
    if a != b and all(x <= y for x, y in zip(a["rs"], b["rs"])):
        KNOWN_CREATIVITY_BUG.append(q)
        return
    same(a, b, f"creativity {q}")


@pytest.mark.parametrize("seed,dtype,shards", CASES)
def test_every_method_on_infini_gram_index(tmp_path, engines, seed, dtype, shards):
    docs = random_corpus(seed, dtype)
    shards = min(shards, len(docs))
    ig_dir = infini_gram_index(tmp_path / "ig", docs, dtype, shards)
    theirs, ours = engines(ig_dir, dtype)
    same(theirs.get_total_doc_cnt(), ours.get_total_doc_cnt(), "get_total_doc_cnt")
    for q in queries(seed, docs):
        same(theirs.count(q), ours.count(q), f"count {q}")
        same(theirs.find(q), ours.find(q), f"find {q}")
        if q:
            same(theirs.prob(q[:-1], q[-1]), ours.prob(q[:-1], q[-1]), f"prob {q}")
            same(theirs.infgram_prob(q[:-1], q[-1]), ours.infgram_prob(q[:-1], q[-1]), f"infgram_prob {q}")
        check_ntd(theirs, ours, docs, q, dtype)
        check_creativity(theirs, ours, docs, q)
        # Documents: every rank of the segment, by rank and by pointer, with windows.
        for s, (lo, hi) in enumerate(ours.find(q)["segment_by_shard"]):
            for rank in range(lo, min(hi, lo + 4)):
                if theirs.get_doc_by_rank(s, rank)["needle_offset"] > 2**32:
                    continue  # a separator: infini-gram's needle_offset underflows there
                for mdl in (1000, 7):
                    same(theirs.get_doc_by_rank(s, rank, mdl), ours.get_doc_by_rank(s, rank, mdl), f"rank {s} {rank}")
                same(theirs.get_doc_by_rank_2(s, rank, len(q), 3), ours.get_doc_by_rank_2(s, rank, len(q), 3), "rank_2")
        if q:
            a, b = theirs.search_docs(q, maxnum=3), ours.search_docs(q, maxnum=3)
            same(a["cnt"], b["cnt"], f"search_docs cnt {q}")
            assert len(b["documents"]) == min(3, b["cnt"]) or b["cnt"] > len(b["documents"])
            for d in b["documents"]:
                k = d["needle_offset"]
                assert d["token_ids"][k:k + len(q)] == q[: d["disp_len"] - k]
    for ix in range(ours.get_total_doc_cnt()):
        same(theirs.get_doc_by_ix(ix), ours.get_doc_by_ix(ix), f"doc {ix}")
        same(theirs.get_doc_by_ix(ix, max_disp_len=3), ours.get_doc_by_ix(ix, max_disp_len=3), f"doc {ix}")
        same(theirs.get_doc_by_ix_2(ix, 4), ours.get_doc_by_ix_2(ix, 4), f"doc_2 {ix}")
    w = 1 if dtype == "u8" else 2
    for s in range(shards):
        data = (ig_dir / f"tokenized.{s}").read_bytes()
        for ptr in range(0, len(data), 2 * w):  # infini-gram takes even pointers only
            if data[ptr:ptr + w] == b"\xff" * w:
                continue  # a separator: infini-gram's needle_offset underflows to 2^64 - 1 there
            same(theirs.get_doc_by_ptr(s, ptr, 9), ours.get_doc_by_ptr(s, ptr, 9), f"ptr {s} {ptr}")
            same(theirs.get_doc_by_ptr_2(s, ptr, 2, 3), ours.get_doc_by_ptr_2(s, ptr, 2, 3), f"ptr_2 {s} {ptr}")


@pytest.mark.parametrize("seed,dtype,shards", CASES)
def test_infgram_index_answers_like_infini_gram(tmp_path, engines, seed, dtype, shards):
    """The same documents indexed by infgram: every count and distribution as infini-gram's
    engine answers over its own index of them."""
    docs = random_corpus(seed, dtype)
    shards = min(shards, len(docs))
    ig_dir = infini_gram_index(tmp_path / "ig", docs, dtype, shards)
    ours_dir = infgram_index(tmp_path / "ours", docs, dtype, docs_per_shard=2)
    theirs, _ = engines(ig_dir, dtype)
    _, ours = engines(ours_dir, dtype)
    same(theirs.get_total_doc_cnt(), ours.get_total_doc_cnt(), "get_total_doc_cnt")
    for q in queries(seed, docs):
        same(theirs.count(q), ours.count(q), f"count {q}")
        same(theirs.find(q)["cnt"], ours.find(q)["cnt"], f"find {q}")
        if q:
            same(theirs.prob(q[:-1], q[-1]), ours.prob(q[:-1], q[-1]), f"prob {q}")
            same(theirs.infgram_prob(q[:-1], q[-1]), ours.infgram_prob(q[:-1], q[-1]), f"infgram_prob {q}")
            same(theirs.search_docs(q)["cnt"], ours.search_docs(q)["cnt"], f"search_docs {q}")
        check_ntd(theirs, ours, docs, q, dtype)
        check_creativity(theirs, ours, docs, q)
    # Documents in infgram's order (shards of 2 documents, in order) are the same documents.
    for ix in range(ours.get_total_doc_cnt()):
        d = ours.get_doc_by_ix(ix)
        assert d["token_ids"] == docs[ix] and d["doc_len"] == len(docs[ix])
        assert f'"linenum": {ix},' in d["metadata"] and d["metadata"].endswith("\n")


@pytest.mark.parametrize("seed", range(8))
def test_cnf_counts_against_brute_force(tmp_path, engines, seed):
    """count_cnf / search_docs_cnf / find_cnf: occurrences of the rarest clause with every other
    clause within max_diff_tokens in the same document (exactly; infini-gram 2.6.0's engine
    undercounts some, so the oracle is brute force)."""
    docs = random_corpus(seed, "u16", n_docs=5)
    _, ours = engines(infini_gram_index(tmp_path / "ig", docs, "u16", 2), "u16")
    qs = [q for q in queries(seed, docs, 12) if q]
    for a, b in zip(qs, qs[1:]):
        cnf = [[a[:2]], [b[:1]]]
        rare, other = sorted(cnf, key=lambda c: len(occurrences(docs, c[0])))
        want = sum(
            1 for d, j in occurrences(docs, rare[0])
            if any(dd == d and abs(jj - j) <= 100 + len(rare[0]) for dd, jj in occurrences(docs, other[0]))
        )
        got = ours.count_cnf(cnf)
        assert got == {"count": want, "approx": False}, (cnf, got, want)
        assert ours.find_cnf(cnf)["cnt"] == want
        assert ours.search_docs_cnf(cnf)["cnt"] == want


def test_multiple_directories_are_one_engine(tmp_path, engines):
    docs = random_corpus(3, "u16", n_docs=6)
    a = infini_gram_index(tmp_path / "a", docs[:3], "u16")
    b = infini_gram_index(tmp_path / "b", docs[3:], "u16")
    whole = infini_gram_index(tmp_path / "w", docs, "u16")
    from infgram.engine import InfiniGramEngine

    both = InfiniGramEngine(index_dir=[str(a), str(b)], eos_token_id=0, token_dtype="u16")
    one = InfiniGramEngine(index_dir=str(whole), eos_token_id=0, token_dtype="u16")
    assert both.get_num_shards() == 2 and both.get_total_doc_cnt() == 6
    for q in queries(3, docs):
        assert both.count(q) == one.count(q)
        assert both.ntd(q) == one.ntd(q)


def test_bad_arguments_give_error_dicts(tmp_path, engines):
    docs = random_corpus(1, "u16")
    theirs, ours = engines(infini_gram_index(tmp_path / "ig", docs, "u16"), "u16")
    for call in [
        lambda e: e.count("abc"),
        lambda e: e.count([1, -1]),
        lambda e: e.count([70000]),
        lambda e: e.count([1.5]),
        lambda e: e.prob([1], -3),
        lambda e: e.prob([1], "x"),
        lambda e: e.ntd([1], max_support=0),
        lambda e: e.infgram_ntd(None),
        lambda e: e.count_cnf([]),
        lambda e: e.count_cnf([[[]]]),
        lambda e: e.count_cnf([[1]]),
        lambda e: e.count_cnf([[[1]]], max_clause_freq=0),
        lambda e: e.search_docs([1], maxnum=0),
        lambda e: e.get_doc_by_rank(5, 0),
        lambda e: e.get_doc_by_rank(0, 10**9),
        lambda e: e.get_doc_by_ptr(0, 1),
        lambda e: e.get_doc_by_ix(-1),
        lambda e: e.get_doc_by_ix(10**6),
        lambda e: e.get_doc_by_rank_2(0, 0, -1, 3),
        lambda e: e.attribute([1, 2], [], 1, 0, False),
    ]:
        a, b = call(theirs), call(ours)
        assert isinstance(b, dict) and set(b) == {"error"} and b["error"], b
        assert isinstance(a, dict) and "error" in a, a


def test_constructor_and_damaged_directories(tmp_path):
    from infgram.engine import InfiniGramEngine

    docs = random_corpus(2, "u16", n_docs=4)
    good = infini_gram_index(tmp_path / "ig", docs, "u16")
    with pytest.raises(ValueError, match="token_dtype"):
        InfiniGramEngine(index_dir=str(good), eos_token_id=0, token_dtype="u8", vocab_size=255)
    with pytest.raises(ValueError, match="Unsupported token dtype"):
        InfiniGramEngine(index_dir=str(good), eos_token_id=0, token_dtype="u64")
    with pytest.raises(ValueError, match="eos_token_id"):
        InfiniGramEngine(index_dir=str(good), eos_token_id=70000)
    with pytest.raises(ValueError, match="no index here"):
        InfiniGramEngine(index_dir=str(tmp_path / "nothing"), eos_token_id=0)
    # A truncated table, offsets that miss the separators, metadata of another length.
    for name, damage in [
        ("table.0", lambda b: b[:-1]),
        ("offset.0", lambda b: b[:8] + (int.from_bytes(b[8:16], "little") + 2).to_bytes(8, "little") + b[16:]),
        ("metaoff.0", lambda b: b[:-8]),
        ("tokenized.0", lambda b: b[:-2]),
    ]:
        bad = tmp_path / f"bad-{name}"
        shutil.copytree(good, bad)
        path = bad / name
        path.write_bytes(damage(path.read_bytes()))
        with pytest.raises(ValueError, match=name.split(".")[0] + "|table"):
            InfiniGramEngine(index_dir=str(bad), eos_token_id=0)
    # infgram's own index: a damaged file is caught by its checksums.
    ours = infgram_index(tmp_path / "ours", docs, "u16")
    sa = ours / "shard-0000" / "sa.bin"
    data = bytearray(sa.read_bytes())
    data[0] ^= 0xFF
    sa.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sa.bin"):
        InfiniGramEngine(index_dir=str(ours), eos_token_id=0)


def test_threads_share_an_engine(tmp_path, engines):
    """Queries release the GIL: threads sharing one engine get the answers of one thread."""
    from concurrent.futures import ThreadPoolExecutor

    docs = random_corpus(4, "u16", n_docs=8)
    _, ours = engines(infini_gram_index(tmp_path / "ig", docs, "u16"), "u16")
    qs = queries(4, docs, 200)
    want = [(ours.count(q), ours.infgram_ntd(q)) for q in qs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda q: (ours.count(q), ours.infgram_ntd(q)), qs))
    assert got == want
