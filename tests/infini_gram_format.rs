//! infini-gram's index format, read as it is: directories written here the way infini-gram's
//! indexer writes them (documents after a separator, byte pointers sorted by the tokens'
//! bytes, by a brute-force sort), opened by `Index::open`, must answer every query as the
//! same documents indexed by infgram do (proptest over u8 / u16 / u32 tokens and several
//! shards), and damaged directories are refused with a clear error. The Python tests compare
//! against infini-gram's own indexer and engine.

use infgram::index::query::Document;
use infgram::index::shards::Shards;
use infgram::tokenizer::TokenizerSpec;
use infgram::Index;
use proptest::prelude::*;
use std::path::Path;

/// Writes `docs` as infini-gram's indexer would, shard `s` taking documents `i % shards == s`.
fn write_infini_gram(dir: &Path, docs: &[Vec<u32>], width: usize, shards: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for s in 0..shards {
        let (mut tokens, mut offsets, mut meta, mut metaoff) = (vec![], vec![], vec![], vec![]);
        for (i, d) in docs.iter().enumerate().filter(|(i, _)| i % shards == s) {
            offsets.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
            tokens.extend(std::iter::repeat_n(0xFFu8, width));
            for &t in d {
                tokens.extend_from_slice(&t.to_le_bytes()[..width]);
            }
            metaoff.extend_from_slice(&(meta.len() as u64).to_le_bytes());
            meta.extend_from_slice(format!("{{\"linenum\": {i}}}\n").as_bytes());
        }
        // The suffix array of token positions as byte offsets, sorted by bytes.
        let mut sa: Vec<usize> = (0..tokens.len()).step_by(width).collect();
        sa.sort_by(|&a, &b| tokens[a..].cmp(&tokens[b..]));
        let ratio = infgram::index::infini_gram::pointer_bytes(tokens.len() as u64);
        let table: Vec<u8> = sa
            .iter()
            .flat_map(|&p| (p as u64).to_le_bytes()[..ratio].to_vec())
            .collect();
        for (name, bytes) in [
            ("tokenized", &tokens),
            ("table", &table),
            ("offset", &offsets),
            ("metadata", &meta),
            ("metaoff", &metaoff),
        ] {
            std::fs::write(dir.join(format!("{name}.{s}")), bytes).unwrap();
        }
    }
}

/// A document window without the fields that depend on the layout (the shard's metadata line).
fn window(d: &Document) -> (u64, usize, usize, usize, Vec<u32>) {
    (
        d.doc_ix,
        d.doc_len,
        d.disp_len,
        d.needle_offset,
        d.token_ids.clone(),
    )
}

fn check_same(docs: &[Vec<u32>], vocab: usize, width: usize, shards: usize, qs: &[Vec<u32>]) {
    let tmp = tempfile::tempdir().unwrap();
    write_infini_gram(tmp.path(), docs, width, shards);
    let ig = Index::open(tmp.path()).unwrap();
    assert_eq!(ig.header().token_width as usize, width);
    assert_eq!(ig.shards().len(), shards);
    // infgram's index of the same documents in the same shards (round-robin like infini-gram).
    let order: Vec<Vec<u32>> = (0..shards)
        .flat_map(|s| docs.iter().skip(s).step_by(shards).cloned())
        .collect();
    let per_shard: Vec<usize> = (0..shards)
        .map(|s| docs.iter().skip(s).step_by(shards).count())
        .collect();
    let ours = Index::from_docs(
        TokenizerSpec::synthetic(vocab),
        &order,
        per_shard[0].max(1),
        false,
    )
    .unwrap();
    let same_shards = per_shard.iter().all(|&n| n == per_shard[0]);
    assert_eq!(ig.total_tokens(), ours.total_tokens());
    let in_vocab = |q: &[u32]| q.iter().all(|&t| (t as usize) < vocab);
    for q in qs.iter().filter(|q| in_vocab(q)) {
        assert_eq!(ig.count(q).unwrap(), ours.count(q).unwrap(), "count {q:?}");
        for eos in [None, Some(0)] {
            assert_eq!(
                ig.ntd(q, eos).unwrap(),
                ours.ntd(q, eos).unwrap(),
                "ntd {q:?}"
            );
            assert_eq!(
                ig.infgram_ntd(q, eos).unwrap(),
                ours.infgram_ntd(q, eos).unwrap(),
                "infgram_ntd {q:?}"
            );
        }
        // The estimators' convention too (documents' ends have no next token).
        assert_eq!(
            ig.infgram_counts(q).unwrap(),
            ours.infgram_counts(q).unwrap(),
            "infgram_counts {q:?}"
        );
        assert_eq!(
            ig.next_counts(q).unwrap(),
            ours.next_counts(q).unwrap(),
            "next_counts {q:?}"
        );
        if let Some((&last, prompt)) = q.split_last() {
            assert_eq!(
                ig.prob(prompt, last).unwrap(),
                ours.prob(prompt, last).unwrap()
            );
            assert_eq!(
                ig.infgram_prob(prompt, last).unwrap(),
                ours.infgram_prob(prompt, last).unwrap()
            );
        }
        assert_eq!(ig.longest_match(q).unwrap(), ours.longest_match(q).unwrap());
        let f = ig.find(q).unwrap();
        assert_eq!(f.cnt, ours.find(q).unwrap().cnt);
        // Every rank of the segment is an occurrence, shown in its document.
        for (s, &(lo, hi)) in f.segment_by_shard.iter().enumerate() {
            let before: usize = per_shard[..s].iter().sum();
            for rank in lo..hi {
                let d = ig.get_doc_by_rank(s, rank, q.len(), 1000).unwrap();
                let at = d.needle_offset;
                assert_eq!(&d.token_ids[at..at + q.len()], &q[..], "rank {rank}");
                let original = (d.doc_ix as usize - before) * shards + s;
                assert_eq!(docs[original].len(), d.doc_len);
                assert_eq!(d.metadata, format!("{{\"linenum\": {original}}}"));
            }
        }
        if !q.is_empty() && same_shards {
            let a = ig.search_docs(&[vec![q.clone()]], 5, 10, 1000, 50).unwrap();
            let b = ours
                .search_docs(&[vec![q.clone()]], 5, 10, 1000, 50)
                .unwrap();
            assert_eq!(a.cnt, b.cnt, "search_docs {q:?}");
            let mut wa: Vec<_> = a.documents.iter().map(window).collect();
            let mut wb: Vec<_> = b.documents.iter().map(window).collect();
            wa.sort();
            wb.sort();
            assert_eq!(wa.len(), wb.len());
        }
    }
}

