//! The one door of scoring: a [`ScoreRequest`] names the texts and what scores them (the
//! ∞-gram of an index, a fixed-order n-gram model, a neural model, or the mixture of a neural
//! model and the ∞-gram) and [`score`] gives one [`ScoreReport`]. The front ends (`infgram ppl`,
//! Python's `Index.perplexity`) build a request and print or return the report; the defaults,
//! the range checks and the order of the work are here. [`fit_mixer`] fits the mixer a
//! mixture's scoring reads (`infgram mix fit`); [`classic_report`] and [`write_arpa_file`]
//! serve a fixed-order model held by a front end (Python's `NgramModel`).

use crate::index::shards::Shards;
use crate::index::Index;
use crate::ngram::classic::{is_sentence_index, KENLM_FALLBACK};
use crate::ngram::smoothed::fit_on_train;
use crate::ngram::{Estimator, EstimatorSpec};
use crate::tokenizer::{ByteTokenizer, Tokenizer};
use crate::{Error, Result};
use serde::Serialize;
use std::path::PathBuf;

pub use crate::eval::classic::ClassicReport;
pub use crate::eval::{Agreement, PplReport};
pub use crate::mix::score::{ScoredMixture, OVERLAP_DROP, OVERLAP_N, OVERLAP_WARN};
pub use crate::mix::Mixer;
pub use crate::ngram::arpa::ArpaSummary;
pub use crate::ngram::classic::ClassicModel;
pub use crate::ngram::smoothed::Discounts;

use super::models::ModelOptions;

/// The context of the ∞-gram's perplexity when a request does not give one (tokens).
pub const DEFAULT_CONTEXT: usize = 100;
/// A neural model's scoring window when a request does not give one (tokens).
pub const DEFAULT_WINDOW: usize = 1024;
/// … and the window's stride.
pub const DEFAULT_STRIDE: usize = 512;

/// One text to score, with the name a report and an error give it (a file's path).
#[derive(Clone, Debug)]
pub struct Document {
    /// Its name.
    pub name: String,
    /// Its contents.
    pub text: String,
}

/// What the ∞-gram and the fixed-order models count in.
#[derive(Clone, Debug)]
pub enum Reference {
    /// An index directory (with its own tokenizer).
    Index(PathBuf),
    /// Corpus files, indexed byte-level once and cached.
    Corpus(Vec<PathBuf>),
    /// The first fraction of the (one) text, indexed byte-level; the rest is scored (the
    /// Tiny Shakespeare protocol: 0.9).
    Split(f64),
}

/// A neural model's part of a request: the model alone, or (with the request's
/// [`Reference::Index`]) the model, the ∞-gram and their mixture.
#[derive(Clone, Debug)]
pub struct ModelScoring {
    /// The model (`smollm2-135m`, a `.gguf` file, `hf:OWNER/REPO`…).
    pub model: String,
    /// How it is loaded and run.
    pub options: ModelOptions,
    /// Window length in tokens.
    pub window: usize,
    /// Window stride in tokens.
    pub stride: usize,
    /// Only the first `limit` tokens of each text (0: all).
    pub limit: usize,
    /// The mixer (λ per position) file; `None`: the built-in one.
    pub mix: Option<PathBuf>,
    /// Other mixers scored on the same passes (`None`: the built-in one), each mixing in the
    /// same ∞-gram distribution as `mix`.
    pub compare: Vec<Option<PathBuf>>,
    /// Leave texts whose share of 13-token windows found in the index is above this out of
    /// the headline figures.
    pub max_overlap: Option<f64>,
    /// Also compute the ∞-gram's own (smoothed) perplexity, the slow part on a large index.
    pub infgram_ppl: bool,
}

impl ModelScoring {
    /// `model` with the default windows, the built-in mixer and the ∞-gram's perplexity.
    pub fn new(model: impl Into<String>, options: ModelOptions) -> Self {
        ModelScoring {
            model: model.into(),
            options,
            window: DEFAULT_WINDOW,
            stride: DEFAULT_STRIDE,
            limit: 0,
            mix: None,
            compare: Vec::new(),
            max_overlap: None,
            infgram_ppl: true,
        }
    }
}

