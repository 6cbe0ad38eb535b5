//! Prompt lookup against a brute-force oracle: the same rules (the longest suffix seen
//! before, its latest 16 occurrences' votes, a full match followed back, a copy that breaks
//! and resumes) computed by scanning the context, where `PromptLookup` walks its n-gram
//! index. Random contexts full of copies and edits, grown a few tokens at a time as a decode
//! loop grows them, sometimes replaced; every draft, ranked alternative and next token with its
//! confidence must be equal.

use infgram::decode::drafters::PromptLookup;
use infgram::decode::Drafter;
use proptest::prelude::*;

const RESYNC: usize = 4;
const RESUME_WINDOW: usize = 8;
const RESUME_LIFE: usize = 24;
const RESUME_BONUS: usize = 4;
const MAX_MATCH: usize = 256;
const MIN_REACH: f64 = 0.05;

fn copy_confidence(agree: u64, total: u64, len: usize) -> f64 {
    let against = 0.5 * 0.5f64.powf((len.max(1) - 1).min(240) as f64 / 4.0);
    let share = (agree as f64 + 0.5) / (total as f64 + 0.5 + against);
    share * (1.0 - 0.5f64.powi(len.min(60) as i32))
}

/// Prompt lookup by scanning: `indexed` tokens of the context are known, and the copy's
/// state is followed token by token.
struct Oracle {
    max_ngram: usize,
    indexed: Vec<u32>,
    source: Option<usize>,
    broke: Option<(usize, usize)>,
}

/// `(ranked (token, votes), occurrences, suffix length)`.
type Votes = (Vec<(u32, u64)>, u64, usize);

impl Oracle {
    fn new(max_ngram: usize) -> Oracle {
        Oracle {
            max_ngram,
            indexed: Vec::new(),
            source: None,
            broke: None,
        }
    }

    /// Positions `p` of the first `known` tokens that followed `seq[end - n..end]`, latest
    /// first (an n-gram is known once a token follows it, and only up to `max_ngram`).
    fn followers(&self, seq: &[u32], known: usize, end: usize, n: usize) -> Vec<usize> {
        if n > self.max_ngram {
            return Vec::new();
        }
        (n..known)
            .rev()
            .filter(|&p| seq[p - n..p] == seq[end - n..end])
            .collect()
    }

    fn sync(&mut self, context: &[u32]) {
        if !context.starts_with(&self.indexed) {
            self.indexed.clear();
            self.source = None;
            self.broke = None;
        }
        for p in self.indexed.len()..context.len() {
            self.track(context, p);
        }
        self.indexed = context.to_vec();
    }

    fn track(&mut self, context: &[u32], p: usize) {
        match self.source {
            Some(q) if q < p && context[q] == context[p] => {
                self.source = Some(q + 1);
                return;
            }
            Some(q) => {
                self.source = None;
                self.broke = Some((q, p));
            }
            None => {}
        }
        if self.broke.is_some_and(|(_, at)| p > at + RESUME_LIFE) {
            self.broke = None;
        }
        if p + 1 < RESYNC {
            return;
        }
        let found = self.followers(context, p + 1, p + 1, RESYNC);
        let after_break = self
            .broke
            .and_then(|(q, _)| found.iter().copied().filter(|&f| f > q).min());
        if let Some(f) = after_break.or_else(|| found.iter().copied().max()) {
            self.source = Some(f);
            self.broke = None;
        }
    }

    fn longest_suffix_votes(&self, seq: &[u32]) -> Option<Votes> {
        let known = self.indexed.len();
        for n in (1..=self.max_ngram.min(seq.len())).rev() {
            let found = self.followers(seq, known, seq.len(), n);
            let votes: Vec<u32> = found.iter().take(16).map(|&p| seq[p]).collect();
            if votes.is_empty() {
                continue;
            }
            let mut tally: Vec<(u32, u64)> = Vec::new();
            for v in &votes {
                match tally.iter_mut().find(|t| t.0 == *v) {
                    Some(t) => t.1 += 1,
                    None => tally.push((*v, 1)),
                }
            }
            tally.sort_by_key(|t| std::cmp::Reverse(t.1));
            let mut len = n;
            if n == self.max_ngram {
                if let Some(&p) = found.iter().find(|&&p| seq[p] == tally[0].0) {
                    let back = (0..MAX_MATCH.min(p))
                        .take_while(|&k| seq[p - 1 - k] == seq[seq.len() - 1 - k])
                        .count();
                    len = back.max(n);
                }
            }
            return Some((tally, votes.len() as u64, len));
        }
        None
    }

    fn resume(&self, seq: &[u32]) -> Option<Votes> {
        let (q, _) = self.broke?;
        for m in (1..RESYNC.min(seq.len() + 1)).rev() {
            let near = self
                .followers(seq, self.indexed.len(), seq.len(), m)
                .into_iter()
                .filter(|&f| f > q && f <= q + RESUME_WINDOW && f < seq.len())
                .min();
            if let Some(f) = near {
                return Some((vec![(seq[f], 1)], 1, m + RESUME_BONUS));
            }
        }
        None
    }

    fn tally(&self, seq: &[u32]) -> Option<Votes> {
        let votes = self.longest_suffix_votes(seq);
        if votes.as_ref().is_none_or(|v| v.2 < RESYNC) && self.source.is_none() {
            if let Some(r) = self.resume(seq) {
                return Some(r);
            }
        }
        votes
    }

