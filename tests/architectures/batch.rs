//! Several sequences in one model: a pass over several sequences' new tokens gives each the
//! bits of its sequence scored alone, and generations that share passes through a
//! [`Batcher`] (plain, speculative, token trees, sampled) write the tokens each writes alone.

use super::passes::Scripted;
use super::*;
use infgram::lm::batch::Batcher;
use infgram::lm::SeqPart;

/// Three sequences' prefixes and new tokens (of 1, 4 and 2 tokens).
fn three_sequences() -> Vec<(Vec<u32>, Vec<u32>)> {
    vec![
        (ids(3, 31), ids(1, 32)),
        (ids(7, 33), ids(4, 34)),
        (ids(5, 35), ids(2, 36)),
    ]
}

/// A model of several sequences, loaded anew for each use.
type Load<'a> = &'a dyn Fn() -> Box<dyn LanguageModel + Send>;

/// The native pass of the model at `path` on `threads` threads, as a [`Load`].
fn native(
    path: &std::path::Path,
    threads: usize,
) -> impl Fn() -> Box<dyn LanguageModel + Send> + '_ {
    move || Box::new(Decoder::from_gguf(path).unwrap().with_threads(threads))
}

#[test]
fn a_pass_over_several_sequences_is_each_sequence_alone() {
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        for threads in [1, 2] {
            let what = format!("{} with {threads} threads", family.name);
            let load = native(&path, threads);
            several_sequences_in_a_pass_are_each_alone(&load, &what);
            greedy_picks_beside_full_rows(&load, &what);
        }
    }
}

/// The GPU pass's sequences ([`infgram::neural::gpu::Sequence`], each in its own room of the
/// cache, on the kernels' CPU reference): a pass over several is each alone, generations that
/// share passes through a [`Batcher`] write what each writes alone, and kept prompts are
/// read once, as on the native pass.
#[test]
fn the_gpu_pass_s_sequences_batch_as_the_native_pass_s() {
    use infgram::neural::gpu::reference::ReferenceDecoder;
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES[..2] {
        let path = write_model(dir.path(), family, false);
        let load = || -> Box<dyn LanguageModel + Send> {
            Box::new(ReferenceDecoder::load(&path).unwrap())
        };
        let what = format!("{} on the GPU pass's reference", family.name);
        several_sequences_in_a_pass_are_each_alone(&load, &what);
        greedy_picks_beside_full_rows(&load, &what);
        generations_sharing_passes(&load, &what);
        kept_prompts(&load, &what);
    }
}

/// A part of a several-sequence pass that asks for greedy picks gets each row's pick (the
/// rows stay with the pass); the part beside it its first full row, the rest held for
/// `score_more`.
fn greedy_picks_beside_full_rows(load: Load, what: &str) {
    let (a, b) = (ids(5, 71), ids(4, 72));
    let mut solo = load();
    let want_a: Vec<Logits> = (solo.forward(&a).unwrap().iter())
        .map(|r| Logits::of_pick(r.len(), greedy_pick(r)))
        .collect();
    solo.truncate(0);
    let want_b: Vec<Logits> = solo
        .forward(&b)
        .unwrap()
        .into_iter()
        .map(Logits::Dense)
        .collect();
    let mut m = load();
    let s = m.sequences().unwrap();
    let other = s.add_sequence().unwrap();
    let parts = [
        SeqPart {
            seq: 0,
            tokens: &a,
            first: a.len(),
            form: RowForm::Greedy,
        },
        SeqPart {
            seq: other,
            tokens: &b,
            first: 1,
            form: RowForm::Full,
        },
    ];
    let rows = s.score_parts(&parts).unwrap();
    assert_eq!(rows[0], want_a, "{what}: greedy picks");
    assert_eq!(rows[1], want_b[..1], "{what}: a full row beside them");
    s.select(other).unwrap();
    assert_eq!(
        m.score_more(9).unwrap(),
        want_b[1..],
        "{what}: its rows held"
    );
}

