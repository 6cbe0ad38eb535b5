//! Token trees in one pass, sampled speculative decoding's distribution, greedy picks, and the
//! GPU pass against its CPU reference (on a GPU: `INFGRAM_TEST_GPU=1`).

use super::*;

/// A token tree with two branches off the root and one off the middle (padding rows needed):
/// `(tokens, parents)`.
fn a_tree(seed: u64) -> (Vec<u32>, Vec<Option<usize>>) {
    let tokens = ids(8, seed);
    let parents = vec![
        None,
        Some(0),
        Some(1),
        Some(2),
        Some(0),
        Some(4),
        Some(1),
        Some(6),
    ];
    (tokens, parents)
}

/// Node i's branch: its ancestors and itself, from node 0.
fn branch(parents: &[Option<usize>], i: usize) -> Vec<usize> {
    let mut path = vec![i];
    while let Some(p) = parents[*path.last().unwrap()] {
        path.push(p);
    }
    path.reverse();
    path
}

/// Runs `check` on the native pass of every family (windows longer than a tree is deep: the
/// tiny Gemma's 4 would cut inside it), on every ISA, with 1 and 2 threads.
fn on_every_native_pass(check: impl Fn(&mut Decoder, &str)) {
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let family = Family {
            window: family.window.map(|_| 80),
            ..*family
        };
        let path = write_model(dir.path(), &family, false);
        for isa in Isa::available() {
            for threads in [1, 2] {
                let what = format!("{} {isa:?} {threads} threads", family.name);
                let mut m = Decoder::from_gguf(&path)
                    .unwrap()
                    .with_isa(isa)
                    .with_threads(threads);
                check(&mut m, &what);
            }
        }
    }
}

/// A token tree verified in one pass gives every node the bits of its branch fed as a chain,
/// on every family and ISA, with 1 and 2 threads; after keeping one branch the cache is that
/// chain's (the next token's row is the same bits).
#[test]
fn a_token_tree_in_one_pass_is_every_branch_fed_as_a_chain() {
    let prefix = ids(9, 3);
    on_every_native_pass(|m, what| tree_rows_are_chain_rows(m, &prefix, what));
}

/// The native pass hands out greedy picks (`RowForm::Greedy`, found as its output projection
/// goes) that are each full row's first_max id and logit, as asked (`score_first`, then
/// `score_more`) and in a tree pass; and greedy decoding on picks, plain, speculative and
/// with trees, writes what it writes on full rows: on every family, ISA and thread count.
#[test]
fn the_native_pass_s_greedy_picks_are_its_rows_first_max() {
    let (tokens, prefix) = (ids(14, 7), ids(9, 3));
    on_every_native_pass(|m, what| {
        let full = m.forward(&tokens).unwrap();
        rows_as_asked_are_the_pass_s(m, &tokens, &full, what);
        tree_picks_are_first_max(m, &prefix, what);
        greedy_picks_decode_as_full_rows(m, what);
    });
}

/// The candle pass (the one `--device cuda` runs) verifies token trees too: every node gets the
/// bits of its branch fed as a chain, sliding windows shorter than the tree included (the
/// tiny Gemma's 4), and keeping a branch leaves the chain's cache.
#[test]
fn the_candle_pass_verifies_a_token_tree_as_its_branches_fed_as_chains() {
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let prefix = ids(9, 3);
        let what = family.name;
        let mut m = CandleDecoder::from_gguf(&path).unwrap();
        tree_rows_are_chain_rows(&mut m, &prefix, what);
    }
}

