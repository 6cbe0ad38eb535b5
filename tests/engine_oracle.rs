//! Every query type against a brute-force oracle on small random corpora (proptest), for token
//! widths 1, 2 and 4, on 1, 2 and 5 shards (each query answered shard by shard and merged),
//! with and without the reversed suffix array; plus a table of edge cases.

use infgram::index::query::Match;
use infgram::index::shards::Shards;
use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// All occurrences (doc, start) of `q` inside documents.
fn occurrences(docs: &[Vec<u32>], q: &[u32]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (d, doc) in docs.iter().enumerate() {
        if q.is_empty() {
            continue;
        }
        for i in 0..doc.len() {
            if doc.len() - i >= q.len() && doc[i..i + q.len()] == *q {
                out.push((d, i));
            }
        }
    }
    out
}

/// `count`: occurrences; the empty query counts every position, one separator per document.
fn brute_count(docs: &[Vec<u32>], q: &[u32]) -> u64 {
    if q.is_empty() {
        return docs.iter().map(|d| d.len() as u64 + 1).sum();
    }
    occurrences(docs, q).len() as u64
}

/// `ntd` as infini-gram defines it: every occurrence has a next token, a document's end
/// counting as `eos` (and left out without one).
fn brute_ntd(docs: &[Vec<u32>], q: &[u32], eos: Option<u32>) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    let mut add = |t: Option<u32>| {
        if let Some(t) = t.or(eos) {
            *m.entry(t).or_default() += 1;
        }
    };
    if q.is_empty() {
        for d in docs {
            for &t in d {
                add(Some(t));
            }
            add(None);
        }
        return m;
    }
    for (d, i) in occurrences(docs, q) {
        add(docs[d].get(i + q.len()).copied());
    }
    m
}

/// The ∞-gram of the query API: the longest suffix that occurs.
fn brute_infgram(docs: &[Vec<u32>], p: &[u32], eos: Option<u32>) -> (usize, BTreeMap<u32, u64>) {
    for l in (1..=p.len()).rev() {
        if brute_count(docs, &p[p.len() - l..]) > 0 {
            return (l, brute_ntd(docs, &p[p.len() - l..], eos));
        }
    }
    (0, brute_ntd(docs, &[], eos))
}

/// Matching anchors of a two-clause CNF `[[a], [b]]` by brute force: occurrences of the rarer
/// n-gram with an occurrence of the other within `max_diff` tokens in the same document.
fn brute_cnf(docs: &[Vec<u32>], a: &[u32], b: &[u32], max_diff: usize) -> u64 {
    let (oa, ob) = (occurrences(docs, a), occurrences(docs, b));
    let (rare, rl, other, ol) = if oa.len() <= ob.len() {
        (oa, a.len(), ob, b.len())
    } else {
        (ob, b.len(), oa, a.len())
    };
    rare.iter()
        .filter(|&&(d, j)| {
            other.iter().any(|&(dd, jj)| {
                dd == d && jj + max_diff >= j && jj <= j + rl + max_diff && jj + ol <= docs[d].len()
            })
        })
        .count() as u64
}