fn several_sequences_in_a_pass_are_each_alone(load: Load, what: &str) {
    let cases = three_sequences();
    let alone: Vec<Vec<Logits>> = cases
        .iter()
        .map(|(prefix, new)| {
            let mut m = load();
            m.feed(prefix).unwrap();
            m.score_first(new, new.len(), RowForm::Full).unwrap()
        })
        .collect();
    let mut m = load();
    let seqs = m.sequences().unwrap();
    assert_eq!(seqs.sequence_count(), 1, "{what}");
    for (i, (prefix, _)) in cases.iter().enumerate() {
        let seq = if i == 0 {
            0
        } else {
            seqs.add_sequence().unwrap()
        };
        seqs.select(seq).unwrap();
        // (The sequences' prefixes fed in one pass of their own each.)
        let part = [SeqPart {
            seq,
            tokens: prefix,
            first: 0,
            form: RowForm::Full,
        }];
        assert!(seqs.score_parts(&part).unwrap()[0].is_empty(), "{what}");
    }
    let parts: Vec<SeqPart> = cases
        .iter()
        .enumerate()
        .map(|(seq, (_, new))| SeqPart {
            seq,
            tokens: new,
            first: new.len(),
            form: RowForm::Full,
        })
        .collect();
    let together = seqs.score_parts(&parts).unwrap();
    assert_eq!(together, alone, "{what}: rows of a pass of three sequences");
    // Each sequence's cache holds its own tokens: the next pass goes on from them,
    // one after a rollback.
    seqs.select(1).unwrap();
    m.truncate(8);
    let next = ids(2, 37);
    let seqs = m.sequences().unwrap();
    let parts = [
        SeqPart {
            seq: 2,
            tokens: &next,
            first: 2,
            form: RowForm::Full,
        },
        SeqPart {
            seq: 1,
            tokens: &next,
            first: 1,
            form: RowForm::Full,
        },
    ];
    let rows = seqs.score_parts(&parts).unwrap();
    let mut solo = load();
    solo.feed(&[cases[1].0.clone(), cases[1].1[..1].to_vec()].concat())
        .unwrap();
    let want = solo.score_first(&next, 1, RowForm::Full).unwrap();
    assert_eq!(rows[1], want, "{what}: after a rollback");
    let mut solo = load();
    solo.feed(&[cases[2].0.clone(), cases[2].1.clone()].concat())
        .unwrap();
    let want = solo.score_first(&next, 2, RowForm::Full).unwrap();
    assert_eq!(rows[0], want, "{what}: a sequence beside it");
    // A sequence twice in one pass, or one that is not held, is refused.
    let twice = [parts[0], parts[0]];
    assert!(seqs.score_parts(&twice).is_err(), "{what}");
    let missing = [SeqPart {
        seq: 9,
        tokens: &next,
        first: 1,
        form: RowForm::Full,
    }];
    assert!(seqs.score_parts(&missing).is_err(), "{what}");
}

#[test]
fn a_prompt_read_beside_other_rows_leaves_each_sequence_as_alone() {
    // A pass's last layer stops after its keys and values for the rows no logits are asked
    // of (a prompt read); the rows asked for close up, and the prompt's cache is whole.
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let what = family.name;
        let load = || Decoder::from_gguf(&path).unwrap().with_threads(2);
        let (prefix, new) = (ids(6, 41), ids(3, 42));
        let (prompt, next) = (ids(9, 43), ids(2, 44));
        let alone = |fed: &[u32], scored: &[u32]| {
            let mut m = load();
            m.feed(fed).unwrap();
            m.score_first(scored, scored.len(), RowForm::Full).unwrap()
        };
        let mut m = load();
        let seqs = m.sequences().unwrap();
        let other = seqs.add_sequence().unwrap();
        let fed = [SeqPart {
            seq: 0,
            tokens: &prefix,
            first: 0,
            form: RowForm::Full,
        }];
        assert!(seqs.score_parts(&fed).unwrap()[0].is_empty(), "{what}");
        // The prompt's rows first, so the rows asked for move up in the last layer.
        let parts = [
            SeqPart {
                seq: other,
                tokens: &prompt,
                first: 0,
                form: RowForm::Full,
            },
            SeqPart {
                seq: 0,
                tokens: &new,
                first: new.len(),
                form: RowForm::Full,
            },
        ];
        let rows = seqs.score_parts(&parts).unwrap();
        assert!(rows[0].is_empty(), "{what}: a prompt read has no rows");
        assert_eq!(
            rows[1],
            alone(&prefix, &new),
            "{what}: rows beside a prompt read"
        );
        let after = [SeqPart {
            seq: other,
            tokens: &next,
            first: next.len(),
            form: RowForm::Full,
        }];
        let rows = seqs.score_parts(&after).unwrap();
        assert_eq!(
            rows[0],
            alone(&prompt, &next),
            "{what}: after its prompt was read"
        );
    }
}

