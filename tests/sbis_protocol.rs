//! The SBIS protocol of tiny-infini-gram (the reference implementation of "Generating
//! Shakespeare Without Neural Networks"): SBIS perplexity on Tiny Shakespeare must reproduce its
//! published table exactly (to two decimals), and the smoothed estimator must beat it. The
//! protocol is written out in `ARCHITECTURE.md` ("Evaluation protocols").

use infgram::eval::perplexity;
use infgram::ngram::Estimator;
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use infgram::Index;

fn tiny_shakespeare() -> (Vec<u32>, Vec<u32>) {
    let text = infgram::assets::tiny_shakespeare().expect("the in-tree Tiny Shakespeare");
    assert_eq!(text.len(), 1_115_394);
    let cut = text.len() * 9 / 10;
    let tok = ByteTokenizer;
    (
        tok.encode(&text[..cut]).unwrap(),
        tok.encode(&text[cut..]).unwrap(),
    )
}

#[test]
fn seed_table_reproduced() {
    let (train, val) = tiny_shakespeare();
    assert_eq!(train.len(), 1_003_854);
    let index = Index::from_docs(ByteTokenizer.spec(), &[train], 1, true).unwrap();
    for (k, want) in [(1, 4036.19), (2, 97.73), (3, 18.24), (5, 7.10), (-1, 6.06)] {
        let est = Estimator::Sbis { k, decay: 0.1 };
        let r = perplexity(&index, &val, &est, 100, Some(1e-10)).unwrap();
        assert_eq!(r.tokens, val.len() as u64 - 1);
        let got = (r.ppl * 100.0).round() / 100.0;
        eprintln!("k={k}: ppl {:.4} in {:.2} s", r.ppl, r.seconds);
        assert!((got - want).abs() < 1e-9, "k={k}: got {got}, want {want}");
    }
}

#[test]
fn smoothed_estimator_beats_the_seed() {
    let (train, val) = tiny_shakespeare();
    // Discounts fitted on held-out train only (the last 5%, with the first 95% indexed).
    let d = infgram::ngram::smoothed::fit_on_train(&train, ByteTokenizer.spec(), 100).unwrap();
    let index = Index::from_docs(ByteTokenizer.spec(), &[train], 1, true).unwrap();
    let r = perplexity(&index, &val, &Estimator::Smoothed(d), 100, None).unwrap();
    eprintln!("smoothed: ppl {:.4} in {:.2} s", r.ppl, r.seconds);
    assert_eq!(r.floored, 0);
    assert!(r.ppl <= 4.8, "smoothed ppl {}", r.ppl);
}