/// After `prefix`, [`a_tree`] verified in one pass (its first 3 rows, then the rest as asked)
/// gives every node the bits of its branch fed as a chain; after keeping the branch
/// 0 → 1 → 6 → 7 the next rows are the chain's; a path that is not one is refused.
fn tree_rows_are_chain_rows(m: &mut dyn LanguageModel, prefix: &[u32], what: &str) {
    let (tokens, parents) = a_tree(11);
    assert_eq!(m.max_tree_rows(), 64, "{what}");
    m.feed(prefix).unwrap();
    let mut rows = m
        .score_tree_first(&tokens, &parents, 3, RowForm::Full)
        .unwrap();
    while rows.len() < tokens.len() {
        let more = m.score_more(2).unwrap();
        assert!(!more.is_empty(), "{what}");
        rows.extend(more);
    }
    assert!(m.score_more(2).unwrap().is_empty());
    for (i, row) in rows.iter().enumerate() {
        let nodes = branch(&parents, i);
        let chain: Vec<u32> = nodes.iter().map(|&n| tokens[n]).collect();
        m.truncate(prefix.len());
        let want = m.forward(&chain).unwrap().pop().unwrap();
        assert_eq!(row.clone().into_dense(), want, "{what}: node {i}");
    }
    m.truncate(prefix.len());
    m.score_tree_first(&tokens, &parents, 1, RowForm::Full)
        .unwrap();
    m.keep_path(&[0, 1, 6, 7]).unwrap();
    assert_eq!(m.cache_len(), prefix.len() + 4);
    let next = m.forward(&[5, 6]).unwrap();
    m.truncate(prefix.len());
    let chain = [tokens[0], tokens[1], tokens[6], tokens[7], 5, 6];
    let want = m.forward(&chain).unwrap();
    assert_eq!(next, want[4..], "{what}: after keeping a branch");
    m.truncate(prefix.len());
    m.score_tree_first(&tokens, &parents, 1, RowForm::Full)
        .unwrap();
    assert!(m.keep_path(&[0, 2]).is_err(), "{what}");
}

/// A model that hands out greedy picks (the GPU pass's `Sequence`): a tree pass in
/// `RowForm::Greedy` after `prefix` gives each row's first_max id and logit.
fn tree_picks_are_first_max(m: &mut dyn LanguageModel, prefix: &[u32], what: &str) {
    let (tokens, parents) = a_tree(11);
    m.truncate(0);
    m.feed(prefix).unwrap();
    let rows = m
        .score_tree_first(&tokens, &parents, tokens.len(), RowForm::Full)
        .unwrap();
    let dense: Vec<Vec<f32>> = rows.into_iter().map(Logits::into_dense).collect();
    m.truncate(prefix.len());
    let mut picks = m
        .score_tree_first(&tokens, &parents, 3, RowForm::Greedy)
        .unwrap();
    picks.extend(m.score_more(tokens.len()).unwrap());
    assert_eq!(picks, greedy_picks(&dense), "{what}: a tree's greedy picks");
}

/// The rows a pass in `RowForm::Greedy` hands out for `rows`: each row's first_max id and
/// logit.
fn greedy_picks(rows: &[Vec<f32>]) -> Vec<Logits> {
    rows.iter()
        .map(|r| Logits::of_pick(r.len(), greedy_pick(r)))
        .collect()
}

/// Rows handed out as asked (`score_first`'s 3, then `score_more`'s 2 at a time) are the
/// rows of `full` (`tokens` in one pass), and a prompt fed without its rows (`feed`) leaves the
/// cache `forward` would.
fn rows_as_asked_are_the_pass_s(
    m: &mut dyn LanguageModel,
    tokens: &[u32],
    full: &[Vec<f32>],
    what: &str,
) {
    m.truncate(5);
    let mut rows = m.score_first(&tokens[5..], 3, RowForm::Full).unwrap();
    assert_eq!(rows.len(), 3, "{what}");
    loop {
        let more = m.score_more(2).unwrap();
        if more.is_empty() {
            break;
        }
        rows.extend(more);
    }
    let rows: Vec<Vec<f32>> = rows.into_iter().map(|r| r.into_dense()).collect();
    assert_eq!(rows, full[5..], "{what}: rows as asked");
    // As greedy picks: each row's first_max id and logit.
    m.truncate(5);
    let mut picks = m.score_first(&tokens[5..], 3, RowForm::Greedy).unwrap();
    picks.extend(m.score_more(tokens.len()).unwrap());
    assert_eq!(picks, greedy_picks(&full[5..]), "{what}: greedy picks");
    m.truncate(5);
    m.feed(&tokens[5..9]).unwrap();
    assert!(
        m.score_more(1).unwrap().is_empty(),
        "{what}: a fed pass holds no rows"
    );
    assert_eq!(
        m.forward(&tokens[9..]).unwrap(),
        full[9..],
        "{what}: after feed"
    );
}