/// How a generation of the test decodes.
#[derive(Clone, Copy, Debug)]
enum Way {
    Plain,
    Drafted,
    Trees,
    Sampled(u64),
}

fn generate(m: &mut dyn LanguageModel, prompt: &[u32], way: Way, script: &[u32]) -> Vec<u32> {
    let cfg = DecodeConfig {
        max_tokens: 20,
        trees: matches!(way, Way::Trees),
        cost: infgram::decode::CostModel::from_ms(&[(1, 1.0), (64, 1.0)]).frozen(),
        ..DecodeConfig::default()
    };
    let scripted = |wrong| -> Box<dyn Drafter> {
        Box::new(Scripted {
            prompt_len: prompt.len(),
            script: script.to_vec(),
            wrong,
        })
    };
    let mut drafters: Vec<Box<dyn Drafter>> = match way {
        Way::Plain | Way::Sampled(_) => Vec::new(),
        Way::Drafted => vec![scripted(3)],
        Way::Trees => vec![scripted(3), scripted(4)],
    };
    let mut sampler = match way {
        Way::Sampled(seed) => Sampler::new(SamplerConfig::default(), Some(seed)),
        _ => Sampler::greedy(),
    };
    let (out, _) = decode(
        m,
        &mut drafters,
        &mut [],
        &mut sampler,
        prompt,
        &cfg,
        |_| {},
    )
    .unwrap();
    out
}

#[test]
fn generations_sharing_passes_write_what_each_writes_alone() {
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES[..3] {
        let path = write_model(dir.path(), family, false);
        let load = native(&path, 2);
        generations_sharing_passes(&load, family.name);
    }
}

fn generations_sharing_passes(load: Load, name: &str) {
    let ways = [
        Way::Plain,
        Way::Drafted,
        Way::Trees,
        Way::Sampled(5),
        Way::Plain,
        Way::Sampled(6),
    ];
    // (The last prompt is longer than a pass takes of one sequence: it goes in chunks.)
    let prompts: Vec<Vec<u32>> = (0..ways.len() as u64)
        .map(|i| match i {
            5 => ids(Batcher::CHUNK * 2 + 20, 40 + i),
            _ => ids(4 + i as usize, 40 + i),
        })
        .collect();
    // Alone: each on a model of its own (the greedy output scripts the drafters).
    let mut solo = load();
    let greedy: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(solo.as_mut(), p, Way::Plain, &[]))
        .collect();
    let want: Vec<Vec<u32>> = ways
        .iter()
        .zip(&prompts)
        .zip(&greedy)
        .map(|((&way, p), g)| generate(solo.as_mut(), p, way, g))
        .collect();
    // Together: a thread each, twice over (the second round reuses freed sequences, given
    // room for their prompts and outputs at once, as a server admits them).
    let batcher = Batcher::start(load()).unwrap();
    for round in 0..2 {
        let got: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = ways
                .iter()
                .zip(&prompts)
                .zip(&greedy)
                .map(|((&way, p), g)| {
                    let mut m = match round {
                        0 => batcher.sequence().unwrap(),
                        _ => batcher.sequence_for(p.len() + 200).unwrap(),
                    };
                    s.spawn(move || generate(&mut m, p, way, g))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            let what = format!("{name} round {round}, {:?} #{i}", ways[i]);
            assert_eq!(got, want, "{what}");
        }
    }
    // (The second round started from the first round's kept caches.)
    assert!(reused(&batcher) > 0, "{name}");
    let stats = batcher.stats();
    let passes = stats.passes.load(std::sync::atomic::Ordering::Relaxed);
    let sequences = stats.sequences.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        passes > 0 && sequences >= passes,
        "{passes} passes, {sequences}"
    );
}

