//! Classic fixed-order models (`ngram::classic`) against a brute-force implementation of their
//! definition (the module docs: KenLM's interpolated modified Kneser–Ney, and add-α) on small
//! random corpora, at orders 1–5, in sentence mode and over plain documents, on one and on
//! several shards; and the ARPA export, read back by a plain back-off reader, gives the same
//! probabilities. (KenLM itself is the oracle of `python/tests/test_kenlm.py`.)

use infgram::ngram::arpa::write_arpa;
use infgram::ngram::classic::{ClassicModel, Memo, Smoothing, KENLM_FALLBACK};
use infgram::tokenizer::words::{WordTokenizer, BOS, EOS, UNK};
use infgram::tokenizer::{Tokenizer, TokenizerSpec};
use infgram::Index;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// The marker a brute-force count uses for "the start of a document" as a left neighbour.
const START: u32 = u32::MAX;

/// Every n-gram (n ≤ order) inside the sequences: its count and the distinct tokens before it.
struct Naive {
    order: usize,
    bos: Option<u32>,
    raw: HashMap<Vec<u32>, u64>,
    left: HashMap<Vec<u32>, HashSet<u32>>,
    discounts: Vec<[f64; 4]>,
    uniform: f64,
}

impl Naive {
    fn new(seqs: &[Vec<u32>], order: usize, bos: Option<u32>, vocab: usize) -> Naive {
        let mut raw: HashMap<Vec<u32>, u64> = HashMap::new();
        let mut left: HashMap<Vec<u32>, HashSet<u32>> = HashMap::new();
        for s in seqs {
            for i in 0..s.len() {
                for n in 1..=order.min(s.len() - i) {
                    let g = s[i..i + n].to_vec();
                    *raw.entry(g.clone()).or_default() += 1;
                    let l = if i == 0 { START } else { s[i - 1] };
                    left.entry(g).or_default().insert(l);
                }
            }
        }
        let mut naive = Naive {
            order,
            bos,
            raw,
            left,
            discounts: Vec::new(),
            uniform: 0.0,
        };
        for n in 1..=order {
            let mut t = [0u64; 5];
            for g in naive.raw.keys().filter(|g| g.len() == n) {
                if n == 1 && Some(g[0]) == bos {
                    continue;
                }
                let a = naive.adjusted(g);
                if a <= 4 {
                    t[a as usize] += 1;
                }
            }
            naive.discounts.push(kenlm_discounts(&t));
        }
        let types = naive
            .raw
            .keys()
            .filter(|g| g.len() == 1 && Some(g[0]) != bos)
            .count();
        naive.uniform = if bos.is_some() {
            types as f64 + 1.0
        } else {
            vocab as f64
        };
        naive
    }

    /// The adjusted count: raw at the highest order or after `<s>`, else distinct left tokens.
    fn adjusted(&self, g: &[u32]) -> u64 {
        if g.len() == self.order || Some(g[0]) == self.bos {
            self.raw.get(g).copied().unwrap_or(0)
        } else {
            self.left.get(g).map_or(0, |s| s.len() as u64)
        }
    }

    /// `(x, a(hx))` for every x seen after h.
    fn children(&self, h: &[u32]) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self
            .raw
            .keys()
            .filter(|g| g.len() == h.len() + 1 && g[..h.len()] == *h)
            .filter(|g| Some(g[h.len()]) != self.bos)
            .map(|g| (g[h.len()], self.adjusted(g)))
            .collect();
        v.sort_unstable();
        v
    }

    fn mkn(&self, ctx: &[u32], w: u32) -> f64 {
        let h = &ctx[ctx.len().saturating_sub(self.order - 1)..];
        self.mkn_rec(h, w)
    }

    fn mkn_rec(&self, h: &[u32], w: u32) -> f64 {
        let lower = if h.is_empty() {
            1.0 / self.uniform
        } else {
            self.mkn_rec(&h[1..], w)
        };
        let kids = self.children(h);
        let total: u64 = kids.iter().map(|k| k.1).sum();
        if total == 0 {
            return lower;
        }
        let d = &self.discounts[h.len()];
        let a = kids.iter().find(|k| k.0 == w).map_or(0, |k| k.1);
        let u = if a > 0 {
            (a as f64 - d[a.min(3) as usize]) / total as f64
        } else {
            0.0
        };
        let gamma: f64 = kids.iter().map(|k| d[k.1.min(3) as usize]).sum::<f64>() / total as f64;
        u + gamma * lower
    }

    fn add_alpha(&self, ctx: &[u32], w: u32, alpha: f64) -> f64 {
        let h = &ctx[ctx.len().saturating_sub(self.order - 1)..];
        let kids: Vec<(u32, u64)> = self
            .raw
            .iter()
            .filter(|(g, _)| g.len() == h.len() + 1 && g[..h.len()] == *h)
            .filter(|(g, _)| Some(g[h.len()]) != self.bos)
            .map(|(g, &c)| (g[h.len()], c))
            .collect();
        let total: u64 = kids.iter().map(|k| k.1).sum();
        let c = kids.iter().find(|k| k.0 == w).map_or(0, |k| k.1);
        let den = total as f64 + alpha * self.uniform;
        if den > 0.0 {
            (c as f64 + alpha) / den
        } else {
            0.0
        }
    }
}

