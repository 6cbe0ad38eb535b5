//! The tests of the parent module (kept apart to keep it short).

use super::*;
use crate::index::shards::AskOnly;
use crate::index::Index;

/// A xorshift source of small numbers: `next(n)` is below `n`.
fn numbers(seed: u64) -> impl FnMut(u64) -> u32 {
    let mut x = seed;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as u32
    }
}

type Documents = Vec<Vec<u32>>;

/// An index of `shards` shards over 1 to `max_docs` random documents of fewer than
/// `max_len` tokens from `1..=alphabet` (with the documents); `None` when it holds no token.
fn random_index(
    next: &mut impl FnMut(u64) -> u32,
    max_docs: u64,
    max_len: u64,
    alphabet: u32,
    shards: usize,
) -> Option<(Arc<Index<Vec<u8>>>, Documents)> {
    let spec = crate::tokenizer::TokenizerSpec::synthetic(12);
    let docs: Vec<Vec<u32>> = (0..1 + next(max_docs))
        .map(|_| {
            (0..next(max_len))
                .map(|_| next(alphabet as u64) + 1)
                .collect()
        })
        .collect();
    let index = Index::from_docs(spec, &docs, shards, true).ok()?;
    Some((Arc::new(index), docs))
}

#[test]
fn prompt_lookup_follows_the_latest_repeat_and_learns_new_tokens() {
    let mut d = PromptLookup::new(4);
    // "1 2 3 4 5 ... 1 2 3" → drafts "4 5".
    let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3];
    let draft = d.propose(&ctx, 2).unwrap();
    assert_eq!(draft.tokens, vec![4, 5]);
    assert!(draft.confidence.iter().all(|&c| c > 0.0 && c < 1.0));
    // Nothing seen before: no draft.
    assert!(d.propose(&[7, 8], 4).unwrap().tokens.is_empty());
    // Growing the context: the new tokens are indexed.
    let mut longer = ctx.to_vec();
    longer.extend([6, 6, 1, 2, 3]);
    d.observe(&longer);
    assert_eq!(d.propose(&longer, 1).unwrap().tokens, vec![6]);
}

#[test]
fn confidence_grows_with_how_far_the_copy_runs() {
    let c = copy_confidence;
    assert!((c(1, 1, 1) - 0.375).abs() < 1e-12, "{}", c(1, 1, 1));
    assert!(c(1, 1, 8) > 0.9 && c(1, 1, 16) > 0.97);
    assert!(c(1, 1, 16) < c(1, 1, 32) && c(1, 1, 200) < 1.0);
    // Disagreeing occurrences still cost what they did.
    assert!(c(1, 2, 32) < 0.76);
    // Prompt lookup follows the match back past its longest n-gram: a passage of 40
    // tokens being copied has a 40-token match, and the draft runs long.
    let passage: Vec<u32> = (10..50).collect();
    let mut ctx = passage.clone();
    ctx.extend([99, 98]);
    ctx.extend(&passage[..30]);
    let mut d = PromptLookup::new(8);
    d.observe(&ctx);
    assert_eq!(d.synced(&ctx).tally(&ctx).unwrap().suffix_len, 30);
    let draft = d.propose(&ctx, 10).unwrap();
    assert_eq!(draft.tokens, passage[30..40].to_vec());
    assert!(draft.confidence.iter().all(|&c| c > 0.97));
}