/// The GPU pass's CPU reference (`neural::gpu::reference`, the kernels' order of operations on
/// the CPU) on every family: the same bits for a position however it is fed (one pass, one
/// token at a time after a rollback, chunks), token trees as their branches fed as chains
/// (windows shorter than the tree included), and within the native pass's bound of the candle
/// reference. So the kernels' plan (parameters, slots, rotation, gates, windows) is checked
/// on every machine; on a GPU, `gpu_kernels_match_their_cpu_reference` checks the kernels
/// against it.
#[test]
fn the_gpu_pass_s_cpu_reference_is_batch_invariant_and_agrees_with_the_other_passes() {
    use infgram::neural::gpu::reference::ReferenceDecoder;
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let tokens = ids(14, 7);
        let want = CandleDecoder::from_gguf(&path)
            .unwrap()
            .forward(&tokens)
            .unwrap();
        let mut m = ReferenceDecoder::load(&path).unwrap();
        let full = m.forward(&tokens).unwrap();
        for (i, (got, want)) in full.iter().zip(&want).enumerate() {
            let d = rel_diff(got, want);
            assert!(d < TOLERANCE, "{} position {i}: {d}", family.name);
        }
        m.truncate(5);
        let mut again = m.forward(&tokens[5..9]).unwrap();
        for &t in &tokens[9..] {
            again.extend(m.forward(&[t]).unwrap());
        }
        assert_eq!(again, full[5..], "{}: rows after a rollback", family.name);
        rows_as_asked_are_the_pass_s(&mut m, &tokens, &full, family.name);
        let prefix = ids(9, 3);
        let mut m = ReferenceDecoder::load(&path).unwrap();
        tree_rows_are_chain_rows(&mut m, &prefix, family.name);
        tree_picks_are_first_max(&mut m, &prefix, family.name);
        greedy_picks_decode_as_full_rows(&mut m, family.name);
    }
}

/// Several sequences' rows in one pass of the GPU pass's CPU reference, each sequence at its
/// own place in the cache (`gpu::params_of`): every row the bits of its sequence run alone,
/// prompts read together, then one sequence's next tokens beside another's token tree.
#[test]
fn the_gpu_pass_s_rows_of_several_sequences_are_each_sequence_s_alone() {
    use infgram::neural::gpu::reference::ReferenceDecoder;
    use infgram::neural::gpu::{params_of, Pass, PassPart};
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let (a, b, a_next) = (ids(6, 1), ids(9, 2), ids(3, 5));
        let (tree, parents) = a_tree(11);
        let mut alone = ReferenceDecoder::load(&path).unwrap();
        let want_a = alone
            .forward(&[a.clone(), a_next.clone()].concat())
            .unwrap();
        alone.truncate(0);
        let want_b = alone.forward(&b).unwrap();
        let want_tree: Vec<Vec<f32>> = alone
            .score_tree_first(&tree, &parents, tree.len(), RowForm::Full)
            .unwrap()
            .into_iter()
            .map(Logits::into_dense)
            .collect();
        let mut joint = ReferenceDecoder::load(&path).unwrap();
        let pass = joint.pass_mut();
        let part = |base, cached, tokens, parents| PassPart {
            base,
            cached,
            tokens,
            parents,
        };
        let parts = [part(0, 0, &a[..], None), part(4000, 0, &b[..], None)];
        pass.run(
            &params_of(&parts).unwrap(),
            &[a.clone(), b.clone()].concat(),
        )
        .unwrap();
        let rows = pass.rows(0..a.len() + b.len()).unwrap();
        assert_eq!(
            rows[..a.len()],
            want_a[..a.len()],
            "{}: a's prompt",
            family.name
        );
        assert_eq!(rows[a.len()..], want_b[..], "{}: b's prompt", family.name);
        let parts = [
            part(4000, b.len(), &tree[..], Some(&parents[..])),
            part(0, a.len(), &a_next[..], None),
        ];
        pass.run(
            &params_of(&parts).unwrap(),
            &[tree.clone(), a_next.clone()].concat(),
        )
        .unwrap();
        let rows = pass.rows(0..tree.len() + a_next.len()).unwrap();
        assert_eq!(
            rows[..tree.len()],
            want_tree[..],
            "{}: b's tree",
            family.name
        );
        assert_eq!(
            rows[tree.len()..],
            want_a[a.len()..],
            "{}: a's next",
            family.name
        );
    }
}