/// A scoring request: the texts, what they are scored with, and its settings.
#[derive(Clone, Debug)]
pub struct ScoreRequest {
    /// The texts. The ∞-gram and the fixed-order models score one; a neural model scores each
    /// on its own and pools their tokens.
    pub texts: Vec<Document>,
    /// What the ∞-gram counts in (required without a model; with a model, an index makes the
    /// mixture).
    pub reference: Option<Reference>,
    /// The ∞-gram or fixed-order estimator (not with a model: a mixture's is its mixer's).
    pub estimator: EstimatorSpec,
    /// Smoothed estimator: its discounts (3 or 9 values) instead of fitting or the defaults.
    pub discounts: Option<Vec<f64>>,
    /// mkn: KenLM's `--discount_fallback` (no values: KenLM's defaults, or three).
    pub discount_fallback: Option<Vec<f64>>,
    /// Fixed-order models: each line a sentence `<s> … </s>` (a sentence-mode index).
    pub sentences: bool,
    /// The ∞-gram's context in tokens.
    pub context: usize,
    /// Probability given to a token the estimator gives 0, in (0, 1).
    pub floor: Option<f64>,
    /// Score with a neural model instead.
    pub model: Option<ModelScoring>,
}

impl ScoreRequest {
    /// `texts` scored by SBIS with its defaults and nothing else set.
    pub fn new(texts: Vec<Document>) -> Self {
        ScoreRequest {
            texts,
            reference: None,
            estimator: EstimatorSpec::default(),
            discounts: None,
            discount_fallback: None,
            sentences: false,
            context: DEFAULT_CONTEXT,
            floor: None,
            model: None,
        }
    }
}

/// A fixed-order model's score, with the model's own figures.
#[derive(Clone, Debug, Serialize)]
pub struct ClassicScore {
    /// The score.
    #[serde(flatten)]
    pub report: ClassicReport,
    /// The model's order.
    pub order: usize,
    /// Its discounts per order (`[unused, D1, D2, D3+]`).
    pub discounts: Vec<[f64; 4]>,
    /// Seconds spent estimating it.
    pub estimate_seconds: f64,
    /// Distinct n-grams per order.
    pub ngrams: Vec<u64>,
}

/// A neural model's perplexity over the texts, in windows.
#[derive(Clone, Debug, Serialize)]
pub struct ModelPpl {
    /// Perplexity.
    pub ppl: f64,
    /// Scored tokens.
    pub tokens: usize,
    /// `log2(ppl)`.
    pub bits_per_token: f64,
    /// Bits per byte of the scored text (to compare with byte-level models).
    pub bits_per_byte: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The window.
    pub window: usize,
    /// Its stride.
    pub stride: usize,
}

/// What [`score`] gives, by what scored.
#[derive(Clone, Debug)]
pub enum ScoreReport {
    /// The ∞-gram (infgram, SBIS, smoothed) with the agreement analysis; the smoothed
    /// estimator's discounts.
    Infgram {
        /// The perplexity and agreement.
        report: PplReport,
        /// The smoothed estimator's discounts (given or fitted); `None` for the others.
        discounts: Option<Discounts>,
    },
    /// A fixed-order model.
    Classic(ClassicScore),
    /// A neural model alone.
    Model(ModelPpl),
    /// A neural model, the ∞-gram and their mixture, with the mixers compared.
    Mixture {
        /// Under the request's mixer.
        main: ScoredMixture,
        /// Under each compared mixer, with its name (`default` for the built-in one).
        compared: Vec<(String, ScoredMixture)>,
    },
}