#[test]
fn a_copy_that_changes_a_word_resumes_just_past_the_change() {
    // The source: 40 tokens, where 26 (the token after the change) also occurs earlier
    // with another continuation (at position 2 of the passage, followed by 77).
    let mut passage: Vec<u32> = (10..50).collect();
    passage[2] = 26;
    passage[3] = 77;
    let mut ctx = passage.clone();
    ctx.extend([99, 98]);
    // The model copies 15 tokens, writes 60 instead of the source's 25, then copies 20.
    ctx.extend(&passage[..15]);
    ctx.extend([60]);
    let mut d = PromptLookup::new(8);
    d.observe(&ctx);
    assert!(d.copy().source.is_none() && d.copy().broke.is_some());
    // After the change only a 1-token match ("26") exists, and most of its occurrences
    // (the source's and the copy's) continue with 77; the one just past the break
    // continues the copy.
    ctx.push(passage[16]);
    d.observe(&ctx);
    assert_eq!(
        d.synced(&ctx).longest_suffix_votes(&ctx).unwrap().tally[0].0,
        77
    );
    let resumed = d.synced(&ctx).tally(&ctx).unwrap();
    assert_eq!(resumed.tally[0].0, passage[17]);
    assert_eq!(resumed.suffix_len, 1 + RESUME_BONUS);
    let draft = d.propose(&ctx, 4).unwrap();
    assert_eq!(draft.tokens, passage[17..21].to_vec());
    // Once the copy has run on for RESYNC tokens it is followed again (no break).
    ctx.extend(&passage[17..20]);
    d.observe(&ctx);
    assert_eq!(d.copy().source, Some(20));
    assert!(d.copy().broke.is_none());
    // A break far in the past no longer steers anything.
    let mut far = ctx.clone();
    far.push(61);
    far.extend(std::iter::repeat_n(98, RESUME_LIFE + 2));
    let mut d = PromptLookup::new(8);
    d.observe(&far);
    assert!(d.copy().broke.is_none());
}

#[test]
fn a_braid_takes_the_frame_from_past_outputs_and_the_data_from_the_prompt() {
    use crate::decode::past::{remember, PastOutputDrafter, PastOutputs};
    // Three past answers: the frame 50 51 52 · 53 54 55 around different data.
    let past = PastOutputs::shared(1000);
    for data in [6, 7, 8] {
        remember(&past, &[50, 51, 52, data, 53, 54, 55]);
    }
    // This request's data follows "51 52" in the prompt; the answer's frame has begun.
    let context = [9, 51, 52, 70, 71, 72, 9, 50, 51, 52];
    let mut braid = Braid::new(vec![
        Box::new(PromptLookup::new(8)),
        Box::new(PastOutputDrafter::new(past)),
    ]);
    // Past outputs disagree on the data slot (one vote in three); the prompt's 2-token
    // match is surer: the data comes from the prompt.
    let draft = braid.propose(&context, 3).unwrap();
    assert_eq!(draft.tokens, vec![70, 71, 72]);
    assert_eq!(draft.parts, vec![0, 0, 0]);
    // After the data, the frame goes on from past outputs (the prompt never saw 53).
    let mut ctx = context.to_vec();
    ctx.extend([70, 71, 72, 53]);
    braid.observe(&ctx);
    let draft = braid.propose(&ctx, 2).unwrap();
    assert_eq!(draft.tokens, vec![54, 55]);
    assert_eq!(draft.parts, vec![1, 1]);
    assert_eq!((braid.part_name(0), braid.part_name(1)), ("prompt", "past"));
}

/// A corpus where "1 2 3" is followed by 4 once, but "2 3" is followed by 5 thirty times.
fn corpus_index() -> Arc<Index<Vec<u8>>> {
    let spec = crate::tokenizer::TokenizerSpec::synthetic(100);
    let mut docs = vec![vec![1, 2, 3, 4, 7, 8]];
    docs.extend((0..30).map(|i| vec![10 + i % 20, 2, 3, 5, 6]));
    Arc::new(Index::from_docs(spec, &docs, 2, true).unwrap())
}

