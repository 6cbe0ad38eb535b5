"""infgram's classic n-gram models against KenLM itself (the oracle): `lmplz` estimates an
order-5 model of Tiny Shakespeare's train part as words, one sentence a line; infgram's `mkn`
model of the same text gives the val part's perplexity within 0.01% and every sentence's log10
probability within 1e-4 of `kenlm.Model`, and infgram's exported ARPA, loaded by `kenlm.Model`,
scores the same. `python/kenlm-oracle.sh` builds both tools from the PyPI `kenlm` source package
(ci.sh runs it and sets INFGRAM_LMPLZ); without them these tests are skipped, unless
INFGRAM_REQUIRE_KENLM=1."""

import os
import subprocess
from pathlib import Path

import pytest

import infgram

REPO = Path(__file__).resolve().parents[2]
ORDER = 5


def tools():
    lmplz = os.environ.get("INFGRAM_LMPLZ", str(REPO / "target/kenlm/build/bin/lmplz"))
    try:
        import kenlm
    except ImportError:
        kenlm = None
    if kenlm is None or not Path(lmplz).is_file():
        if os.environ.get("INFGRAM_REQUIRE_KENLM") == "1":
            pytest.fail("KenLM is required here: run python/kenlm-oracle.sh VENV first")
        pytest.skip("KenLM's lmplz and kenlm module are not built (python/kenlm-oracle.sh)")
    return lmplz, kenlm


def tiny_shakespeare():
    """The train and val parts (the first 90% and the rest), as `infgram fetch` writes them."""
    binary = REPO / "target/release/infgram"
    if not binary.is_file():
        pytest.skip("target/release/infgram is not built (cargo build --release)")
    whole = subprocess.run([str(binary), "fetch", "tiny-shakespeare"], check=True,
                           capture_output=True, text=True).stdout.strip()
    folder = Path(whole).parent
    return (folder / "train.txt").read_text(), (folder / "val.txt").read_text()


def lines_of(text):
    """The sentences of a text as both tools read them: a final line feed ends the last line."""
    return (text[:-1] if text.endswith("\n") else text).split("\n")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    lmplz, kenlm = tools()
    train, val = tiny_shakespeare()
    tmp = tmp_path_factory.mktemp("kenlm")
    # lmplz drops the </s> of a last line without a line feed (and its back-off weights then
    # drift out of line with their n-grams), so the text given to both ends with one.
    corpus = tmp / "train.txt"
    corpus.write_text(train if train.endswith("\n") else train + "\n")
    theirs = tmp / "lmplz.arpa"
    with open(corpus) as src, open(theirs, "w") as out:
        subprocess.run([lmplz, "-o", str(ORDER), "-S", "1G", "-T", str(tmp)], stdin=src,
                       stdout=out, stderr=subprocess.DEVNULL, check=True)
    infgram.build_index([str(corpus)], str(tmp / "index"), tokenizer="words", sentences=True,
                        progress=False)
    ours = infgram.Index(str(tmp / "index")).ngram_model(ORDER, "mkn")
    return kenlm, kenlm.Model(str(theirs)), ours, val, tmp


def test_perplexity_and_every_sentence_equal_kenlms(models):
    kenlm, theirs, ours, val, _ = models
    sentences = lines_of(val)
    report = ours.perplexity(val)
    assert report["sentences"] == len(sentences)
    want = [theirs.score(s) for s in sentences]
    worst = max(abs(a - b) for a, b in zip(report["sentence_log10"], want))
    assert worst < 1e-4, worst
    tokens = sum(len(s.split()) + 1 for s in sentences)
    assert report["tokens"] == tokens
    kenlm_ppl = 10 ** (-sum(want) / tokens)
    assert abs(report["ppl"] - kenlm_ppl) / kenlm_ppl < 1e-4, (report["ppl"], kenlm_ppl)
    assert abs(ours.score(sentences[3]) - want[3]) < 1e-4


def test_the_exported_arpa_loaded_by_kenlm_scores_the_same(models):
    kenlm, theirs, ours, val, tmp = models
    path = tmp / "infgram.arpa"
    summary = ours.export_arpa(str(path))
    assert len(summary["ngrams"]) == ORDER
    loaded = kenlm.Model(str(path))
    assert loaded.order == ORDER
    for s in lines_of(val)[:2000]:
        assert abs(loaded.score(s) - theirs.score(s)) < 1e-4, s


def test_the_quick_brown_fox_and_bad_input(tmp_path):
    """Without KenLM: lmplz's numbers for the worked example (order 3, fallback discounts), and
    bad input is an exception that says what to do."""
    text = tmp_path / "fox.txt"
    text.write_text("the quick brown fox the quick red fox\n")
    infgram.build_index([str(text)], str(tmp_path / "fox"), tokenizer="words", sentences=True,
                        progress=False)
    index = infgram.Index(str(tmp_path / "fox"))
    with pytest.raises(ValueError, match="discount"):
        index.ngram_model(3)
    model = index.ngram_model(3, discount_fallback=[0.5, 1.0, 1.5])
    # lmplz -o 3 --discount_fallback: <s> the quick (-0.105970904) quick red fox (-0.097394995)
    # then red fox </s> (-0.18145601), for the sentence "the quick red fox".
    assert model.score("quick red fox") < 0
    arpa = tmp_path / "fox.arpa"
    model.export_arpa(str(arpa))
    assert "-0.1059709\t<s> the quick" in arpa.read_text()
    with pytest.raises(ValueError, match="mkn"):
        index.ngram_model(3, "kneser")
    mle = index.ngram_model(2, "add_alpha", alpha=0.0)
    assert mle.score("fox quick") == float("-inf")
    with pytest.raises(ValueError, match="floor"):
        mle.perplexity("fox quick")
    assert mle.perplexity("fox quick", floor=1e-6)["floored"] == 3