/// Scores a request (see [`ScoreRequest`]); a bad setting is an [`Error::Field`] naming the
/// request's field (`split`, `discounts`, `discount_fallback`, `context`, `estimator.k`…).
pub fn score(req: &ScoreRequest) -> Result<ScoreReport> {
    if let Some(m) = &req.model {
        if req.texts.is_empty() {
            return Err(Error::input("no text to score"));
        }
        return score_with_model(req, m);
    }
    let doc = one_text(req)?;
    match req.reference.as_ref().ok_or_else(no_reference)? {
        Reference::Split(frac) if !req.estimator.is_fixed_order() => {
            check_infgram_settings(req)?;
            let (train, val) = split_bytes(&doc.text, *frac)?;
            let smoothed = req.estimator == EstimatorSpec::Smoothed;
            let mut discounts = given_discounts(req)?;
            if smoothed && discounts.is_none() {
                discounts = Some(fit_on_train(&train, ByteTokenizer.spec(), req.context)?);
            }
            let index = Index::from_docs(ByteTokenizer.spec(), &[train], 1, true)?;
            let report = infgram_ppl(&index, &val, req, discounts)?;
            Ok(ScoreReport::Infgram {
                report,
                discounts: discounts.filter(|_| smoothed),
            })
        }
        Reference::Split(_) => Err(Error::Field {
            field: "split",
            message: "applies to the ∞-gram estimators only: a fixed-order model needs an \
                      index or corpus files"
                .into(),
        }),
        reference => {
            let (index, tok) = open_reference(reference)?;
            score_over(&index, tok.as_ref(), req)
        }
    }
}

/// Scores the request's one text with the ∞-gram or the fixed-order model of `corpus` (an
/// index open in this process, or shards held elsewhere), tokenized by `tok` (the request's
/// reference and model are not read): what [`score`] does once it has opened the index. Over
/// shards held elsewhere every estimator scores as over an index of the same documents; a
/// fixed-order model's counting pass asks each shard for all its suffixes.
pub fn score_over(
    corpus: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    req: &ScoreRequest,
) -> Result<ScoreReport> {
    let doc = one_text(req)?;
    if req.estimator.is_fixed_order() {
        return score_classic(corpus, tok, req, &doc.text);
    }
    check_infgram_settings(req)?;
    let discounts = given_discounts(req)?;
    let tokens = tok.encode(&doc.text)?;
    let report = infgram_ppl(corpus, &tokens, req, discounts)?;
    Ok(ScoreReport::Infgram {
        report,
        discounts: discounts.filter(|_| req.estimator == EstimatorSpec::Smoothed),
    })
}

/// The request's one text (the ∞-gram and the fixed-order models score one).
fn one_text(req: &ScoreRequest) -> Result<&Document> {
    match req.texts.as_slice() {
        [doc] => Ok(doc),
        [] => Err(Error::input("no text to score")),
        _ => Err(Error::input(
            "the ∞-gram and the fixed-order models score one text; several are scored each \
             on its own with a neural model only",
        )),
    }
}

/// Refuses the settings of the fixed-order models and the smoothed estimator where the
/// request's ∞-gram estimator is another.
fn check_infgram_settings(req: &ScoreRequest) -> Result<()> {
    if req.sentences {
        return Err(Error::Field {
            field: "sentences",
            message: "scores with a fixed-order model: choose the estimator mkn or add-alpha"
                .into(),
        });
    }
    if req.discount_fallback.is_some() {
        return Err(not_for_estimator("discount_fallback", "mkn"));
    }
    if req.discounts.is_some() && req.estimator != EstimatorSpec::Smoothed {
        return Err(not_for_estimator("discounts", "smoothed"));
    }
    Ok(())
}

/// The smoothed estimator's discounts the request gives, checked.
fn given_discounts(req: &ScoreRequest) -> Result<Option<Discounts>> {
    req.discounts
        .as_deref()
        .map(Discounts::from_values)
        .transpose()
}

/// The ∞-gram's perplexity of `tokens` over `corpus` with the request's estimator (the smoothed
/// one with `discounts` when given).
fn infgram_ppl(
    corpus: &(impl Shards + ?Sized),
    tokens: &[u32],
    req: &ScoreRequest,
    discounts: Option<Discounts>,
) -> Result<PplReport> {
    let est = match req.estimator.estimator()? {
        Estimator::Smoothed(d) => Estimator::Smoothed(discounts.unwrap_or(d)),
        other => other,
    };
    crate::eval::perplexity(corpus, tokens, &est, req.context, req.floor)
}