#[test]
fn corpus_rules_follow_the_longest_suffix_or_interpolate() {
    let ctx = [9, 1, 2, 3];
    // The longest suffix alone: 4, then the copy continues.
    let mut frequent = CorpusDrafter::with_rule(corpus_index(), CorpusRule::MostFrequent);
    assert_eq!(frequent.propose(&ctx, 3).unwrap().tokens, vec![4, 7, 8]);
    // SBIS weighs the shorter levels in: 1 + 0.1·1 + … for 4 against 0.1·30 + … for 5.
    let mut sbis = CorpusDrafter::new(corpus_index());
    let draft = sbis.propose(&ctx, 2).unwrap();
    assert_eq!(draft.tokens, vec![5, 6]);
    assert!(draft.confidence.iter().all(|&c| c > 0.0 && c < 1.0));
    let alternatives = sbis.alternatives(&ctx, 2).unwrap();
    assert_eq!(
        alternatives.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![5, 4]
    );
    // A one-token match is below min_match: no draft.
    assert!(sbis.propose(&[9, 3], 2).unwrap().tokens.is_empty());
    assert!(frequent.propose(&[42], 2).unwrap().tokens.is_empty());
    // A context that ends with the last draft's whole sequence, whose level spanned all of
    // it, is searched anew: "1 2 3 4" occurs, longer than "2 3" followed by 4.
    let mut resumed = CorpusDrafter::with_rule(corpus_index(), CorpusRule::MostFrequent);
    resumed.propose(&[2, 3], 1).unwrap();
    let mut anew = CorpusDrafter::with_rule(corpus_index(), CorpusRule::MostFrequent);
    let want = anew.propose(&[1, 2, 3, 4], 1).unwrap();
    assert_eq!(
        resumed.propose(&[1, 2, 3, 4], 1).unwrap().confidence,
        want.confidence
    );
}

/// The longest-suffix rule reads its level through the counts cache: the same tokens and
/// shares as the ∞-gram's counts of the index's query protocol, on random corpora (with
/// document ends and several shards) and random contexts.
#[test]
fn the_longest_suffix_rule_is_the_infgram_counts() {
    let mut next = numbers(0x9e37_79b9_7f4a_7c15);
    let mut drafted = 0;
    for round in 0..40 {
        let shards = 1 + (round as usize % 3);
        let Some((index, docs)) = random_index(&mut next, 6, 40, 4 + round % 6, shards) else {
            continue;
        };
        let mut frequent = CorpusDrafter::with_rule(index.clone(), CorpusRule::MostFrequent);
        for _ in 0..30 {
            let ctx: Vec<u32> = (0..1 + next(8)).map(|_| next(8) + 1).collect();
            let got = frequent.ranked(&ctx, 4).unwrap();
            let (len, counts) = index.infgram_counts(&ctx).unwrap();
            let total: u64 = counts.iter().map(|c| c.1).sum::<u64>().max(1);
            let mut want: Vec<(u32, f64)> = counts
                .into_iter()
                .map(|(t, c)| (t, (c as f64 + 0.5) / (total as f64 + 1.0)))
                .collect();
            if len < frequent.min_match {
                want.clear();
            }
            want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            want.truncate(4);
            let length = 1.0 - 0.5f64.powi(len.min(60) as i32);
            let want: Vec<(u32, f64)> = want.into_iter().map(|(t, p)| (t, p * length)).collect();
            assert_eq!(got, want, "docs {docs:?} ctx {ctx:?}");
            drafted += usize::from(!got.is_empty());
        }
    }
    assert!(drafted > 100, "{drafted}");
}