fn corpus(vocab: u32) -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<Vec<u32>>)> {
    let tok = prop_oneof![3 => 0..2u32.min(vocab), 1 => 0..vocab, 1 => Just(vocab - 1)];
    let docs = prop::collection::vec(prop::collection::vec(tok.clone(), 0..30), 1..7);
    let qs = prop::collection::vec(prop::collection::vec(tok, 0..5), 1..5);
    (docs, qs).prop_map(|(docs, mut qs)| {
        for d in &docs {
            if d.len() >= 2 {
                qs.push(d[d.len() - 2..].to_vec());
                qs.push(d[..d.len().min(3)].to_vec());
            }
        }
        (docs, qs)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn u8_tokens((docs, qs) in corpus(255), shards in 1usize..4) {
        check_same(&docs, 255, 1, shards.min(docs.len()), &qs);
    }
    #[test]
    fn u16_tokens((docs, qs) in corpus(65_535), shards in 1usize..4) {
        // Ids whose two bytes sort differently from their values (256 < 1 by bytes).
        let docs: Vec<Vec<u32>> = docs.iter().map(|d| d.iter().map(|&t| [1, 256, 257, 2, 513][t as usize % 5]).collect()).collect();
        let qs: Vec<Vec<u32>> = qs.iter().map(|q| q.iter().map(|&t| [1, 256, 257, 2, 513][t as usize % 5]).collect()).collect();
        check_same(&docs, 65_535, 2, shards.min(docs.len()), &qs);
    }
    #[test]
    fn u32_tokens((docs, qs) in corpus(70_000), shards in 1usize..3) {
        let map = |t: u32| [1u32, 0x0100_0000, 0x0001_0001, 70_000, t][t as usize % 5];
        let docs: Vec<Vec<u32>> = docs.iter().map(|d| d.iter().map(|&t| map(t)).collect()).collect();
        let qs: Vec<Vec<u32>> = qs.iter().map(|q| q.iter().map(|&t| map(t)).collect()).collect();
        check_same(&docs, 0x0100_0001, 4, shards.min(docs.len()), &qs);
    }
}

#[test]
fn edge_cases() {
    // One empty document; a document at the very end of a shard; the largest ids.
    check_same(&[vec![]], 255, 1, 1, &[vec![], vec![0]]);
    check_same(
        &[vec![3, 4], vec![254, 254], vec![3]],
        255,
        1,
        1,
        &[vec![3], vec![254], vec![4], vec![254, 254], vec![]],
    );
    check_same(
        &[vec![65_534, 1], vec![1, 65_534]],
        65_535,
        2,
        2,
        &[vec![65_534], vec![1], vec![1, 65_534]],
    );
}

#[test]
fn damaged_directories_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_infini_gram(dir, &[vec![1, 2, 3], vec![2, 3]], 2, 1);
    assert!(Index::open(dir).is_ok());
    let err = |dir: &Path| Index::open(dir).expect_err("refused").to_string();
    // A truncated table.
    let table = std::fs::read(dir.join("table.0")).unwrap();
    std::fs::write(dir.join("table.0"), &table[..table.len() - 1]).unwrap();
    assert!(err(dir).contains("table.0"), "{}", err(dir));
    std::fs::write(dir.join("table.0"), &table).unwrap();
    // The wrong width asked for.
    let e = Index::open_infini_gram(dir, Some(1))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("token_dtype u16"), "{e}");
    // Offsets that do not point at separators.
    let off = std::fs::read(dir.join("offset.0")).unwrap();
    let mut bad = off.clone();
    bad[8] = 2;
    std::fs::write(dir.join("offset.0"), &bad).unwrap();
    assert!(err(dir).contains("offset.0"), "{}", err(dir));
    std::fs::write(dir.join("offset.0"), &off).unwrap();
    // Metadata offsets of another length.
    std::fs::write(dir.join("metaoff.0"), [0u8; 8]).unwrap();
    assert!(err(dir).contains("metaoff.0"), "{}", err(dir));
    // Not an index at all.
    let empty = tempfile::tempdir().unwrap();
    assert!(Index::open(empty.path()).is_err());
}