/// The byte tokens of `text` cut at the fraction `frac` (on a character boundary): (train,
/// scored).
fn split_bytes(text: &str, frac: f64) -> Result<(Vec<u32>, Vec<u32>)> {
    if !(frac > 0.0 && frac < 1.0) {
        return Err(Error::Field {
            field: "split",
            message: format!("must be a fraction between 0 and 1 (not {frac})"),
        });
    }
    let cut = (text.len() as f64 * frac) as usize;
    let cut = (0..=cut)
        .rev()
        .find(|&c| text.is_char_boundary(c))
        .unwrap_or(0);
    Ok((
        ByteTokenizer.encode(&text[..cut])?,
        ByteTokenizer.encode(&text[cut..])?,
    ))
}

/// `e`, said of the text `name`.
#[cfg(feature = "neural")]
fn in_document(name: &str, e: Error) -> Error {
    match e {
        Error::Model(m) => Error::Model(format!("{name}: {m}")),
        other => Error::input(format!("{name}: {other}")),
    }
}

/// The error of a request that names nothing to count in.
fn no_reference() -> Error {
    Error::input("nothing to score with: name an index, corpus files, or a split fraction")
}

/// The error of `field` given for another estimator than `applies`.
fn not_for_estimator(field: &'static str, applies: &str) -> Error {
    Error::Field {
        field,
        message: format!("applies to the estimator {applies} only: leave it out"),
    }
}

/// The index and tokenizer of an index or corpus reference.
fn open_reference(reference: &Reference) -> Result<(Index<memmap2::Mmap>, Box<dyn Tokenizer>)> {
    match reference {
        Reference::Index(dir) => super::open_index(dir, None),
        Reference::Corpus(files) => super::open_cached_byte_index(files),
        Reference::Split(_) => Err(Error::input("a split is indexed, not opened")),
    }
}

/// The fallback discounts of a request's `discount_fallback` (KenLM's defaults when it has no
/// values).
pub fn fallback_discounts(given: Option<&[f64]>) -> Result<Option<[f64; 3]>> {
    Ok(match given {
        None => None,
        Some([]) => Some(KENLM_FALLBACK),
        Some(&[a, b, c]) => Some([a, b, c]),
        Some(_) => {
            return Err(Error::Field {
                field: "discount_fallback",
                message: "takes no values or three: D1,D2,D3+".into(),
            })
        }
    })
}

/// The fixed-order model `spec` names, estimated over `index`; `sentences` must match how the
/// index was built.
pub fn classic_model(
    spec: &EstimatorSpec,
    index: &(impl Shards + ?Sized),
    sentences: bool,
    fallback: Option<&[f64]>,
) -> Result<ClassicModel> {
    if sentences != is_sentence_index(index)? {
        return Err(Error::Field {
            field: "sentences",
            message: if sentences {
                "needs an index built in sentence mode: `infgram index --tokenizer words \
                 --sentences`"
                    .into()
            } else {
                "is needed: this index was built in sentence mode".into()
            },
        });
    }
    spec.classic(index, fallback_discounts(fallback)?)?
        .ok_or_else(|| Error::input("the estimator is not a fixed-order model"))
}

/// The score of `text` under the fixed-order `model` of `index` (`tok` its tokenizer), as
/// KenLM's `query` gives it: in sentence mode (an index built so) each line is a sentence.
pub fn classic_report(
    index: &(impl Shards + ?Sized),
    model: &ClassicModel,
    tok: &dyn Tokenizer,
    text: &str,
    floor: Option<f64>,
) -> Result<ClassicReport> {
    let seqs = crate::eval::classic::scored_sequences(tok, text, model.bos().is_some())?;
    crate::eval::classic::score(index, model, &seqs, floor)
}

