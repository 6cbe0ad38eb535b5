//! Drafts for other engines: a drafting session (`service::drafts::Drafts`) makes
//! the decode loop's drafts for the same contexts, and sessions driven from many threads make
//! the drafts one thread makes.

use infgram::decode::past::PastOutputs;
use infgram::decode::policy::CostModel;
use infgram::decode::{decode, DecodeConfig, Sampler, SamplerConfig};
use infgram::index::pipeline::{build_index, BuildOptions};
use infgram::ngram::{Estimator, InfgramModel};
use infgram::service::drafts::Drafts;
use infgram::service::generate::{drafters, AssemblyOptions};
use infgram::service::request::{CorpusRule, DrafterSpec};
use infgram::service::PastStore;
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use infgram::Index;
use std::path::Path;
use std::sync::Arc;

/// A small xorshift generator (the tests need no `rand` seed discipline of their own).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const WORDS: [&str; 12] = [
    "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "its", "log",
];

/// `docs` documents of random words, byte-level, indexed at `dir/name`.
fn corpus(
    dir: &Path,
    name: &str,
    docs: usize,
    rng: &mut Rng,
) -> (Arc<Index<memmap2::Mmap>>, Vec<String>) {
    let files = dir.join(format!("{name}-docs"));
    std::fs::create_dir_all(&files).unwrap();
    let mut texts = Vec::new();
    for d in 0..docs {
        let n = 20 + rng.below(60);
        let text: Vec<&str> = (0..n).map(|_| WORDS[rng.below(WORDS.len())]).collect();
        let text = text.join(" ");
        std::fs::write(files.join(format!("{d}.txt")), &text).unwrap();
        texts.push(text);
    }
    let out = dir.join(name);
    build_index(&[files], &out, &ByteTokenizer, &BuildOptions::default()).unwrap();
    (Arc::new(Index::open(&out).unwrap()), texts)
}

/// Greedy decoding with the ∞-gram of `scorer` as the model and prompt lookup plus the corpus
/// of `drafting` as drafters, then the same passes replayed through a drafting session: each
/// pass's draft has the decode loop's length and drafter, and as many of its tokens are kept.
/// The cases alternate the corpus drafter's two rules.
#[test]
fn a_session_drafts_what_the_decode_loop_drafts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed);
    let (drafting, texts) = corpus(tmp.path(), "drafting", 30, &mut rng);
    let (scoring, _) = corpus(tmp.path(), "scoring", 30, &mut rng);
    let (max_tokens, draft_max) = (120, 8);
    let mut passes_with_drafts = 0;
    for case in 0..12 {
        let text = &texts[case % texts.len()];
        let cut = text.len() / 2 + case;
        let prompt = ByteTokenizer.encode(&text[..cut.min(text.len())]).unwrap();
        let specs = vec![
            DrafterSpec::PromptLookup,
            DrafterSpec::PastOutputs,
            DrafterSpec::Corpus,
        ];
        let rule = match case % 2 {
            0 => CorpusRule::Sbis,
            _ => CorpusRule::LongestSuffix,
        };
        let opts = AssemblyOptions {
            drafters: specs,
            corpus_rule: rule,
            drafting_index: Some(drafting.clone()),
            repetition_penalty: 1.0,
            guard: None,
            past_outputs: None,
            vocabulary: None,
        };
        let mut loop_drafters = drafters(&opts).unwrap();
        let estimator = Estimator::Sbis { k: -1, decay: 0.1 };
        let mut model = InfgramModel::new(scoring.clone(), estimator, 200).unwrap();
        let cfg = DecodeConfig {
            max_tokens,
            draft_max,
            cost: CostModel::default().frozen(),
            trace: true,
            ..Default::default()
        };
        let greedy = SamplerConfig {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        };
        let (output, stats) = decode(
            &mut model,
            &mut loop_drafters,
            &mut [],
            &mut Sampler::new(greedy, None),
            &prompt,
            &cfg,
            |_| {},
        )
        .unwrap();
        let drafts = Drafts::new(Some(drafting.clone()), None, true, rule).unwrap();
        drafts.start("r", &prompt).unwrap();
        for pass in &stats.trace {
            let budget = max_tokens - pass.at;
            let d = drafts
                .draft("r", draft_max.min(budget.saturating_sub(1)), false)
                .unwrap();
            assert_eq!(
                d.token_ids.len(),
                pass.drafted,
                "case {case}, pass at {}",
                pass.at
            );
            assert_eq!(d.sources.first().cloned(), pass.drafter, "case {case}");
            let kept = &output[pass.at..pass.at + pass.emitted];
            let accepted = d
                .token_ids
                .iter()
                .zip(kept)
                .take_while(|(a, b)| a == b)
                .count();
            assert_eq!(accepted, pass.accepted, "case {case}, pass at {}", pass.at);
            let chain: Vec<Option<usize>> =
                (0..d.token_ids.len()).map(|i| i.checked_sub(1)).collect();
            assert_eq!(d.parents, chain);
            assert_eq!(d.probs.len(), d.token_ids.len());
            passes_with_drafts += usize::from(pass.drafted > 0);
            drafts.extend("r", kept).unwrap();
        }
    }
    assert!(
        passes_with_drafts > 20,
        "{passes_with_drafts} passes drafted"
    );
}

