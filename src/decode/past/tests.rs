//! The tests of the parent module (kept apart to keep it short).

use super::*;

/// Brute force: the longest suffix of `ctx` (within the window) occurring in one of
/// `outputs`, and the counts of the tokens that follow its occurrences.
fn oracle(outputs: &[Vec<u32>], ctx: &[u32]) -> (usize, Vec<(u32, u32)>) {
    let tail = &ctx[ctx.len().saturating_sub(MATCH_WINDOW)..];
    for len in (1..=tail.len()).rev() {
        let suffix = &tail[tail.len() - len..];
        let mut found = false;
        let mut next: Vec<(u32, u32)> = Vec::new();
        for o in outputs {
            for end in len..=o.len() {
                if o[end - len..end] == *suffix {
                    found = true;
                    if let Some(&t) = o.get(end) {
                        match next.iter_mut().find(|n| n.0 == t) {
                            Some(n) => n.1 += 1,
                            None => next.push((t, 1)),
                        }
                    }
                }
            }
        }
        if found {
            next.sort();
            return (len, next);
        }
    }
    (0, Vec::new())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// The automaton's longest match and continuation counts equal brute force, after
    /// every append, on small alphabets (many repeats, many clones).
    #[test]
    fn continuations_equal_brute_force(
        vocab in 2u32..6,
        outputs in proptest::collection::vec(proptest::collection::vec(0u32..6, 0..40), 1..6),
        contexts in proptest::collection::vec(proptest::collection::vec(0u32..6, 1..12), 1..10),
    ) {
        let mut past = PastOutputs::new(1 << 20);
        let mut kept: Vec<Vec<u32>> = Vec::new();
        for o in outputs {
            let o: Vec<u32> = o.into_iter().map(|t| t % vocab).collect();
            past.append(&o);
            if !o.is_empty() {
                kept.push(o);
            }
            for ctx in &contexts {
                let ctx: Vec<u32> = ctx.iter().map(|t| t % vocab).collect();
                let (len, mut next) = past.continuations(&ctx);
                next.sort();
                proptest::prop_assert_eq!((len, next), oracle(&kept, &ctx));
            }
        }
    }
}

#[test]
fn drafts_follow_the_most_frequent_continuation_and_never_cross_outputs() {
    let mut past = PastOutputs::new(1000);
    past.append(&[1, 2, 3, 4, 5]);
    past.append(&[1, 2, 3, 9]);
    past.append(&[7, 2, 3, 4, 6]);
    // "2 3" → 4 twice, 9 once; then "2 3 4" → 5 or 6, once each: the most recent (6).
    let d = past.draft(&[8, 2, 3], 4);
    assert_eq!(d.tokens, vec![4, 6]);
    assert!(d.confidence.iter().all(|&c| c > 0.0 && c < 1.0));
    // The end of an output is not followed into the next one.
    assert!(past.draft(&[3, 4, 5], 4).tokens.is_empty());
    assert!(past.draft(&[42], 4).tokens.is_empty());
    assert_eq!(past.continuations(&[9]), (1, vec![]));
}

#[test]
fn the_budget_drops_the_oldest_outputs() {
    let mut past = PastOutputs::new(10);
    past.append(&[1, 2, 3, 4]);
    past.append(&[5, 6, 7, 8]);
    past.append(&[9, 10, 11]);
    // 11 > 10: the oldest tokens go until the new one fits in three quarters (8); the
    // oldest output kept is cut at its start.
    assert_eq!(
        past.outputs().collect::<Vec<_>>(),
        vec![&[4][..], &[5, 6, 7, 8], &[9, 10, 11]]
    );
    assert_eq!(past.stats().tokens, 8);
    assert!(past.draft(&[1, 2], 2).tokens.is_empty());
    assert_eq!(past.draft(&[6], 2).tokens, vec![7, 8]);
    // An output longer than the budget keeps its tail.
    past.append(&(100..120).collect::<Vec<_>>());
    assert_eq!(
        past.outputs().collect::<Vec<_>>(),
        vec![&(110..120).collect::<Vec<_>>()[..]]
    );
}