/// Writes the modified Kneser–Ney `model` of `index` in ARPA format to `path` (a regular file
/// beside and renamed into place, or a stream: standard output, a FIFO).
pub fn write_arpa_file(
    index: &(impl Shards + ?Sized),
    model: &ClassicModel,
    tok: &dyn Tokenizer,
    path: &std::path::Path,
) -> Result<ArpaSummary> {
    use crate::output_file::{write_file, Accept};
    write_file(path, Accept::Streams, |out| {
        // The writer's I/O errors name the file written (a FIFO whose reader left, a full
        // disk), not the ARPA stream in general.
        crate::ngram::arpa::write_arpa(model, index, tok, out).map_err(|e| match e {
            crate::error::Error::Io { source, .. } => crate::error::Error::io(path, source),
            e => e,
        })
    })
}

/// The modified Kneser–Ney model of `order` over `index`, in sentence mode when the index was
/// built so (what `export-arpa` writes).
pub fn mkn_model(
    index: &(impl Shards + ?Sized),
    order: usize,
    fallback: Option<&[f64]>,
) -> Result<ClassicModel> {
    let sentences = is_sentence_index(index)?;
    classic_model(&EstimatorSpec::Mkn { order }, index, sentences, fallback)
}

/// A fixed-order model's score of `text` over `index`.
fn score_classic(
    index: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    req: &ScoreRequest,
    text: &str,
) -> Result<ScoreReport> {
    if req.discounts.is_some() {
        return Err(not_for_estimator("discounts", "smoothed"));
    }
    if req.discount_fallback.is_some() && !matches!(req.estimator, EstimatorSpec::Mkn { .. }) {
        return Err(not_for_estimator("discount_fallback", "mkn"));
    }
    let t0 = std::time::Instant::now();
    let model = classic_model(
        &req.estimator,
        index,
        req.sentences,
        req.discount_fallback.as_deref(),
    )?;
    let estimate_seconds = t0.elapsed().as_secs_f64();
    let report = classic_report(index, &model, tok, text, req.floor)?;
    Ok(ScoreReport::Classic(ClassicScore {
        report,
        order: model.order(),
        discounts: model.discounts().to_vec(),
        estimate_seconds,
        ngrams: model.stats().ngrams.clone(),
    }))
}

/// A neural model's score, or with an index the mixture's.
#[cfg(not(feature = "neural"))]
fn score_with_model(_: &ScoreRequest, m: &ModelScoring) -> Result<ScoreReport> {
    Err(Error::input(format!(
        "{}: this infgram was built without the `neural` feature: neural models are not \
         available (build with default features)",
        m.model
    )))
}

/// A neural model's score, or with an index the mixture's.
#[cfg(feature = "neural")]
fn score_with_model(req: &ScoreRequest, m: &ModelScoring) -> Result<ScoreReport> {
    if req.estimator != EstimatorSpec::default()
        || req.discounts.is_some()
        || req.discount_fallback.is_some()
    {
        return Err(Error::input(
            "a neural model's scoring takes no estimator settings (a mixture's ∞-gram is the \
             mixer file's)",
        ));
    }
    if req.sentences {
        return Err(Error::Field {
            field: "sentences",
            message: "does not apply to a neural model".into(),
        });
    }
    let reference = match &req.reference {
        None => None,
        Some(Reference::Index(dir)) => Some(dir),
        Some(_) => {
            return Err(Error::input(
                "a neural model mixes with an index only (not corpus files or a split)",
            ))
        }
    };
    if reference.is_none() && (m.mix.is_some() || !m.compare.is_empty() || m.max_overlap.is_some())
    {
        return Err(Error::input(
            "mixers and the overlap limit apply to a model with an index: name the index",
        ));
    }
    let super::models::LoadedModel {
        model: mut llm,
        tokenizer: tok,
        ..
    } = super::models::load_model(&m.model, &m.options)?;
    // Each text on its own: its tokens (the first `limit`), after the model's first token
    // when it asks for one (Gemma's <bos>, never scored itself).
    let mut documents = Vec::new();
    for doc in &req.texts {
        let mut ids = tok.encode(&doc.text)?;
        if m.limit > 0 {
            ids.truncate(m.limit);
        }
        if let Some(bos) = llm.bos_token() {
            ids.insert(0, bos);
        }
        documents.push((doc.name.as_str(), ids));
    }
    match reference {
        Some(dir) => score_mixture(llm.as_mut(), &tok, dir, &documents, m),
        None => score_model_alone(llm.as_mut(), &tok, &documents, m),
    }
}