/// The distribution check the GPU test runs on the fused kernels' rows
/// (`sampled_decoding_keeps_the_rows_distribution`), here on the native pass's rows (the
/// reference's, which follow the kernels' order one operation at a time, take minutes).
#[test]
fn sampled_speculative_decoding_keeps_the_native_rows_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path(), &FAMILIES[0], false);
    let mut m = Decoder::from_gguf(&path).unwrap();
    sampled_decoding_keeps_the_rows_distribution(&mut m, FAMILIES[0].name);
}

/// The law of sampling `row` at temperature `t` (`p^(1/t)`, normalized).
fn tempered(row: &[f32], t: f64) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let w: Vec<f64> = row.iter().map(|&l| ((l as f64 - max) / t).exp()).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum).collect()
}

/// The likeliest token of `p` other than `eos`.
fn likeliest_but(p: &[f64], eos: u32) -> u32 {
    (0..p.len() as u32)
        .filter(|&t| t != eos)
        .max_by(|&a, &b| p[a as usize].total_cmp(&p[b as usize]))
        .unwrap()
}

/// Chi-square of counts against the law `p` (tokens expected fewer than 5 times pooled), held
/// to its 1-in-10,000 bound (Wilson–Hilferty).
fn assert_fits(observed: &[f64], p: &[f64], what: &str) {
    let n: f64 = observed.iter().sum();
    let (mut chi2, mut bins, mut pooled) = (0.0, 0usize, (0.0, 0.0));
    for (o, &q) in observed.iter().zip(p) {
        let e = n * q;
        if e < 5.0 {
            pooled = (pooled.0 + o, pooled.1 + e);
        } else {
            chi2 += (o - e).powi(2) / e;
            bins += 1;
        }
    }
    if pooled.1 > 0.0 {
        chi2 += (pooled.0 - pooled.1).powi(2) / pooled.1;
        bins += 1;
    }
    let k = (bins - 1).max(1) as f64;
    let bound = k * (1.0 - 2.0 / (9.0 * k) + 3.72 * (2.0 / (9.0 * k)).sqrt()).powi(3);
    assert!(
        chi2 < bound,
        "{what}: chi2 {chi2:.1} over {k} degrees (bound {bound:.1}), n {n}"
    );
}

/// Sampled speculative decoding (temperature 0.5; a draft of the two likeliest tokens, whatever
/// was sampled, then `Scripted`'s filler) draws the first token from the prompt's row and the
/// second, after the drafted first, from that row: both chi-square tested against the model's
/// own rows, so that drafts verified on the pass's rows keep its distribution (on a GPU, the
/// fused kernels' rows).
fn sampled_decoding_keeps_the_rows_distribution(m: &mut dyn LanguageModel, what: &str) {
    let (prompt, t) = (ids(6, 21), 0.5);
    let eos = m.eos_tokens().first().copied().unwrap_or(u32::MAX);
    m.clear();
    let p1 = tempered(m.forward(&prompt).unwrap().last().unwrap(), t);
    let d1 = likeliest_but(&p1, eos);
    let p2 = tempered(m.forward(&[d1]).unwrap().last().unwrap(), t);
    let d2 = likeliest_but(&p2, eos);
    let cfg = DecodeConfig {
        max_tokens: 2,
        cost: infgram::decode::CostModel::from_ms(&[(1, 1.0), (64, 1.0)]).frozen(),
        ..DecodeConfig::default()
    };
    let config = SamplerConfig {
        temperature: t,
        ..SamplerConfig::default()
    };
    let mut sampler = Sampler::new(config, Some(11));
    let (mut first, mut second) = (vec![0f64; p1.len()], vec![0f64; p2.len()]);
    let mut accepted = 0;
    for _ in 0..3000 {
        m.clear();
        // Never wrong on purpose: d1, d2, then token 1 (whatever was sampled).
        let mut drafters: Vec<Box<dyn Drafter>> = vec![Box::new(Scripted {
            prompt_len: prompt.len(),
            script: vec![d1, d2],
            wrong: usize::MAX,
        })];
        let (out, stats) = decode(
            m,
            &mut drafters,
            &mut [],
            &mut sampler,
            &prompt,
            &cfg,
            |_| {},
        )
        .unwrap();
        accepted += stats.accepted;
        // An end of text is the end token's draw (the loop does not emit it).
        let token = |i: usize| out.get(i).copied().unwrap_or(eos) as usize;
        first[token(0)] += 1.0;
        if out.first() == Some(&d1) {
            second[token(1)] += 1.0;
        }
    }
    assert!(accepted > 0, "{what}: no draft token accepted");
    assert_fits(&first, &p1, &format!("{what}: the first token"));
    let n: f64 = second.iter().sum();
    assert!(
        n >= 200.0,
        "{what}: the drafted first token drawn {n} times"
    );
    assert_fits(&second, &p2, &format!("{what}: the second token"));
}