    fn next(&self, seq: &[u32]) -> Option<(u32, f64)> {
        self.tally(seq)
            .map(|(t, total, len)| (t[0].0, copy_confidence(t[0].1, total, len)))
    }

    fn propose(&mut self, context: &[u32], max: usize) -> (Vec<u32>, Vec<f64>) {
        self.sync(context);
        let (mut seq, mut tokens, mut conf, mut reach) = (context.to_vec(), vec![], vec![], 1.0);
        while tokens.len() < max {
            let Some((t, c)) = self.next(&seq) else { break };
            tokens.push(t);
            conf.push(c);
            seq.push(t);
            reach *= c;
            if reach < MIN_REACH {
                break;
            }
        }
        (tokens, conf)
    }

    fn alternatives(&mut self, context: &[u32], n: usize) -> Vec<(u32, f64)> {
        self.sync(context);
        self.tally(context).map_or(Vec::new(), |(t, total, len)| {
            t.into_iter()
                .take(n)
                .map(|(tok, agree)| (tok, copy_confidence(agree, total, len)))
                .collect()
        })
    }
}

/// A text of copies: runs of fresh tokens, then stretches copied from earlier with a token
/// changed here and there, as a model quoting its prompt writes.
fn texty(seed: u64, len: usize, alphabet: u32) -> Vec<u32> {
    let mut s = seed | 1;
    let mut rnd = move |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n.max(1)
    };
    let mut t: Vec<u32> = Vec::new();
    while t.len() < len {
        if t.len() > 8 && rnd(3) > 0 {
            let from = rnd(t.len() as u64) as usize;
            let run = 1 + rnd(40) as usize;
            for k in 0..run {
                let tok = match rnd(12) {
                    0 => rnd(alphabet as u64) as u32,
                    _ => t[(from + k) % t.len()],
                };
                t.push(tok);
            }
        } else {
            t.push(rnd(alphabet as u64) as u32);
        }
    }
    t.truncate(len);
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn prompt_lookup_equals_scanning_the_context(
        seed in any::<u64>(),
        len in 1usize..420,
        alphabet in 2u32..40,
        max_ngram in 1usize..12,
        steps in proptest::collection::vec((0usize..9, 0usize..20, 0usize..4), 1..40),
    ) {
        let text = texty(seed, len, alphabet);
        let other = texty(seed ^ 0x5555, len, alphabet);
        let mut d = PromptLookup::new(max_ngram);
        let mut o = Oracle::new(max_ngram);
        let mut at = (len / 3).max(1);
        for (grow, max, what) in steps {
            at = (at + grow).min(len);
            // Now and then the context is not an extension of the last one: both start over.
            let source: &[u32] = match what == 3 && grow == 0 {
                true => &other,
                false => &text,
            };
            let context = &source[..at];
            match what {
                0 => prop_assert_eq!(d.alternatives(context, max).unwrap(), o.alternatives(context, max)),
                1 => {
                    // A token after the context and a draft of `max` tokens (not indexed).
                    let seq = &source[..(at + max).min(len)];
                    o.sync(context);
                    let want = o.next(seq);
                    prop_assert_eq!(d.next_after(seq, context.len()).unwrap(), want);
                }
                2 => {
                    d.observe(context);
                    o.sync(context);
                }
                _ => {
                    let got = d.propose(context, max).unwrap();
                    let (tokens, confidence) = o.propose(context, max);
                    prop_assert_eq!(&got.tokens, &tokens, "context {:?}", context);
                    prop_assert_eq!(&got.confidence, &confidence);
                }
            }
        }
    }
}

#[test]
fn a_long_copy_is_followed_back_256_tokens_and_no_further() {
    // A 600-token passage copied whole: the match is followed back to the cap.
    let passage: Vec<u32> = (0..600).map(|i| (i * 7919 % 1000) as u32).collect();
    let mut ctx = passage.clone();
    ctx.push(5000);
    ctx.extend(&passage[..400]);
    let mut d = PromptLookup::new(8);
    let mut o = Oracle::new(8);
    let got = d.propose(&ctx, 16).unwrap();
    let (tokens, confidence) = o.propose(&ctx, 16);
    assert_eq!(got.tokens, passage[400..416].to_vec());
    assert_eq!((got.tokens, got.confidence), (tokens, confidence));
}

#[test]
fn a_copy_of_the_context_from_its_first_token() {
    // The match runs back to the context's first token, and a draft copies on.
    let passage: Vec<u32> = (10..50).collect();
    let mut ctx = passage.clone();
    ctx.extend(&passage[..30]);
    for max_ngram in [1, 4, 8, 30, 32] {
        let mut d = PromptLookup::new(max_ngram);
        let mut o = Oracle::new(max_ngram.min(32));
        let got = d.propose(&ctx, 10).unwrap();
        assert_eq!(
            got.tokens,
            passage[30..40].to_vec(),
            "max_ngram {max_ngram}"
        );
        assert_eq!((got.tokens, got.confidence), o.propose(&ctx, 10));
        assert_eq!(d.alternatives(&ctx, 3).unwrap(), o.alternatives(&ctx, 3));
    }
    // Too short to have anything before it: no draft, no panic.
    let mut d = PromptLookup::new(8);
    assert!(d.propose(&[7], 4).unwrap().tokens.is_empty());
    assert!(d.propose(&[], 4).unwrap().tokens.is_empty());
}