/// SBIS generation from an infini-gram directory (it read past the last
/// document, which has no separator after it, and panicked): from every prefix of every
/// document, with several seeds and shardings, it runs and writes tokens of the corpus.
#[test]
fn sbis_generates_from_an_infini_gram_directory() {
    use infgram::decode::{Sampler, SamplerConfig};
    use infgram::ngram::Estimator;
    use infgram::service::{generate_from_corpus, GenConfig};
    let corpora: [(usize, Vec<Vec<u32>>); 3] = [
        (2, vec![vec![1, 256, 2], vec![256, 2]]),
        (1, vec![vec![3, 4, 3, 4, 3], vec![4, 3], vec![3]]),
        (4, vec![vec![70_000, 5, 70_000, 5], vec![5, 70_000]]),
    ];
    for (width, docs) in corpora {
        for shards in [1, 2] {
            let tmp = tempfile::tempdir().unwrap();
            write_infini_gram(tmp.path(), &docs, width, shards);
            let index = std::sync::Arc::new(Index::open(tmp.path()).unwrap());
            let cfg = GenConfig {
                estimator: Estimator::Sbis { k: -1, decay: 0.1 },
                context: 200,
                max_tokens: 12,
                guard: None,
                cancel: None,
            };
            let seen: std::collections::BTreeSet<u32> = docs.iter().flatten().copied().collect();
            for d in &docs {
                for end in 0..=d.len() {
                    for seed in 0..6 {
                        let mut sampler = Sampler::new(SamplerConfig::default(), Some(seed));
                        let g = generate_from_corpus(
                            index.clone(),
                            &d[..end],
                            &cfg,
                            &mut sampler,
                            |_| {},
                        )
                        .unwrap();
                        assert!(g.tokens.iter().all(|t| seen.contains(t)), "{:?}", g.tokens);
                    }
                }
            }
        }
    }
}

#[test]
fn the_cli_queries_an_infini_gram_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let docs = vec![vec![1, 256, 2], vec![256, 2], vec![7]];
    write_infini_gram(tmp.path(), &docs, 2, 2);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
            .arg("query")
            .arg(tmp.path())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, _) = run(&["ntd", "--ids", "256,2", "--eos-token-id", "0", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["prompt_cnt"], 2);
    assert_eq!(v["result_by_token_id"]["0"]["cont_cnt"], 2, "{v}");
    let (ok, out, _) = run(&["count", "--ids", "256", "--json"]);
    assert!(ok && out.contains("\"count\":2"), "{out}");
    // u16 tokens without a recorded tokenizer: text is refused with what to do.
    let (ok, _, err) = run(&["count", "--text", "hi"]);
    assert!(!ok && err.contains("token ids"), "{err}");
}

/// `infgram serve` opens an infini-gram directory, and `--tokenizer NAME=TOKENIZER` lets text
/// queries in (127.0.0.1, one process, a bounded wait).
#[cfg(feature = "server")]
#[test]
fn the_server_serves_an_infini_gram_directory_with_a_named_tokenizer() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().unwrap();
    let text = ["the cat sat on the mat", "the dog sat on the log"];
    let docs: Vec<Vec<u32>> = text
        .iter()
        .map(|t| t.bytes().map(u32::from).collect())
        .collect();
    write_infini_gram(tmp.path(), &docs, 2, 1);
    let dir = format!("ig={}", tmp.path().display());
    let start = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(["serve", "--addr", "127.0.0.1:0", "--quiet", "--index", &dir])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A tokenizer for an index that is not served is refused at start.
    let out = start(&["--tokenizer", "other=bytes"])
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not one of the indexes"),
        "{err}"
    );
    let mut child = start(&["--tokenizer", "ig=bytes"]);
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server did not start").unwrap();
        if let Some(rest) = line.strip_prefix("listening on http://") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .build()
        .into();
    let body = r#"{"index": "ig", "query_type": "count", "query": "sat on the"}"#;
    let answer = agent
        .post(format!("http://{addr}/"))
        .send(body)
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["count"], 2, "{v}");
}