/// Chen & Goodman's eq. 26 in single precision, falling back as KenLM's option does.
fn kenlm_discounts(t: &[u64; 5]) -> [f64; 4] {
    let fallback = [0.0, KENLM_FALLBACK[0], KENLM_FALLBACK[1], KENLM_FALLBACK[2]];
    if t[1..4].contains(&0) {
        return fallback;
    }
    let y = t[1] as f32 / (t[1] as f32 + 2.0 * t[2] as f32);
    let mut d = [0.0; 4];
    for k in 1..4 {
        let dk = k as f32 - (k + 1) as f32 * y * t[k + 1] as f32 / t[k] as f32;
        if !(0.0..=k as f32).contains(&dk) {
            return fallback;
        }
        d[k] = dk as f64;
    }
    d
}

/// Sentences of random words `3..3 + words` (ids of a words vocabulary).
fn sentences(words: u32) -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(3..3 + words, 0..12), 1..30)
}

fn words_spec(words: u32) -> TokenizerSpec {
    let names: Vec<String> = (0..words).map(|i| format!("w{i}")).collect();
    WordTokenizer::from_words(names.iter().map(String::as_str)).spec()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1e-12) + 1e-12
}

/// Scores every position of `probes` (and of the corpus itself) with both implementations.
fn check_all(
    index: &Index<Vec<u8>>,
    naive: &Naive,
    model: &ClassicModel,
    probes: &[Vec<u32>],
    alpha: Option<f64>,
) -> Result<(), TestCaseError> {
    let mut memo = Memo::default();
    for p in probes {
        for i in 1..p.len() {
            let want = match alpha {
                None => naive.mkn(&p[..i], p[i]),
                Some(a) => naive.add_alpha(&p[..i], p[i], a),
            };
            let got = model.prob(index, &mut memo, &p[..i], p[i]).unwrap();
            prop_assert!(
                close(got, want),
                "order {} ctx {:?} w {}: got {got}, want {want}",
                naive.order,
                &p[..i],
                p[i]
            );
        }
    }
    Ok(())
}