/// Trees: the main chain comes first (parents `None, 0, 1, …`), every branch node follows an
/// earlier node or the context, and every node has its probability and source.
#[test]
fn a_tree_is_a_main_chain_with_branches() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(7);
    let (index, texts) = corpus(tmp.path(), "c", 20, &mut rng);
    let past = PastOutputs::shared(1 << 12);
    infgram::decode::past::remember(&past, &ByteTokenizer.encode(&texts[3]).unwrap());
    let store = PastStore::new(past, None, &ByteTokenizer);
    let drafts = Drafts::new(Some(index), Some(store), true, Default::default()).unwrap();
    let mut branched = 0;
    for (i, text) in texts.iter().enumerate() {
        let context = ByteTokenizer.encode(&text[..text.len() / 3]).unwrap();
        let tree = drafts.draft_once(&context, 12, true).unwrap();
        let n = tree.token_ids.len();
        assert_eq!(
            (tree.probs.len(), tree.sources.len(), tree.parents.len()),
            (n, n, n)
        );
        let main = (0..n)
            .take_while(|&k| tree.parents[k] == k.checked_sub(1))
            .count();
        assert!(main <= 12, "text {i}: a main chain of {main}");
        for (k, p) in tree.parents.iter().enumerate().skip(main) {
            assert!(p.is_none_or(|p| p < k), "text {i}: node {k} follows {p:?}");
        }
        branched += usize::from(n > main);
    }
    // (The frozen prior cost table is the CPU's: a branch's rows seldom pay there.)
    let _ = branched;
}

