//! The memo of short reversed-suffix-array ranges (`Shard::rrange_short`, the first two
//! narrowing steps of every suffix search) answers what narrowing from the whole array
//! answers: for 1-byte tokens (a table of every pair), 2-byte tokens (ids below 2^16 and a
//! direct-mapped table of pairs, where pairs share slots) and 4-byte tokens (ids past the memo
//! are refused, and the search narrows by itself), on first use and from the memo.

use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;

/// Narrowing from the whole reversed array: `[.., x1, x0]`'s range.
fn narrowed<S: AsRef<[u8]>>(
    shard: &infgram::index::Shard<S>,
    x0: u32,
    x1: Option<u32>,
) -> (usize, usize) {
    let r = shard.rnarrow((0, shard.len()), 0, x0);
    match x1 {
        None => r,
        Some(x1) => shard.rnarrow(r, 1, x1),
    }
}

fn check(alphabet: &[u32], vocab: usize, docs: &[Vec<usize>], per_shard: usize) {
    let docs: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| d.iter().map(|&i| alphabet[i % alphabet.len()]).collect())
        .collect();
    let index = Index::from_docs(TokenizerSpec::synthetic(vocab), &docs, per_shard, true).unwrap();
    for shard in index.shards() {
        // Twice: computed, then from the memo (every pair shares slots with others).
        for _ in 0..2 {
            for &x0 in alphabet {
                if let Some(r) = shard.rrange_short(x0, None) {
                    assert_eq!(r, narrowed(shard, x0, None), "{x0}");
                } else {
                    assert!(x0 >= 1 << 16 || vocab <= 256, "{x0} refused");
                }
                for &x1 in alphabet {
                    if let Some(r) = shard.rrange_short(x0, Some(x1)) {
                        assert_eq!(r, narrowed(shard, x0, Some(x1)), "{x0} {x1}");
                    }
                }
            }
        }
    }
    // The suffix searches that start from the memo: each suffix of a context that occurs has
    // as many occurrences as a brute-force count of the shard finds.
    for shard in index.shards() {
        let text: Vec<u32> = (0..shard.len()).map(|i| shard.tok(i)).collect();
        for d in &docs {
            for end in 1..=d.len() {
                let ctx = &d[end.saturating_sub(6)..end];
                let occs = shard.suffix_occs(ctx);
                for (l, occ) in occs.iter().enumerate().skip(1) {
                    let q = &ctx[ctx.len() - l..];
                    let want = text.windows(l).filter(|w| *w == q).count();
                    assert_eq!(occ.len(), want, "{q:?}");
                }
                let longer = occs.len() - 1;
                if longer < ctx.len() {
                    let q = &ctx[ctx.len() - longer - 1..];
                    assert!(!text.windows(q.len()).any(|w| w == q), "{q:?} occurs");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_memo_answers_as_narrowing_does(
        docs in prop::collection::vec(prop::collection::vec(0usize..64, 0..40), 1..6),
        per_shard in 1usize..4,
    ) {
        // 1-byte tokens.
        check(&[0, 1, 7, 97, 98, 99, 200, 255], 256, &docs, per_shard);
        // 2-byte tokens, the largest ids included.
        check(&[1, 256, 257, 513, 1000, 40_000, 65_534, 65_535], 65_536, &docs, per_shard);
        // 4-byte tokens: ids past the memo beside ids in it.
        check(&[2, 300, 65_535, 65_536, 70_000, 1 << 20], 1 << 21, &docs, per_shard);
    }
}