fn with_marks(s: &[u32]) -> Vec<u32> {
    let mut v = vec![BOS];
    v.extend_from_slice(s);
    v.push(EOS);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Sentence mode: `<s>` n-grams keep raw counts, `</s>` is predicted, `<s>` never is.
    #[test]
    fn mkn_and_add_alpha_equal_their_definition_in_sentence_mode(
        corpus in sentences(6),
        probes in sentences(7),
        order in 1usize..=5,
        shards in 1usize..=3,
        alpha in prop::sample::select(vec![0.0, 0.1, 1.0]),
    ) {
        let seqs: Vec<Vec<u32>> = corpus.iter().map(|s| with_marks(s)).collect();
        let spec = words_spec(6);
        let per_shard = seqs.len().div_ceil(shards);
        let index = Index::from_docs(spec, &seqs, per_shard, true).unwrap();
        let naive = Naive::new(&seqs, order, Some(BOS), index.vocab_size());
        // Probes: new sentences (word 3 + 6 = 9 is out of the vocabulary: <unk>) and the corpus.
        let mut probes: Vec<Vec<u32>> = probes
            .iter()
            .map(|s| with_marks(&s.iter().map(|&w| if w >= 9 { UNK } else { w }).collect::<Vec<_>>()))
            .collect();
        probes.extend(seqs.iter().cloned());
        let fallback = Some(KENLM_FALLBACK);
        let mkn = ClassicModel::new(&index, order, Smoothing::Mkn { fallback }).unwrap();
        check_all(&index, &naive, &mkn, &probes, None)?;
        let add = ClassicModel::new(&index, order, Smoothing::AddAlpha { alpha }).unwrap();
        check_all(&index, &naive, &add, &probes, Some(alpha))?;
    }

    /// Plain documents of any tokenizer: no markers; a document's start is one more left
    /// neighbour; the uniform distribution spans the vocabulary.
    #[test]
    fn mkn_and_add_alpha_equal_their_definition_over_documents(
        docs in prop::collection::vec(prop::collection::vec(0u32..5, 1..15), 1..12),
        probes in prop::collection::vec(prop::collection::vec(0u32..5, 2..10), 1..5),
        order in 1usize..=5,
        shards in 1usize..=2,
    ) {
        let per_shard = docs.len().div_ceil(shards);
        let index = Index::from_docs(TokenizerSpec::synthetic(5), &docs, per_shard, true).unwrap();
        let naive = Naive::new(&docs, order, None, 5);
        let fallback = Some(KENLM_FALLBACK);
        let mkn = ClassicModel::new(&index, order, Smoothing::Mkn { fallback }).unwrap();
        check_all(&index, &naive, &mkn, &probes, None)?;
        let add = ClassicModel::new(&index, order, Smoothing::AddAlpha { alpha: 0.5 }).unwrap();
        check_all(&index, &naive, &add, &probes, Some(0.5))?;
    }

    /// The ARPA file, read by a plain back-off reader, gives the model's probabilities (to
    /// single precision, as ARPA stores them).
    #[test]
    fn the_arpa_export_backs_off_to_the_models_probabilities(
        corpus in sentences(5),
        probes in sentences(6),
        order in 1usize..=4,
    ) {
        let names: Vec<String> = (0..5).map(|i| format!("w{i}")).collect();
        let tok = WordTokenizer::from_words(names.iter().map(String::as_str));
        let seqs: Vec<Vec<u32>> = corpus.iter().map(|s| with_marks(s)).collect();
        let index = Index::from_docs(tok.spec(), &seqs, seqs.len(), true).unwrap();
        let fallback = Some(KENLM_FALLBACK);
        let model = ClassicModel::new(&index, order, Smoothing::Mkn { fallback }).unwrap();
        let mut out = Vec::new();
        write_arpa(&model, &index, &tok, &mut out).unwrap();
        let arpa = read_arpa(&String::from_utf8(out).unwrap());
        let mut memo = Memo::default();
        for p in &probes {
            let ids = with_marks(&p.iter().map(|&w| if w >= 8 { UNK } else { w }).collect::<Vec<_>>());
            for i in 1..ids.len() {
                let h = &ids[i.saturating_sub(order - 1)..i];
                let words: Vec<String> = h.iter().chain([&ids[i]]).map(|&t| tok.word(t).unwrap().to_string()).collect();
                let got = 10f64.powf(arpa_log10(&arpa, &words));
                let want = model.prob(&index, &mut memo, &ids[..i], ids[i]).unwrap();
                prop_assert!((got - want).abs() <= 1e-5 * want, "{words:?}: arpa {got}, model {want}");
            }
        }
    }
}

/// An ARPA file as a map from n-gram to (log10 p, log10 back-off).
fn read_arpa(text: &str) -> HashMap<Vec<String>, (f64, f64)> {
    let mut m = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 2 {
            continue;
        }
        let p: f64 = f[0].parse().unwrap();
        let bo: f64 = f.get(2).map_or(0.0, |b| b.parse().unwrap());
        m.insert(f[1].split(' ').map(String::from).collect(), (p, bo));
    }
    m
}

/// The back-off query of an ARPA model: the longest stored n-gram, plus the back-off weights
/// of the contexts skipped.
fn arpa_log10(arpa: &HashMap<Vec<String>, (f64, f64)>, g: &[String]) -> f64 {
    if let Some(&(p, _)) = arpa.get(g) {
        return p;
    }
    if g.len() == 1 {
        return arpa[&vec!["<unk>".to_string()]].0;
    }
    let bo = arpa.get(&g[..g.len() - 1]).map_or(0.0, |e| e.1);
    bo + arpa_log10(arpa, &g[1..])
}