/// The document queries, by brute force: every document whole by its number, single-clause and
/// two-clause searches (counts, and the documents shown: the first matching ones in order).
fn check_documents(idx: &Index<Vec<u8>>, docs: &[Vec<u32>], queries: &[Vec<u32>]) {
    for (d, doc) in docs.iter().enumerate() {
        let got = idx.get_doc_by_ix(d as u64, 1000).unwrap();
        assert_eq!((got.doc_ix, &got.token_ids), (d as u64, doc), "doc {d}");
    }
    assert!(idx.get_doc_by_ix(docs.len() as u64, 10).is_err());
    for q in queries.iter().filter(|q| !q.is_empty()) {
        let r = idx
            .search_docs(&[vec![q.clone()]], 3, 10, 1000, 1000)
            .unwrap();
        assert_eq!(r.cnt, brute_count(docs, q), "search_docs {q:?}");
        let mut want: Vec<u64> = occurrences(docs, q).iter().map(|o| o.0 as u64).collect();
        want.dedup();
        want.truncate(3);
        let got: Vec<u64> = r.documents.iter().map(|d| d.doc_ix).collect();
        assert_eq!(got, want, "search_docs documents {q:?}");
        for d in &r.documents {
            assert_eq!(d.token_ids, docs[d.doc_ix as usize], "window of {q:?}");
        }
        for b in queries.iter().filter(|b| !b.is_empty()).take(3) {
            let r = idx
                .search_docs(&[vec![q.clone()], vec![b.clone()]], 0, 2, 1000, 10)
                .unwrap();
            assert_eq!(r.cnt, brute_cnf(docs, q, b, 2), "cnf {q:?} AND {b:?}");
        }
    }
}

fn check_all(docs: &[Vec<u32>], vocab: usize, queries: &[Vec<u32>]) {
    // One shard, two, and five (or one per document when there are fewer).
    for shards in [1, 2, 5] {
        let per_shard = docs.len().div_ceil(shards).max(1);
        for reverse in [true, false] {
            let idx = Index::from_docs(TokenizerSpec::synthetic(vocab), docs, per_shard, reverse)
                .unwrap();
            check_documents(&idx, docs, queries);
            for q in queries {
                assert_eq!(
                    idx.count(q).unwrap().count,
                    brute_count(docs, q),
                    "count {q:?}"
                );
                if !q.is_empty() {
                    assert_eq!(idx.find(q).unwrap().cnt, brute_count(docs, q), "find {q:?}");
                }
                for eos in [None, Some(0), Some(vocab as u32 + 7)] {
                    let got = idx.ntd(q, eos).unwrap();
                    assert_eq!(got.prompt_cnt, brute_count(docs, q), "ntd prompt_cnt {q:?}");
                    let ntd: BTreeMap<u32, u64> = got
                        .result_by_token_id
                        .into_iter()
                        .map(|(t, p)| (t, p.cont_cnt))
                        .collect();
                    assert_eq!(ntd, brute_ntd(docs, q, eos), "ntd {q:?} eos {eos:?}");
                    let (l, m) = brute_infgram(docs, q, eos);
                    let got = idx.infgram_ntd(q, eos).unwrap();
                    assert_eq!(got.suffix_len, Some(l), "infgram suffix_len {q:?}");
                    assert_eq!(got.prompt_cnt, brute_count(docs, &q[q.len() - l..]));
                    let got: BTreeMap<u32, u64> = got
                        .result_by_token_id
                        .into_iter()
                        .map(|(t, p)| (t, p.cont_cnt))
                        .collect();
                    assert_eq!(got, m, "infgram_ntd {q:?} eos {eos:?}");
                }
                if let Some((&last, prompt)) = q.split_last() {
                    let pr = idx.prob(prompt, last).unwrap();
                    assert_eq!(pr.prompt_cnt, brute_count(docs, prompt));
                    assert_eq!(pr.cont_cnt, brute_count(docs, q));
                    let ip = idx.infgram_prob(prompt, last).unwrap();
                    let (l, _) = brute_infgram(docs, prompt, None);
                    let suffix = &prompt[prompt.len() - l..];
                    assert_eq!(ip.suffix_len, Some(l));
                    assert_eq!(ip.prompt_cnt, brute_count(docs, suffix));
                    assert_eq!(ip.cont_cnt, brute_count(docs, &[suffix, &[last]].concat()));
                }
                // longest_match against brute force.
                let lm = idx.longest_match(q).unwrap();
                for (j, got) in lm.iter().enumerate() {
                    let mut want = Match { len: 0, count: 0 };
                    for l in (1..=j + 1).rev() {
                        let c = brute_count(docs, &q[j + 1 - l..=j]);
                        if c > 0 {
                            want = Match { len: l, count: c };
                            break;
                        }
                    }
                    assert_eq!(*got, want, "longest_match {q:?} at {j}");
                }
            }
        }
    }
}