/// Drafts from the text that full-row decoding gave, wrong at every `wrong`-th token.
pub(crate) struct Scripted {
    pub(crate) prompt_len: usize,
    pub(crate) script: Vec<u32>,
    pub(crate) wrong: usize,
}

impl Drafter for Scripted {
    fn propose(&mut self, context: &[u32], max: usize) -> infgram::Result<Draft> {
        let at = context.len() - self.prompt_len;
        let tokens: Vec<u32> = (at..at + max.min(6))
            .map(|i| {
                let t = self.script.get(i).copied().unwrap_or(1);
                if i % self.wrong == self.wrong - 1 {
                    (t + 1) % VOCAB as u32
                } else {
                    t
                }
            })
            .collect();
        Ok(Draft {
            confidence: vec![0.9; tokens.len()],
            tokens,
            ..Draft::default()
        })
    }
    fn name(&self) -> &str {
        "scripted"
    }
}

/// Changes nothing, but makes the decode loop ask for rows in full.
struct Untouched;

impl Processor for Untouched {
    fn process(&mut self, _context: &[u32], _logits: &mut Logits) {}
}

/// Greedy decoding where the loop asks the GPU pass's `Sequence` for greedy picks
/// (`RowForm::Greedy`) instead of rows: plain, speculative and draft-tree decoding give the
/// tokens of plain decoding over full rows (asked for by a processor that changes nothing).
fn greedy_picks_decode_as_full_rows(m: &mut dyn LanguageModel, what: &str) {
    let prompt = ids(6, 21);
    let cfg = DecodeConfig {
        max_tokens: 24,
        trees: true,
        // Passes cost the same whatever their rows (as on a GPU): branches pay.
        cost: infgram::decode::CostModel::from_ms(&[(1, 1.0), (64, 1.0)]).frozen(),
        ..DecodeConfig::default()
    };
    let run = |m: &mut dyn LanguageModel, drafters: &mut [Box<dyn Drafter>], full: bool| {
        m.clear();
        let mut untouched: Vec<Box<dyn Processor>> = vec![Box::new(Untouched)];
        let processors: &mut [Box<dyn Processor>] = if full { &mut untouched } else { &mut [] };
        let mut sampler = Sampler::greedy();
        decode(m, drafters, processors, &mut sampler, &prompt, &cfg, |_| {}).unwrap()
    };
    let (want, _) = run(m, &mut [], true);
    assert!(want.len() > 8, "{what}: {} tokens", want.len());
    let (plain, _) = run(m, &mut [], false);
    assert_eq!(plain, want, "{what}: plain decoding on picks");
    let scripted = |wrong| -> Box<dyn Drafter> {
        Box::new(Scripted {
            prompt_len: prompt.len(),
            script: want.clone(),
            wrong,
        })
    };
    let (chain, stats) = run(m, &mut [scripted(3)], false);
    assert_eq!(chain, want, "{what}: speculative on picks");
    assert!(stats.accepted > 0, "{what}: {stats:?}");
    let (tree, stats) = run(m, &mut [scripted(3), scripted(4)], false);
    assert_eq!(tree, want, "{what}: draft trees on picks");
    assert!(stats.tree_passes > 0, "{what}: {stats:?}");
}