/// A draft under the longest-suffix rule follows its level from step to step, and from the
/// last draft's kept step to the next draft ([`Chain`]): the same tokens and confidences as
/// searching every step anew, on random corpora (with document ends, several shards) and
/// requests whose contexts grow past the window as an engine extends them.
#[test]
fn a_chained_draft_is_the_draft_searched_anew_each_step() {
    let mut next = numbers(0x2545_f491_4f6c_dd1d);
    let (mut steps, mut searched_again) = (0, 0);
    for round in 0..60 {
        let shards = 1 + (round as usize % 3);
        let Some((index, docs)) = random_index(&mut next, 8, 50, 3 + round % 5, shards) else {
            continue;
        };
        let mut chained = CorpusDrafter::with_rule(index.clone(), CorpusRule::MostFrequent);
        let mut fresh = CorpusDrafter::with_rule(index.clone(), CorpusRule::MostFrequent);
        chained.max_context = 24;
        fresh.max_context = 24;
        let mut ctx: Vec<u32> = Vec::new();
        for round in 0..40 {
            // A new request every 8 drafts; between, what an engine keeps of the last draft
            // and the model's own token (the window of 24 tokens moves on).
            if round % 8 == 0 {
                ctx = (0..2 + next(10)).map(|_| next(7) + 1).collect();
            }
            let draft = chained.propose(&ctx, 12).unwrap();
            // Step by step from the same window, each a search anew (no chain).
            let mut seq = ctx[ctx.len().saturating_sub(24)..].to_vec();
            let mut want = Draft::default();
            let mut reach = 1.0;
            while want.tokens.len() < 12 {
                fresh.chain = None;
                let Some((t, c)) = fresh.ranked(&seq, 1).unwrap().into_iter().next() else {
                    break;
                };
                want.tokens.push(t);
                want.confidence.push(c);
                seq.push(t);
                reach *= c;
                if reach < MIN_REACH {
                    break;
                }
            }
            assert_eq!(draft.tokens, want.tokens, "docs {docs:?} ctx {ctx:?}");
            assert_eq!(
                draft.confidence, want.confidence,
                "docs {docs:?} ctx {ctx:?}"
            );
            steps += draft.tokens.len();
            searched_again += usize::from(draft.tokens.len() > 1);
            let kept = next(draft.tokens.len() as u64 + 1) as usize;
            ctx.extend_from_slice(&draft.tokens[..kept]);
            ctx.push(match next(3) {
                0 => next(7) + 1,
                _ => draft.tokens.get(kept).copied().unwrap_or(1),
            });
        }
    }
    assert!(
        steps > 500 && searched_again > 100,
        "{steps} {searched_again}"
    );
}

/// Over shards held elsewhere (asked through [`Shards`], here an index answering for
/// itself), the corpus drafter drafts what it drafts over the index: the same tokens,
/// confidences and ranked alternatives, under both rules, on random corpora of 1–3 shards
/// with document ends, contexts grown as an engine grows them.
#[test]
fn over_shards_the_corpus_drafter_drafts_what_it_drafts_over_the_index() {
    let mut next = numbers(0x9e37_79b9_7f4a_7c15);
    let mut drafted = 0;
    for round in 0..48 {
        let shards = 1 + (round as usize % 3);
        let Some((index, docs)) = random_index(&mut next, 8, 60, 3 + round % 5, shards) else {
            continue;
        };
        let rule = match round % 2 {
            0 => CorpusRule::default(),
            _ => CorpusRule::MostFrequent,
        };
        let mut here = CorpusDrafter::with_rule(index.clone(), rule);
        let mut there = CorpusDrafter::with_rule(Arc::new(AskOnly(index.clone())), rule);
        let mut ctx: Vec<u32> = (0..2 + next(10)).map(|_| next(7) + 1).collect();
        for _ in 0..12 {
            let draft = here.propose(&ctx, 10).unwrap();
            let other = there.propose(&ctx, 10).unwrap();
            assert_eq!(draft.tokens, other.tokens, "docs {docs:?} ctx {ctx:?}");
            assert_eq!(
                draft.confidence, other.confidence,
                "docs {docs:?} ctx {ctx:?}"
            );
            assert_eq!(
                here.alternatives(&ctx, 3).unwrap(),
                there.alternatives(&ctx, 3).unwrap()
            );
            drafted += draft.tokens.len();
            let kept = next(draft.tokens.len() as u64 + 1) as usize;
            ctx.extend_from_slice(&draft.tokens[..kept]);
            ctx.push(next(7) + 1);
        }
    }
    assert!(drafted > 300, "{drafted}");
    // A token outside the vocabulary is refused there as here.
    let index = Arc::new(
        Index::from_docs(
            crate::tokenizer::TokenizerSpec::synthetic(12),
            &[vec![1, 2, 3]],
            1,
            true,
        )
        .unwrap(),
    );
    let there = Arc::new(AskOnly(index.clone()));
    assert!(CorpusDrafter::with_rule(there, CorpusRule::MostFrequent)
        .propose(&[1, 99], 4)
        .is_err());
}