/// A random corpus over `vocab` ids with a skewed distribution (so n-grams repeat), plus
/// queries cut from it and random ones.
fn corpus_and_queries(vocab: u32) -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<Vec<u32>>)> {
    let small = 2u32; // a frequent sub-alphabet, so n-grams repeat
    let tok = prop_oneof![
        3 => 0..small.min(vocab),
        1 => 0..vocab,
        1 => Just(vocab - 1),
    ];
    let docs = prop::collection::vec(prop::collection::vec(tok.clone(), 0..40), 1..11);
    let qs = prop::collection::vec(prop::collection::vec(tok, 0..6), 1..6);
    (docs, qs).prop_map(|(docs, mut qs)| {
        // Add substrings of the corpus (prefixes of suffixes) as queries.
        for d in &docs {
            if d.len() >= 3 {
                qs.push(d[1..d.len().min(5)].to_vec());
                qs.push(d[d.len() - 3..].to_vec());
            }
        }
        (docs, qs)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn u8_tokens((docs, qs) in corpus_and_queries(4)) { check_all(&docs, 4, &qs); }
    #[test]
    fn u8_tokens_wide((docs, qs) in corpus_and_queries(255)) { check_all(&docs, 255, &qs); }
    #[test]
    fn u16_tokens((docs, qs) in corpus_and_queries(1000)) { check_all(&docs, 1000, &qs); }
    #[test]
    fn u32_tokens((docs, qs) in corpus_and_queries(70_000)) { check_all(&docs, 70_000, &qs); }
    #[test]
    fn binary_vocab((docs, qs) in corpus_and_queries(2)) { check_all(&docs, 2, &qs); }
}

#[test]
fn edge_cases() {
    // One-token corpus.
    check_all(&[vec![0]], 2, &[vec![], vec![0], vec![1], vec![0, 0]]);
    // Query across a document boundary never matches.
    let docs = vec![vec![1, 2, 3], vec![4, 5]];
    check_all(
        &docs,
        10,
        &[vec![3, 4], vec![3], vec![2, 3], vec![5], vec![9]],
    );
    let idx = Index::from_docs(TokenizerSpec::synthetic(10), &docs, 1, true).unwrap();
    assert_eq!(idx.count(&[3, 4]).unwrap().count, 0);
    assert_eq!(
        idx.count(&[]).unwrap().count,
        7,
        "the empty query counts every position, separators included"
    );
    // Token widths follow the vocabulary: bytes (255 ids) fit one byte beside the separator.
    for (vocab, width) in [(2usize, 1u8), (255, 1), (256, 2), (65_535, 2), (65_536, 4)] {
        let idx = Index::from_docs(
            TokenizerSpec::synthetic(vocab),
            &[vec![vocab as u32 - 1]],
            1,
            true,
        )
        .unwrap();
        assert_eq!(idx.header().token_width, width, "vocab {vocab}");
        assert_eq!(idx.count(&[vocab as u32 - 1]).unwrap().count, 1);
    }
    // Largest token id of each width.
    for vocab in [255usize, 65535, 70_000] {
        let top = vocab as u32 - 1;
        check_all(
            &[vec![top, 0, top], vec![top]],
            vocab,
            &[vec![top], vec![top, 0], vec![0, top, 0]],
        );
    }
    // Ids outside the vocabulary are refused, not answered.
    assert!(idx.count(&[10]).is_err());
    assert!(idx.count(&[u32::MAX]).is_err());
    // Empty corpus.
    let empty = Index::from_docs(TokenizerSpec::synthetic(10), &[], 1, true).unwrap();
    assert_eq!(empty.count(&[1]).unwrap().count, 0);
    assert_eq!(empty.infgram_ntd(&[1], None).unwrap().suffix_len, Some(0));
    // A prompt that never occurs backs off to the unigram distribution.
    let r = idx.infgram_ntd(&[9, 9, 9], None).unwrap();
    assert_eq!((r.suffix_len, r.prompt_cnt), (Some(0), 7));
    // A suffix found only at a document's end is the ∞-gram context (its next token is the
    // end), as in infini-gram; the estimators back off past it instead.
    let r = idx.infgram_ntd(&[7, 3], Some(0)).unwrap();
    assert_eq!((r.suffix_len, r.prompt_cnt), (Some(1), 1));
    assert_eq!(r.result_by_token_id[&0].cont_cnt, 1);
    assert_eq!(idx.infgram_counts(&[7, 3]).unwrap().0, 0);
}

#[test]
fn search_docs_cnf() {
    let docs = vec![
        vec![1, 2, 3, 4, 5, 6],
        vec![1, 2, 9, 9, 9, 9, 9, 5, 6],
        vec![5, 6, 1, 2],
    ];
    let idx = Index::from_docs(TokenizerSpec::synthetic(10), &docs, 2, true).unwrap();
    // (1 2) AND (5 6) within 3 tokens: docs 0 and 2, not 1 (too far).
    let r = idx
        .search_docs(&[vec![vec![1, 2]], vec![vec![5, 6]]], 10, 3, 1000, 20)
        .unwrap();
    let mut found: Vec<u64> = r.documents.iter().map(|d| d.doc_ix).collect();
    found.sort();
    assert_eq!(found, vec![0, 2]);
    // OR inside a clause.
    let r = idx
        .search_docs(&[vec![vec![3], vec![9, 9]]], 10, 0, 1000, 20)
        .unwrap();
    assert_eq!(r.cnt, 1 + 4);
    assert!(idx.search_docs(&[], 10, 3, 1000, 20).is_err());
    // A sampled clause's count is scaled back up by the sampling factor:
    // one clause is counted exactly, whatever the sample.
    for max_clause_freq in [1, 2, 3, 4, 1000] {
        let r = idx
            .search_docs(&[vec![vec![9]]], 10, 0, max_clause_freq, 20)
            .unwrap();
        assert_eq!(
            (r.cnt, r.approx),
            (5, max_clause_freq < 5),
            "{max_clause_freq}"
        );
        let r = idx
            .search_docs(&[vec![vec![3], vec![9, 9]]], 10, 0, max_clause_freq, 20)
            .unwrap();
        assert_eq!(r.cnt, 5, "{max_clause_freq}");
    }
}

/// Corpora large enough for the sampled keys (one per 256 suffixes) to bracket the searches:
/// every query length around the key length (8 bytes of tokens), each width.
#[test]
fn sampled_keys_agree_with_brute_force() {
    for vocab in [3u32, 300, 70_000] {
        let mut x: u64 = 88172645463325252;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let docs: Vec<Vec<u32>> = (0..12)
            .map(|_| {
                (0..700)
                    .map(|_| (rnd() % 3) as u32 * (vocab / 3).max(1) % vocab)
                    .collect()
            })
            .collect();
        let idx =
            Index::from_docs(TokenizerSpec::synthetic(vocab as usize), &docs, 5, true).unwrap();
        for d in 0..docs.len() {
            for start in [0usize, 17, 333, 690] {
                for len in [1usize, 2, 3, 4, 5, 7, 8, 9, 12, 30] {
                    let q = &docs[d][start..(start + len).min(docs[d].len())];
                    assert_eq!(
                        idx.count(q).unwrap().count,
                        brute_count(&docs, q),
                        "vocab {vocab} {q:?}"
                    );
                }
            }
        }
        // Queries that do not occur, below and above everything.
        for q in [
            vec![0u32; 40],
            vec![vocab - 1; 40],
            vec![vocab - 1, 0, vocab - 1],
        ] {
            assert_eq!(idx.count(&q).unwrap().count, brute_count(&docs, &q));
        }
    }
}