/// On a GPU (a `cuda` build run with `INFGRAM_TEST_GPU=1`; `scripts/device-check.sh` runs
/// it): the fused kernels against their CPU reference on every family, and the GPU pass's own
/// batch invariance (a k-token pass, one token at a time, token trees), with and without
/// CUDA graphs.
#[cfg(feature = "cuda")]
#[test]
fn gpu_kernels_match_their_cpu_reference() {
    use infgram::neural::gpu::decoder::GpuDecoder;
    use infgram::neural::gpu::reference::ReferenceDecoder;
    if std::env::var_os("INFGRAM_TEST_GPU").is_none() {
        eprintln!("gpu_kernels_match_their_cpu_reference: INFGRAM_TEST_GPU is not set; not run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let tokens = ids(14, 7);
        let want = ReferenceDecoder::load(&path)
            .unwrap()
            .forward(&tokens)
            .unwrap();
        for graphs in [false, true] {
            let what = format!("{} graphs {graphs}", family.name);
            let mut m = GpuDecoder::load(&path, None).unwrap().with_graphs(graphs);
            let full = m.forward(&tokens).unwrap();
            for (i, (got, want)) in full.iter().zip(&want).enumerate() {
                let d = rel_diff(got, want);
                assert!(d < 1e-4, "{what} position {i}: {d}");
            }
            for round in 0..2 {
                m.truncate(5);
                let mut again = m.forward(&tokens[5..9]).unwrap();
                for &t in &tokens[9..] {
                    again.extend(m.forward(&[t]).unwrap());
                }
                assert_eq!(again, full[5..], "{what}: rows after a rollback ({round})");
            }
            rows_as_asked_are_the_pass_s(&mut m, &tokens, &full, &what);
            // However many rows a block of the matrix kernels takes, the same bits.
            for rows in ["1", "2", "4"] {
                std::env::set_var("INFGRAM_CUDA_BLOCK_ROWS", rows);
                let blocks = GpuDecoder::load(&path, None).map(|m| m.with_graphs(graphs));
                std::env::remove_var("INFGRAM_CUDA_BLOCK_ROWS");
                let got = blocks.unwrap().forward(&tokens).unwrap();
                assert_eq!(got, full, "{what}: {rows} rows a block");
            }
            let prefix = ids(9, 3);
            m.truncate(0);
            tree_rows_are_chain_rows(&mut m, &prefix, &what);
            tree_picks_are_first_max(&mut m, &prefix, &what);
            sampled_decoding_keeps_the_rows_distribution(&mut m, &what);
        }
    }
    device_picks_are_first_max();
}

/// The device's greedy pick (`pick_part`, `pick`) against `lm::first_max` on rows chosen for
/// it: ties inside a chunk and across chunks, NaN, ±∞, −0 against +0, rows of nothing above
/// −∞, and random rows of one to five chunks of 4,096.
#[cfg(feature = "cuda")]
fn device_picks_are_first_max() {
    use infgram::neural::gpu::decoder::GpuDecoder;
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path(), &FAMILIES[0], false);
    let mut m = GpuDecoder::load(&path, None).unwrap();
    let edge = |len: usize, put: &[(usize, f32)]| {
        let mut r = vec![-1.0f32; len];
        for &(i, v) in put {
            r[i] = v;
        }
        r
    };
    let n = 9000;
    let cases = vec![
        edge(n, &[(5, 2.0), (4100, 2.0)]),
        edge(n, &[(8191, 3.0), (8192, 3.0), (12, 3.0)]),
        edge(n, &[(0, f32::NAN), (7, 1.0), (8000, f32::NAN)]),
        edge(n, &[(300, f32::INFINITY), (20, f32::INFINITY)]),
        vec![f32::NEG_INFINITY; n],
        vec![f32::NAN; n],
        edge(n, &[(9, -0.0), (30, 0.0)]),
        {
            let mut r = vec![f32::NEG_INFINITY; n];
            (r[4097], r[33]) = (0.0, -0.0);
            r
        },
        edge(n, &[(n - 1, 0.5)]),
    ];
    for len in [1, 31, 4096, 4097, 20_000] {
        // Few distinct values: ties everywhere.
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|seed| noise(len, seed, 3.0).iter().map(|v| v.round()).collect())
            .collect();
        let got = m.picks_of(&rows).unwrap();
        for (r, g) in rows.iter().zip(got) {
            assert_eq!(g, greedy_pick(r), "len {len}");
        }
    }
    let got = m.picks_of(&cases).unwrap();
    for (i, (r, g)) in cases.iter().zip(got).enumerate() {
        assert_eq!(
            g.map(|(id, v)| (id, v.to_bits())),
            greedy_pick(r).map(|(id, v)| (id, v.to_bits())),
            "edge case {i}"
        );
    }
}
