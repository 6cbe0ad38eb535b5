"""The batch ∞-gram API for any model: ``Index.infgram_rows`` equals the query protocol's
``infgram_ntd`` of every prefix on random corpora, and ``InfgramRows.mix`` / ``mix_targets``
equal a numpy computation of the mixture ``ln(λ·P∞ + (1 − λ)·softmax(logits))``; bad input is
a ``ValueError``, never a crash."""

import json
import random

import pytest

import infgram

np = pytest.importorskip("numpy")

EOS = 5  # the stand-in neural model's end token (not a corpus token)
VOCAB = 8  # its number of logits


def random_index(tmp_path, seed):
    rng = random.Random(seed)
    docs = [[rng.choice([0, 1, 1, 2, 3]) for _ in range(rng.randrange(1, 30))] for _ in range(rng.randrange(1, 6))]
    infgram.build_index_from_ids(docs, str(tmp_path / f"idx{seed}"), 5, docs_per_shard=rng.choice([1, 2, 10]))
    return infgram.Index(str(tmp_path / f"idx{seed}")), rng


@pytest.mark.parametrize("seed", range(6))
def test_rows_are_infgram_ntd_of_every_prefix(tmp_path, seed):
    ix, rng = random_index(tmp_path, seed)
    text = [rng.choice([0, 1, 2, 3, EOS]) for _ in range(rng.randrange(1, 40))]
    window = rng.choice([3, 500])
    rows = ix.infgram_rows(np.array(text, dtype=np.int64), window=window, end_token=EOS, vocab=VOCAB)
    assert len(rows) == len(text) and rows.offsets.shape == (len(text) + 1,)
    assert rows.vocab == VOCAB and rows.estimator == {"name": "infgram"}
    for j in range(len(text)):
        start = max(j + 1 - window, 0)
        ends = [i for i in range(j + 1) if text[i] == EOS]
        start = max(start, ends[-1] + 1 if ends else 0)
        want = ix.query({"query_type": "infgram_ntd", "input_ids": text[start : j + 1], "eos_token_id": EOS})
        ids, probs = rows.row(j)
        got = dict(zip(ids.tolist(), probs.tolist()))
        expect = {int(t): v["cont_cnt"] / want["prompt_cnt"] for t, v in want["result_by_token_id"].items()}
        assert sorted(got) == sorted(expect), (j, text[start : j + 1])
        for t in got:
            assert got[t] == pytest.approx(expect[t], rel=1e-6)
        assert rows.suffix_len[j] == want["suffix_len"] and rows.count[j] == want["prompt_cnt"]
    dense = rows.dense()
    assert dense.shape == (len(text), VOCAB)
    assert np.allclose(dense.sum(axis=1), 1.0, atol=1e-5)


def numpy_mixture(rows, logits, lambdas):
    """ln(λ·P∞ + (1 − λ)·softmax(logits)), row by row, in float64."""
    x = logits.astype(np.float64)
    q = np.exp(x - x.max(axis=1, keepdims=True))
    q /= q.sum(axis=1, keepdims=True)
    p = rows.dense().astype(np.float64)
    with np.errstate(divide="ignore"):
        return np.log(lambdas[:, None] * p + (1 - lambdas[:, None]) * q)


@pytest.mark.parametrize("seed", range(4))
def test_mix_equals_numpy(tmp_path, seed):
    ix, rng = random_index(tmp_path, seed)
    text = [rng.choice([0, 1, 2, 3]) for _ in range(rng.randrange(2, 30))]
    logits = np.random.default_rng(seed).normal(size=(len(text), VOCAB)).astype(np.float32) * 3
    table = {"estimator": {"name": "sbis", "k": 2}, "edges": [1, 3], "sparse": [0.1, 0.5, 0.9], "dense": [0.0, 0.2, 1.0]}
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(table))
    for mixer in [None, "default", table, str(path), {"estimator": {"name": "infgram"}, "edges": [], "sparse": [0.3], "dense": [0.3]}]:
        rows = ix.infgram_rows(text, end_token=EOS, vocab=VOCAB, mixer="default" if mixer is None else mixer)
        lambdas = rows.lambdas(mixer)
        assert lambdas.shape == (len(text),) and ((0 <= lambdas) & (lambdas <= 1)).all()
        if isinstance(mixer, dict) and mixer["edges"]:
            # λ by the table: suffix-length bucket, sparse (one continuation) or not.
            for j in range(len(text)):
                b = sum(e <= rows.suffix_len[j] for e in mixer["edges"])
                want = mixer["sparse" if rows.distinct[j] == 1 else "dense"][b]
                assert lambdas[j] == want
        mixed = rows.mix(logits, mixer)
        want = numpy_mixture(rows, logits, lambdas)
        assert mixed.shape == logits.shape and mixed.dtype == np.float32
        finite = np.isfinite(want)
        assert (np.isfinite(mixed) == finite).all()
        assert np.allclose(mixed[finite], want[finite], atol=1e-5)
        targets = np.array(text[1:])
        x = logits.astype(np.float64)
        neural = (x - np.log(np.exp(x).sum(axis=1, keepdims=True)))[np.arange(len(targets)), targets]
        at = rows.mix_targets(targets, neural, mixer)
        assert np.allclose(at, want[np.arange(len(targets)), targets], atol=1e-5)


def test_bad_input_is_a_value_error(tmp_path):
    ix, _ = random_index(tmp_path, 0)
    rows = ix.infgram_rows([0, 1, 2], end_token=EOS, vocab=VOCAB)
    with pytest.raises(ValueError, match="negative|ids"):
        ix.infgram_rows([0, -1])
    with pytest.raises(ValueError, match="estimator"):
        ix.infgram_rows([0, 1], estimator={"name": "no_such"})
    with pytest.raises(ValueError, match="window"):
        ix.infgram_rows([0, 1], window=0)
    with pytest.raises(ValueError, match="end token"):
        ix.infgram_rows([0, 1], end_token=9, vocab=4)
    with pytest.raises(ValueError, match="shape"):
        rows.mix(np.zeros((2, VOCAB)))
    one = {"estimator": {"name": "infgram"}, "edges": [], "sparse": [0.5], "dense": [0.5]}
    with pytest.raises(ValueError, match="outside"):
        rows.mix(np.zeros((3, 2)), one)
    with pytest.raises(ValueError, match="estimator"):
        rows.mix(np.zeros((3, VOCAB)))  # the built-in mixer wants SBIS with two levels
    with pytest.raises(ValueError, match="targets"):
        rows.mix_targets([1, 2, 3, 4], [0.0] * 4, one)
    with pytest.raises(ValueError, match="λ|between"):
        rows.lambdas({"estimator": {"name": "infgram"}, "edges": [], "sparse": [1.5], "dense": [0.5]})
    with pytest.raises(ValueError, match="mixer"):
        rows.lambdas({"edges": []})
    assert len(ix.infgram_rows([])) == 0