/// Tokens not read again because a kept cache held them, so far.
fn reused(batcher: &Batcher) -> u64 {
    batcher
        .stats()
        .reused_tokens
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn kept_prompts_are_read_once_and_every_generation_writes_its_tokens_alone() {
    let dir = tempfile::tempdir().unwrap();
    for family in &FAMILIES {
        let path = write_model(dir.path(), family, false);
        let load = native(&path, 2);
        kept_prompts(&load, family.name);
    }
}

fn kept_prompts(load: Load, name: &str) {
    let mut solo = load();
    let solo = solo.as_mut();
    // A prompt longer than a pass takes, one that shares its first 40 tokens, the first
    // one's conversation going on after its answer, the first one again, and the
    // conversation's third turn (after an answer written with token trees).
    let base = ids(Batcher::CHUNK + 6, 60);
    let first = [base.clone(), ids(5, 61)].concat();
    let answer = generate(solo, &first, Way::Plain, &[]);
    let second_turn = [first.clone(), answer.clone(), ids(6, 63)].concat();
    let second_answer = generate(solo, &second_turn, Way::Plain, &[]);
    let prompts = [
        first.clone(),
        [&base[..40], &ids(9, 62)].concat(),
        second_turn.clone(),
        first.clone(),
        [second_turn.clone(), second_answer.clone(), ids(4, 64)].concat(),
    ];
    // (Row: the prompt, how it decodes, the tokens a kept cache must spare it at least.)
    let cases = [
        (0, Way::Plain, 0),
        (1, Way::Drafted, 40),
        (2, Way::Trees, first.len() + answer.len() - 1),
        (3, Way::Plain, first.len() - 1),
        (4, Way::Plain, second_turn.len() + second_answer.len() - 1),
        (2, Way::Drafted, prompts[2].len() - 1),
    ];
    let batcher = Batcher::start(load()).unwrap();
    for (i, &(p, way, spared)) in cases.iter().enumerate() {
        let what = format!("{name} #{i}: prompt {p}, {way:?}");
        let prompt = &prompts[p];
        let greedy = generate(solo, prompt, Way::Plain, &[]);
        let want = generate(solo, prompt, way, &greedy);
        let before = reused(&batcher);
        let mut m = batcher.sequence_for(prompt.len() + 200).unwrap();
        assert_eq!(generate(&mut m, prompt, way, &greedy), want, "{what}");
        drop(m);
        let got = (reused(&batcher) - before) as usize;
        assert!(got >= spared && got < prompt.len(), "{what}: {got} reused");
    }
    // Within the bound (two kept prompts' worth), the oldest gone first; none at 0.
    let stats = batcher.stats();
    let position = batcher.cache_bytes_per_token();
    let bound = 2 * (prompts[2].len() + batcher.cache_slack_tokens()) * position;
    batcher.keep_prompts(bound).unwrap();
    for prompt in &prompts {
        let mut m = batcher.sequence().unwrap();
        generate(&mut m, prompt, Way::Plain, &[]);
    }
    let kept = stats.kept_tokens.load(std::sync::atomic::Ordering::Relaxed);
    let slack = batcher.cache_slack_tokens();
    assert!(
        kept > 0 && (kept + 2 * slack) * position <= bound,
        "{kept} kept"
    );
    batcher.keep_prompts(0).unwrap();
    let before = reused(&batcher);
    for prompt in [&first, &first] {
        let mut m = batcher.sequence().unwrap();
        generate(&mut m, prompt, Way::Plain, &[]);
    }
    assert_eq!(reused(&batcher), before, "{name}: nothing kept");
    assert_eq!(
        stats.kept_tokens.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn a_model_of_one_sequence_is_refused_by_the_batcher() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path(), &FAMILIES[0], false);
    let candle = CandleDecoder::from_gguf(&path).unwrap();
    let e = Batcher::start(Box::new(candle)).err().unwrap();
    assert!(e.to_string().contains("one sequence"), "{e}");
}