/// The README's worked example: "the quick brown fox the quick red fox" as one sentence, at
/// order 3 with KenLM's fallback discounts, gives `lmplz`'s ARPA numbers.
#[test]
fn the_quick_brown_fox_gives_lmplz_numbers() {
    let text = "the quick brown fox the quick red fox\n";
    let tok = WordTokenizer::from_texts([text]);
    let seqs: Vec<Vec<u32>> = tok.sentences(text);
    let index = Index::from_docs(tok.spec(), &seqs, 1, true).unwrap();
    let fallback = Some(KENLM_FALLBACK);
    let model = ClassicModel::new(&index, 3, Smoothing::Mkn { fallback }).unwrap();
    let mut out = Vec::new();
    write_arpa(&model, &index, &tok, &mut out).unwrap();
    let arpa = read_arpa(&String::from_utf8(out).unwrap());
    // Printed by lmplz -o 3 --discount_fallback on the same line (-0.30103 is its log10 ½).
    let half = -std::f64::consts::LOG10_2;
    let lmplz = [
        ("<unk>", -1.146128, 0.0),
        ("<s>", 0.0, half),
        ("</s>", -0.87312675, 0.0),
        ("the", -0.70679533, half),
        ("fox", -0.70679533, half),
        ("fox the", -0.45815343, half),
        ("the quick", -0.24644431, half),
        ("quick brown", -0.4989897, half),
        ("<s> the quick", -0.105970904, 0.0),
        ("the quick red", -0.38882694, 0.0),
        ("red fox </s>", -0.18145601, 0.0),
    ];
    for (g, p, bo) in lmplz {
        let key: Vec<String> = g.split(' ').map(String::from).collect();
        let (gp, gbo) = arpa[&key];
        assert!(
            (gp - p).abs() < 1e-6 && (gbo - bo).abs() < 1e-6,
            "{g}: {gp} {gbo}"
        );
    }
    assert_eq!(arpa.len(), 24);
}

/// Generation runs a classic model through `InfgramModel`: its rows are the model's whole
/// distribution (each entry its `prob`), in sentence mode after `<s>` and the words since the
/// last `</s>`; and the protocol names it (`scorer.estimator`).
#[test]
fn generation_rows_are_the_models_distribution_and_the_protocol_names_it() {
    use infgram::lm::LanguageModel;
    use infgram::ngram::{EstimatorSpec, InfgramModel};
    use std::sync::Arc;
    let text = "a b c a b d\nb c d a\na b c\n";
    let tok = WordTokenizer::from_texts([text]);
    let index = Arc::new(Index::from_docs(tok.spec(), &tok.sentences(text), 2, true).unwrap());
    for spec in [
        EstimatorSpec::Mkn { order: 3 },
        EstimatorSpec::AddAlpha {
            order: 2,
            alpha: Some(0.5),
        },
    ] {
        let model = spec
            .classic(&*index, Some(KENLM_FALLBACK))
            .unwrap()
            .unwrap();
        let mut lm = InfgramModel::new(index.clone(), spec.estimator().unwrap(), 10).unwrap();
        let fed = tok.encode("a b").unwrap();
        let eos_then = [fed.clone(), vec![EOS], tok.encode("c").unwrap()].concat();
        let rows = lm.score(&eos_then).unwrap();
        let mut memo = Memo::default();
        // Contexts: <s> a | <s> a b | <s> (after </s>) | <s> c.
        let contexts: [&[u32]; 4] = [&[BOS, 3], &[BOS, 3, 4], &[BOS], &[BOS, 5]];
        for (row, ctx) in rows.into_iter().zip(contexts) {
            let dense = row.into_dense();
            for w in 0..index.vocab_size() as u32 {
                let want = if w == BOS {
                    0.0
                } else {
                    model.prob(&index, &mut memo, ctx, w).unwrap()
                };
                let got = (dense[w as usize] as f64).exp();
                assert!(
                    (got - want).abs() < 1e-5 * want.max(1e-3),
                    "{spec:?} {ctx:?} {w}: {got} {want}"
                );
            }
        }
    }
    let req: infgram::service::GenerateRequest = serde_json::from_str(
        r#"{"prompt": "a", "scorer": {"kind": "infgram", "estimator": {"name": "mkn", "order": 4}}}"#,
    )
    .unwrap();
    let checked = req.check(100).unwrap();
    assert!(matches!(checked.estimator, infgram::ngram::Estimator::Classic(ref c) if c.order == 4));
    let bad: infgram::service::GenerateRequest = serde_json::from_str(
        r#"{"prompt": "a", "scorer": {"kind": "infgram", "estimator": {"name": "add_alpha", "order": 2, "alpha": -1}}}"#,
    )
    .unwrap();
    let err = bad.check(100).unwrap_err().to_string();
    assert!(err.contains("alpha"), "{err}");
}