/// A store over the budget was loaded as nothing and emptied by the next
/// save; a store at the budget kept only the newest output after one append.
#[test]
fn a_store_never_loses_what_it_held_without_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s150.bin");
    let long: Vec<u32> = (0..150).collect();
    let mut past = PastOutputs::new(1000);
    past.append(&long);
    past.save(&path, "fp").unwrap();
    let before = std::fs::read(&path).unwrap();
    let e = PastOutputs::load(&path, "fp", 1000, 100)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("holds 150 tokens") && e.contains("--past-output-tokens 150"),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before, "the file is kept");
    // At the budget exactly: loads whole; one more output keeps the newest tokens that
    // fit (three quarters of the budget), the old output's tail included.
    let mut full = PastOutputs::load(&path, "fp", 1000, 150).unwrap();
    assert_eq!(full.stats().tokens, 150);
    full.append(&[900, 901, 902, 903]);
    let kept: Vec<u32> = full.outputs().flatten().copied().collect();
    let keep = 150 - 150 / 4;
    assert_eq!(kept.len(), keep);
    assert_eq!(kept[..keep - 4], long[150 - (keep - 4)..]);
    assert_eq!(kept[keep - 4..], [900, 901, 902, 903]);
    assert_eq!(full.draft(&[140, 141], 2).tokens, vec![142, 143]);
}

#[test]
fn a_saved_file_loads_back_and_foreign_files_are_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("past.bin");
    assert_eq!(
        PastOutputs::load(&path, "fp", 100, 100)
            .unwrap()
            .stats()
            .outputs,
        0
    );
    let mut past = PastOutputs::new(100);
    past.append(&[1, 2, 3]);
    past.append(&[4, 5]);
    past.save(&path, "fp").unwrap();
    let back = PastOutputs::load(&path, "fp", 100, 100).unwrap();
    assert_eq!(
        back.outputs().collect::<Vec<_>>(),
        vec![&[1, 2, 3][..], &[4, 5]]
    );
    // A smaller budget than the file holds: refused (loading would lose the oldest).
    let e = PastOutputs::load(&path, "fp", 100, 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds 5 tokens") && e.contains("4"), "{e}");
    let e = PastOutputs::load(&path, "other", 100, 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("another tokenizer"), "{e}");
    // Truncated: refused.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let e = PastOutputs::load(&path, "fp", 100, 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    // A user's file is neither read as outputs nor replaced.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "my notes\n").unwrap();
    assert!(PastOutputs::load(&notes, "fp", 100, 100).is_err());
    assert!(past.save(&notes, "fp").is_err());
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes\n");
}

/// The states' counts and latest ends, to compare two constructions.
fn counts(past: &PastOutputs) -> Vec<(u32, u32)> {
    let st = &past.automaton.states;
    st.iter().skip(1).map(|s| (s.count, s.last_end)).collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
    /// Counts computed anew (a load, a rebuild) equal the counts kept by walking after
    /// every token, state by state, on small alphabets (long repetitions, many clones).
    #[test]
    fn recounted_counts_equal_walked_counts(
        outputs in proptest::collection::vec(proptest::collection::vec(0u32..3, 0..60), 1..8),
    ) {
        let mut walked = PastOutputs::new(1 << 20);
        for o in &outputs {
            walked.append(o);
        }
        let loaded = PastOutputs::from_outputs(1 << 20, outputs.clone());
        proptest::prop_assert_eq!(counts(&loaded), counts(&walked));
        proptest::prop_assert_eq!(loaded.stats(), walked.stats());
        let mut forced = walked.clone();
        forced.automaton.recount();
        proptest::prop_assert_eq!(counts(&forced), counts(&walked));
    }
}