/// The mixture of `llm` and the ∞-gram of the index `dir`, each document on its own.
#[cfg(feature = "neural")]
fn score_mixture(
    llm: &mut dyn crate::lm::LanguageModel,
    tok: &dyn Tokenizer,
    dir: &std::path::Path,
    documents: &[(&str, Vec<u32>)],
    m: &ModelScoring,
) -> Result<ScoreReport> {
    use crate::mix::{load_mixer, open_mixing_index, score_both, Scoring};
    let mixer = load_mixer(m.mix.as_deref())?;
    let mut others = Vec::new();
    for path in &m.compare {
        let other = load_mixer(path.as_deref())?;
        let name = path
            .as_ref()
            .map_or("default".to_string(), |p| p.display().to_string());
        if other.estimator != mixer.estimator {
            return Err(Error::input(format!(
                "{name} mixes in the estimator {} but the mixer mixes in {}: compare mixers of \
                 the same ∞-gram distribution (`infgram mix fit` with the same --estimator)",
                serde_json::to_string(&other.estimator).unwrap_or_default(),
                serde_json::to_string(&mixer.estimator).unwrap_or_default()
            )));
        }
        others.push((name, other));
    }
    let index = open_mixing_index(dir, tok)?;
    let mut parts = Vec::new();
    for (name, ids) in documents {
        let part = score_both(
            llm,
            &index,
            ids,
            &mixer.estimator,
            (m.window, m.stride),
            m.infgram_ppl,
        )
        .map_err(|e| in_document(name, e))?;
        parts.push(part.named(name));
    }
    let mut scoring = Scoring::join(parts);
    if let Some(max) = m.max_overlap {
        scoring = scoring.leave_out_above(max);
    }
    let compared = others
        .iter()
        .map(|(name, other)| (name.clone(), scoring.report(other)))
        .collect();
    Ok(ScoreReport::Mixture {
        main: scoring.report(&mixer),
        compared,
    })
}

/// The neural model's perplexity over every document's windows, pooled.
#[cfg(feature = "neural")]
fn score_model_alone(
    llm: &mut dyn crate::lm::LanguageModel,
    tok: &dyn Tokenizer,
    documents: &[(&str, Vec<u32>)],
    m: &ModelScoring,
) -> Result<ScoreReport> {
    let t0 = std::time::Instant::now();
    let (mut total_nll, mut scored, mut bytes) = (0.0, 0, 0);
    for (name, ids) in documents {
        let (nll, n) = crate::eval::windowed_perplexity(llm, ids, m.window, m.stride)
            .map_err(|e| in_document(name, e))?;
        total_nll += nll * n as f64;
        scored += n;
        bytes += tok.decode_bytes(&ids[1.min(ids.len())..])?.len();
    }
    let nll = total_nll / scored.max(1) as f64;
    let ppl = nll.exp();
    Ok(ScoreReport::Model(ModelPpl {
        ppl,
        tokens: scored,
        bits_per_token: ppl.log2(),
        bits_per_byte: total_nll / bytes.max(1) as f64 / std::f64::consts::LN_2,
        seconds: t0.elapsed().as_secs_f64(),
        window: m.window,
        stride: m.stride,
    }))
}