/// 32 threads drafting for 256 interleaved requests get the drafts one thread gets.
#[test]
fn sessions_draft_the_same_from_many_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(99);
    let (index, texts) = corpus(tmp.path(), "c", 40, &mut rng);
    // Each request: a prompt, then three rounds of (draft, extend by the text's next bytes).
    let requests: Vec<(Vec<u32>, Vec<Vec<u32>>)> = (0..256)
        .map(|r| {
            let ids = ByteTokenizer.encode(&texts[r % texts.len()]).unwrap();
            let cut = ids.len() / 3 + r % 7;
            let rounds = (0..3)
                .map(|k| ids[cut + 5 * k..cut + 5 * k + 5].to_vec())
                .collect();
            (ids[..cut].to_vec(), rounds)
        })
        .collect();
    // Each thread's requests interleaved: all started, then round by round, then finished.
    let run = |drafts: &Drafts, rs: &[usize]| -> Vec<(usize, Vec<Vec<u32>>)> {
        for &r in rs {
            drafts.start(&format!("req-{r}"), &requests[r].0).unwrap();
        }
        let mut out = vec![Vec::new(); rs.len()];
        for k in 0..3 {
            for (j, &r) in rs.iter().enumerate() {
                let id = format!("req-{r}");
                out[j].push(drafts.draft(&id, 8, true).unwrap().token_ids);
                drafts.extend(&id, &requests[r].1[k]).unwrap();
            }
        }
        for &r in rs {
            drafts.finish(&format!("req-{r}")).unwrap();
        }
        rs.iter().copied().zip(out).collect()
    };
    let n = requests.len();
    let one = Drafts::new(Some(index.clone()), None, true, Default::default()).unwrap();
    let all: Vec<usize> = (0..n).collect();
    let alone: Vec<Vec<Vec<u32>>> = run(&one, &all).into_iter().map(|(_, d)| d).collect();
    let shared = Arc::new(Drafts::new(Some(index), None, true, Default::default()).unwrap());
    let results: Vec<(usize, Vec<Vec<u32>>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32)
            .map(|t| {
                let shared = shared.clone();
                let run = &run;
                s.spawn(move || {
                    let mine: Vec<usize> = (t..n).step_by(32).collect();
                    run(&shared, &mine)
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(results.len(), n);
    for (r, drafts) in results {
        assert_eq!(drafts, alone[r], "request {r}");
    }
    assert_eq!(shared.open_sessions(), 0);
}

/// An outside speculative loop (what an engine's hook does, and what Python's
/// `infgram.speculative.generate` does) over infgram's own model, SmolLM2: it feeds the
/// pending token and a session's draft in one pass, keeps the prefix its greedy choices
/// agree with, cuts its cache back, and extends the session. Its output is plain greedy
/// decoding's, and the library's decode loop writes the same.
#[cfg(feature = "neural")]
#[test]
fn an_outside_loop_over_infgrams_model_keeps_plain_decodings_output() {
    use infgram::lm::LanguageModel;
    fn argmax(row: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as u32
    }
    fn outside_loop(
        model: &mut dyn LanguageModel,
        drafts: Option<&Drafts>,
        prompt: &[u32],
        max_tokens: usize,
    ) -> (Vec<u32>, usize) {
        let (&last, head) = prompt.split_last().unwrap();
        model.clear();
        model.feed(head).unwrap();
        let eos = model.eos_tokens().to_vec();
        let (mut cached, mut pending, mut out, mut accepted) = (head.len(), last, Vec::new(), 0);
        if let Some(d) = drafts {
            d.start("x", prompt).unwrap();
        }
        while out.len() < max_tokens {
            let room = max_tokens - out.len() - 1;
            let draft = match drafts {
                Some(d) if room > 0 => d.draft("x", room.min(16), false).unwrap().token_ids,
                _ => Vec::new(),
            };
            let fed: Vec<u32> = std::iter::once(pending)
                .chain(draft.iter().copied())
                .collect();
            let rows = model.forward(&fed).unwrap();
            let kept = draft
                .iter()
                .zip(&rows)
                .take_while(|(&t, row)| argmax(row) == t)
                .count();
            accepted += kept;
            let mut emitted = draft[..kept].to_vec();
            emitted.push(argmax(&rows[kept]));
            model.truncate(cached + 1 + kept);
            cached += 1 + kept;
            let room = max_tokens - out.len();
            emitted.truncate(room);
            if let Some(end) = emitted.iter().position(|t| eos.contains(t)) {
                emitted.truncate(end + 1);
            }
            out.extend_from_slice(&emitted);
            if let Some(d) = drafts {
                d.extend("x", &emitted).unwrap();
            }
            if out.last().is_some_and(|t| eos.contains(t)) {
                break;
            }
            pending = *out.last().unwrap();
        }
        (out, accepted)
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut loaded =
        infgram::service::models::load_model("smollm2-135m", &Default::default()).unwrap();
    let tok = &loaded.tokenizer;
    let text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n";
    let corpus = tmp.path().join("c");
    std::fs::create_dir_all(&corpus).unwrap();
    std::fs::write(corpus.join("a.txt"), text.repeat(3)).unwrap();
    build_index(
        &[corpus],
        &tmp.path().join("ix"),
        tok,
        &BuildOptions::default(),
    )
    .unwrap();
    let index = Arc::new(Index::open(&tmp.path().join("ix")).unwrap());
    let drafts = Drafts::new(Some(index), None, true, Default::default()).unwrap();
    for prompt in [
        "Repeat exactly: First Citizen:\nBefore we proceed any further, hear me speak.\n",
        "First Citizen:\nBefore we proceed",
        "The capital of France is",
    ] {
        let ids = tok.encode(prompt).unwrap();
        let model = loaded.model.as_mut();
        let (plain, _) = outside_loop(model, None, &ids, 48);
        let (spec, accepted) = outside_loop(model, Some(&drafts), &ids, 48);
        assert_eq!(spec, plain, "{prompt:?}");
        let greedy = SamplerConfig {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        };
        let cfg = DecodeConfig {
            max_tokens: 48,
            ..Default::default()
        };
        let (library, _) = decode(
            model,
            &mut [],
            &mut [],
            &mut Sampler::new(greedy, None),
            &ids,
            &cfg,
            |_| {},
        )
        .unwrap();
        assert_eq!(library, plain, "{prompt:?}");
        if prompt.starts_with("Repeat") {
            assert!(accepted > 10, "{accepted} accepted");
        }
    }
}

/// A session's request id counts in the store's bytes (60 KB ids held 209 MB while the store
/// said 1 MB): a session whose id alone passes the budget is refused, and the store's bytes
/// grow with the ids it holds; a call that syncs its context drafts from the session it synced.
#[test]
fn request_ids_count_in_the_sessions_bytes() {
    use infgram::service::drafts::SessionStore;
    let store = Arc::new(SessionStore::new(4096, 100_000));
    let drafts =
        Drafts::with_store(None, None, true, CorpusRule::default(), store.clone()).unwrap();
    let prompt: Vec<u32> = ByteTokenizer
        .encode("the cat sat on the mat. the cat")
        .unwrap();
    drafts.start("short", &prompt).unwrap();
    let small = store.bytes();
    let long_id = "x".repeat(10_000);
    drafts.start(&long_id, &prompt).unwrap();
    assert!(
        store.bytes() >= small + 2 * 10_000,
        "{} bytes",
        store.bytes()
    );
    let huge_id = "y".repeat(60_000);
    let e = drafts.start(&huge_id, &prompt).unwrap_err().to_string();
    assert!(e.contains("more than all sessions may"), "{e}");
    assert!(store.bytes() <= 100_000);
    let draft = drafts.sync_and_draft("short", &prompt, 4, false).unwrap();
    assert!(draft.token_ids.len() <= 4);
}