/// One output of equal tokens walks its whole match after every token (quadratic); the
/// walk is cut and the counts recounted, in linear work, whether appended or loaded.
#[test]
fn repetitions_cost_linear_work() {
    let n = 50_000usize;
    let mut past = PastOutputs::new(1 << 20);
    past.append(&vec![7; n]);
    assert!(
        past.automaton.work < 8 * n as u64,
        "{}",
        past.automaton.work
    );
    assert_eq!(past.draft(&[7, 7], 3).tokens, vec![7, 7, 7]);
    let loaded = PastOutputs::from_outputs(1 << 20, vec![vec![7; n]]);
    assert!(loaded.automaton.work < 8 * n as u64);
    assert_eq!(counts(&loaded), counts(&past));
    // Many one-token outputs: a periodic sequence, as long a walk after each.
    let many: Vec<Vec<u32>> = (0..n).map(|_| vec![3]).collect();
    let loaded = PastOutputs::from_outputs(1 << 20, many);
    assert_eq!(loaded.stats().outputs, n);
    assert!(loaded.automaton.work < 8 * n as u64);
}

#[test]
fn files_that_would_fail_later_are_refused_at_load_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("past.bin");
    let mut past = PastOutputs::new(100);
    past.append(&[1, 2, 3]);
    past.save(&path, "fp").unwrap();
    let saved = std::fs::read(&path).unwrap();
    // An id outside the vocabulary (every completion drafting it would fail).
    let e = PastOutputs::load(&path, "fp", 3, 100)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("token id 3") && e.contains("vocabulary of 3"),
        "{e}"
    );
    // Larger than the budget can fill: refused before it is read.
    let big = dir.path().join("big.bin");
    let mut bytes = saved.clone();
    bytes.resize(max_file_bytes(100) as usize + 4, 0);
    std::fs::write(&big, &bytes).unwrap();
    let e = PastOutputs::load(&big, "fp", 100, 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than past outputs of 100 tokens"), "{e}");
    // A header line longer than a save accepts: refused at load too.
    let long = dir.path().join("long.bin");
    let header = format!(
        "{{\"magic\":\"{MAGIC}\",\"version\":1,\"tokenizer\":\"fp\",\"pad\":\"{}\"}}\n",
        "x".repeat(5000)
    );
    std::fs::write(&long, &header).unwrap();
    assert!(PastOutputs::load(&long, "fp", 100, 100).is_err());
    // A path that cannot be written: refused at load, not at the first save.
    let nowhere = dir.path().join("missing/past.bin");
    let e = PastOutputs::load(&nowhere, "fp", 100, 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
    let link = dir.path().join("link.bin");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(PastOutputs::load(&link, "fp", 100, 100).is_err());
    assert!(past.save(&link, "fp").is_err());
    assert_eq!(std::fs::read(&path).unwrap(), saved);
    assert_eq!(std::fs::read(&big).unwrap(), bytes);
    assert_eq!(std::fs::read_to_string(&long).unwrap(), header);
}

/// A link or a file planted at the old temporary name (`FILE.tmp-PID`) is neither
/// followed nor consumed by a save.
#[test]
fn a_save_never_follows_a_planted_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.bin");
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "mine").unwrap();
    let planted = dir.path().join(format!("p.bin.tmp-{}", std::process::id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let mut past = PastOutputs::new(100);
    past.append(&[1, 2]);
    past.save(&path, "fp").unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
    assert!(planted.symlink_metadata().unwrap().file_type().is_symlink());
    assert!(path.symlink_metadata().unwrap().file_type().is_file());
    let back = PastOutputs::load(&path, "fp", 100, 100).unwrap();
    assert_eq!(back.outputs().collect::<Vec<_>>(), vec![&[1, 2][..]]);
}

#[test]
fn concurrent_generations_read_while_one_appends() {
    let shared = PastOutputs::shared(1 << 16);
    remember(&shared, &[1, 2, 3, 4]);
    std::thread::scope(|s| {
        for k in 0..4u32 {
            let shared = shared.clone();
            s.spawn(move || {
                let mut d = PastOutputDrafter::new(shared.clone());
                for i in 0..200 {
                    let draft = d.propose(&[1, 2], 2).unwrap();
                    assert_eq!(draft.tokens.first(), Some(&3));
                    remember(&shared, &[1, 2, 3, 100 + k, i]);
                }
            });
        }
    });
    assert_eq!(shared.read().unwrap().stats().outputs, 801);
}