/// A fit of a mixer (`infgram mix fit`): λ for the mixture of `model` and the ∞-gram of
/// `index`, on held-out `texts` (each scored on its own, never a text that will be scored).
#[derive(Clone, Debug)]
pub struct FitRequest {
    /// The model and how it runs; its window and stride are the passes' (its other settings
    /// are not read).
    pub model: ModelScoring,
    /// An index built with the model's tokenizer.
    pub index: PathBuf,
    /// The held-out texts.
    pub texts: Vec<Document>,
    /// The ∞-gram distribution mixed in.
    pub estimator: EstimatorSpec,
    /// The infini-gram paper's two weights (sparse / not) instead of a table by suffix length.
    pub two_weights: bool,
    /// Also fit a λ model over both models' views of each position, which replaces the table.
    pub features: bool,
}

/// What a fit gives: the mixer, its mixture on the fitting positions, and (for a λ model) the
/// perplexity its table alone gives there.
#[derive(Clone, Debug)]
pub struct Fitted {
    /// The mixer fitted.
    pub mixer: Mixer,
    /// Its mixture on the positions it was fitted on.
    pub report: ScoredMixture,
    /// With a λ model: the perplexity of its table alone on the same positions.
    pub table_ppl: Option<f64>,
}

/// Fits a mixer (see [`FitRequest`]).
#[cfg(feature = "neural")]
pub fn fit_mixer(req: &FitRequest) -> Result<Fitted> {
    use crate::mix::{open_mixing_index, score_both, Scoring, TABLE_EDGES};
    if req.texts.is_empty() {
        return Err(Error::input("no text to fit on"));
    }
    let m = &req.model;
    let loaded = super::models::load_model(&m.model, &m.options)?;
    let index = open_mixing_index(&req.index, &loaded.tokenizer)?;
    let mut model = loaded.model;
    let mut parts = Vec::new();
    for doc in &req.texts {
        let tokens = loaded.tokenizer.encode(&doc.text)?;
        let part = score_both(
            model.as_mut(),
            &index,
            &tokens,
            &req.estimator,
            (m.window, m.stride),
            false,
        )
        .map_err(|e| in_document(&doc.name, e))?;
        parts.push(part.named(&doc.name));
    }
    let scoring = Scoring::join(parts);
    let edges: &[usize] = if req.two_weights { &[] } else { &TABLE_EDGES };
    let mixer = if req.features {
        scoring.fit_features(req.estimator.clone(), edges)
    } else {
        scoring.fit(req.estimator.clone(), edges)
    };
    let report = scoring.report(&mixer);
    let table_ppl = mixer.reads_neural().then(|| {
        let table = Mixer {
            features: None,
            ..mixer.clone()
        };
        scoring.report(&table).report.ppl
    });
    Ok(Fitted {
        mixer,
        report,
        table_ppl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "the cat sat on the mat. the cat ate the rat. a cat sat on a hat. \
                        the dog sat on the log. the cat sat on the mat again.";

    fn request(estimator: EstimatorSpec, reference: Reference) -> ScoreRequest {
        let mut req = ScoreRequest::new(vec![Document {
            name: "t".into(),
            text: TEXT.into(),
        }]);
        req.estimator = estimator;
        req.reference = Some(reference);
        req.context = 20;
        req.floor = Some(1e-6);
        req
    }

    fn ppl(report: ScoreReport) -> (f64, u64, Option<Discounts>) {
        match report {
            ScoreReport::Infgram { report, discounts } => (report.ppl, report.tokens, discounts),
            other => panic!("not an ∞-gram report: {other:?}"),
        }
    }

    /// A split scores the rest of the text over an index of its first part: what scoring that
    /// rest over that index, open already, gives; the smoothed estimator fits its discounts on
    /// the first part and reports them.
    #[test]
    fn a_split_is_the_rest_scored_over_the_first_part() {
        for est in [EstimatorSpec::default(), EstimatorSpec::Smoothed] {
            let req = request(est.clone(), Reference::Split(0.7));
            let (split_ppl, split_tokens, discounts) = ppl(score(&req).unwrap());
            let (train, _) = split_bytes(TEXT, 0.7).unwrap();
            let index =
                Index::from_docs(ByteTokenizer.spec(), std::slice::from_ref(&train), 1, true)
                    .unwrap();
            let cut = train.len();
            let mut rest = request(est.clone(), Reference::Split(0.7));
            rest.texts[0].text = TEXT[cut..].into();
            if est == EstimatorSpec::Smoothed {
                let fitted = fit_on_train(&train, ByteTokenizer.spec(), 20).unwrap();
                assert_eq!(discounts.unwrap().0, fitted.0);
                rest.discounts = Some(fitted.0.iter().flatten().copied().collect());
            } else {
                assert!(discounts.is_none());
            }
            let (over_ppl, over_tokens, _) =
                ppl(score_over(&index, &ByteTokenizer, &rest).unwrap());
            assert_eq!((split_ppl, split_tokens), (over_ppl, over_tokens));
        }
    }

    /// Bad settings are field errors naming the request's field, before any work.
    #[test]
    fn bad_settings_name_their_field() {
        let field = |req: &ScoreRequest| match score(req) {
            Err(Error::Field { field, .. }) => field,
            other => panic!("not a field error: {other:?}"),
        };
        assert_eq!(
            field(&request(EstimatorSpec::default(), Reference::Split(1.5))),
            "split"
        );
        assert_eq!(
            field(&request(EstimatorSpec::default(), Reference::Split(0.0))),
            "split"
        );
        let mut req = request(EstimatorSpec::default(), Reference::Split(0.5));
        req.discounts = Some(vec![0.5, 0.7, 0.9]);
        assert_eq!(field(&req), "discounts");
        req.discounts = None;
        req.discount_fallback = Some(vec![]);
        assert_eq!(field(&req), "discount_fallback");
        req.discount_fallback = None;
        req.sentences = true;
        assert_eq!(field(&req), "sentences");
        let mkn = request(EstimatorSpec::Mkn { order: 2 }, Reference::Split(0.5));
        assert_eq!(field(&mkn), "split");
        let mut smoothed = request(EstimatorSpec::Smoothed, Reference::Split(0.5));
        smoothed.discounts = Some(vec![0.5, 0.7]);
        assert_eq!(field(&smoothed), "discounts");
        let mut zero = request(EstimatorSpec::default(), Reference::Split(0.5));
        zero.context = 0;
        assert_eq!(field(&zero), "context");
        assert_eq!(
            fallback_discounts(Some(&[1.0])).unwrap_err().to_string(),
            "discount_fallback takes no values or three: D1,D2,D3+"
        );
    }

    /// A request without a text, with two texts, or with nothing to count in is refused.
    #[test]
    fn a_request_needs_one_text_and_a_reference() {
        let mut req = request(EstimatorSpec::default(), Reference::Split(0.5));
        req.texts.push(req.texts[0].clone());
        assert!(matches!(score(&req), Err(Error::Input(_))));
        req.texts.clear();
        assert!(matches!(score(&req), Err(Error::Input(_))));
        let mut none = request(EstimatorSpec::default(), Reference::Split(0.5));
        none.reference = None;
        assert!(matches!(score(&none), Err(Error::Input(_))));
    }

    /// A fixed-order model over an open index reports its own figures.
    #[test]
    fn a_fixed_order_model_reports_its_order_and_counts() {
        let tokens = ByteTokenizer.encode(TEXT).unwrap();
        let index = Index::from_docs(ByteTokenizer.spec(), &[tokens], 1, true).unwrap();
        let mut req = request(EstimatorSpec::Mkn { order: 3 }, Reference::Split(0.5));
        req.discount_fallback = Some(vec![]);
        let ScoreReport::Classic(c) = score_over(&index, &ByteTokenizer, &req).unwrap() else {
            panic!("not a fixed-order report");
        };
        assert_eq!(c.order, 3);
        assert_eq!(c.ngrams.len(), 3);
        assert_eq!(c.report.tokens as usize, TEXT.len() - 1);
        assert!(c.report.ppl.is_finite() && c.report.ppl > 1.0);
    }
}
