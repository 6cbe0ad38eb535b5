//! The generation request every front end sends: one serde type, one set of defaults, one
//! place where its fields are checked.
//!
//! The CLI (`infgram gen`), the HTTP server (`POST /v1/completions`) and Python
//! (`Index.generate`) each parse their own syntax into a [`GenerateRequest`] and call
//! [`GenerateRequest::check`]; none of them holds a default or a range of its own. A field
//! that is out of range comes back as [`Error::Field`] naming the request's field
//! (`sampling.temperature`); each front end says it in its own words with
//! [`Error::rename_field`] (`--temperature` on the command line, `"temperature"` over HTTP).

use crate::decode::SamplerConfig;
use crate::error::{Error, Result};
use crate::ngram::Estimator;
use serde::{Deserialize, Serialize};

/// The defaults of every front end.
pub mod defaults {
    use super::DrafterSpec;

    /// Sampling temperature.
    pub const TEMPERATURE: f64 = crate::decode::sampler::DEFAULT_TEMPERATURE;
    /// Nucleus mass.
    pub const TOP_P: f64 = 1.0;
    /// Tokens kept by top-k (0: all).
    pub const TOP_K: usize = 0;
    /// Repetition penalty (1: none).
    pub const REPETITION_PENALTY: f64 = 1.0;
    /// Tokens generated at most.
    pub const MAX_TOKENS: usize = 500;
    /// Tokens of context the ∞-gram looks at.
    pub const CONTEXT: usize = 200;
    /// Longest draft verified in one pass.
    pub const DRAFT_MAX: usize = crate::decode::DEFAULT_DRAFT_MAX;
    /// The drafters of speculative decoding, in the order the decode loop asks them: the
    /// prompt (free and often right), past outputs, then the corpus. Front ends that ask for
    /// "speculative" name this set, never a list of their own.
    pub const SPECULATIVE_DRAFTERS: [DrafterSpec; 3] = [
        DrafterSpec::PromptLookup,
        DrafterSpec::PastOutputs,
        DrafterSpec::Corpus,
    ];
    /// SBIS levels (−1: all).
    pub const SBIS_K: i64 = crate::ngram::SBIS_K;
    /// SBIS weight ratio between consecutive levels.
    pub const SBIS_DECAY: f64 = crate::ngram::SBIS_DECAY;
}

/// The largest temperature taken (past it, sampling is uniform to many digits).
pub const MAX_TEMPERATURE: f64 = 100.0;

/// Tokens one generation may write at most: the output (and the context the decode loop
/// keeps) is held in memory, 8 bytes a token, so a runaway count is refused rather than
/// filling memory. A server lowers it with its own limit.
pub const MAX_GEN_TOKENS: usize = 100_000_000;

/// The prompt: text, tokenized with the generator's tokenizer (its control tokens' strings
/// are control tokens: the author writes the turns), token ids, or a conversation through the
/// model's chat template (its messages' texts stay text: [`crate::tokenizer::chat`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// A conversation, with the assistant's turn opened after it.
    Chat {
        /// The messages.
        messages: Vec<crate::tokenizer::chat::Message>,
        /// Whether control tokens' strings in the messages' texts are control tokens (off:
        /// they are text, so a message cannot open a turn of its own).
        #[serde(default)]
        parse_special: bool,
    },
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Text(String::new())
    }
}

pub use crate::ngram::EstimatorSpec;

/// What scores the next token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Scorer {
    /// The ∞-gram of the index alone.
    Infgram {
        /// Its estimator.
        #[serde(default)]
        estimator: EstimatorSpec,
    },
    /// The neural model.
    Model,
    /// The mixture of the model and the ∞-gram of the index (λ from the built-in mixer).
    Mixture,
}

impl Default for Scorer {
    fn default() -> Self {
        Scorer::Infgram {
            estimator: EstimatorSpec::default(),
        }
    }
}

/// Who drafts tokens for the model to verify (speculative decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrafterSpec {
    /// Prompt lookup: the prompt and the output so far.
    PromptLookup,
    /// The ∞-gram of the index.
    Corpus,
    /// The outputs of past generations (the server's, or `gen --past-outputs FILE`).
    PastOutputs,
}

/// How the corpus drafter picks each draft token from the ∞-gram of its index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum CorpusRule {
    /// The argmax of SBIS over every level (decay 0.1): the counts of shorter suffixes pooled
    /// in. The default (on Shakespeare it drafts the model's token more often).
    #[default]
    Sbis,
    /// The most frequent continuation of the longest suffix that occurs (the ∞-gram's own):
    /// cheaper, and better on a large corpus, where SBIS is decided by the short suffixes.
    LongestSuffix,
}

impl CorpusRule {
    /// The drafter's rule.
    pub fn drafter_rule(self) -> crate::decode::drafters::CorpusRule {
        use crate::decode::drafters::CorpusRule as Rule;
        match self {
            CorpusRule::Sbis => Rule::default(),
            CorpusRule::LongestSuffix => Rule::MostFrequent,
        }
    }
}

/// The copy guard: the output never repeats more than `max_span` tokens of the corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardSpec {
    /// The longest span of the corpus the output may repeat (at least 1).
    pub max_span: usize,
    /// Count only generated tokens (the prompt's tail does not count).
    #[serde(default)]
    pub ignore_prompt: bool,
}

/// How the next token is drawn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// Temperature, 0 (greedy) to [`MAX_TEMPERATURE`].
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass, in (0, 1].
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Keep the k most likely tokens (0: all).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Random seed: the same seed, the same text.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Repetition penalty over the last 64 tokens (1: none; above 0).
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
}

/// How long a generation may run and what it looks at.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenLimits {
    /// Tokens to generate at most (at least 1).
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// Tokens of context the ∞-gram looks at (at least 1).
    #[serde(default)]
    pub context: Option<usize>,
    /// Longest draft verified in one pass (at least 1).
    #[serde(default)]
    pub draft_max: Option<usize>,
}

/// A generation, as every front end asks for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    /// The prompt.
    #[serde(default)]
    pub prompt: Prompt,
    /// What scores the next token.
    #[serde(default)]
    pub scorer: Scorer,
    /// Who drafts (none: plain decoding; only with a model).
    #[serde(default)]
    pub drafters: Vec<DrafterSpec>,
    /// How the corpus drafter drafts (default: SBIS).
    #[serde(default)]
    pub corpus_rule: CorpusRule,
    /// The copy guard.
    #[serde(default)]
    pub guard: Option<GuardSpec>,
    /// Sampling.
    #[serde(default)]
    pub sampling: Sampling,
    /// Limits.
    #[serde(default)]
    pub limits: GenLimits,
}

/// A request after [`GenerateRequest::check`]: every default filled in, every field in range.
#[derive(Clone, Debug)]
pub struct CheckedRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// The ∞-gram estimator (of the index-alone scorer).
    pub estimator: Estimator,
    /// Whether the model scores (alone or mixed).
    pub uses_model: bool,
    /// Whether the model is mixed with the ∞-gram.
    pub mix: bool,
    /// The drafters, in order (empty: plain decoding).
    pub drafters: Vec<DrafterSpec>,
    /// How the corpus drafter drafts.
    pub corpus_rule: CorpusRule,
    /// The copy guard.
    pub guard: Option<GuardSpec>,
    /// The sampler's settings.
    pub sampler: SamplerConfig,
    /// The seed.
    pub seed: Option<u64>,
    /// Repetition penalty (1: none).
    pub repetition_penalty: f32,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Tokens of context of the ∞-gram.
    pub context: usize,
    /// Longest draft.
    pub draft_max: usize,
}

fn field(name: &'static str, message: String) -> Error {
    Error::Field {
        field: name,
        message,
    }
}

impl GenerateRequest {
    /// Fills in the defaults and checks every field; `max_tokens_limit` is the most tokens the
    /// caller lets one generation write ([`MAX_GEN_TOKENS`], or a server's lower limit).
    pub fn check(&self, max_tokens_limit: usize) -> Result<CheckedRequest> {
        if let Prompt::Chat { messages, .. } = &self.prompt {
            crate::tokenizer::chat::check_messages(messages)?;
        }
        let s = &self.sampling;
        let temperature = s.temperature.unwrap_or(defaults::TEMPERATURE);
        if !(temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&temperature)) {
            return Err(field(
                "sampling.temperature",
                format!(
                    "must be between 0 (greedy) and {MAX_TEMPERATURE}, got {}",
                    crate::error::shown(temperature)
                ),
            ));
        }
        let top_p = s.top_p.unwrap_or(defaults::TOP_P);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(field(
                "sampling.top_p",
                format!("must be in (0, 1], got {}", crate::error::shown(top_p)),
            ));
        }
        let penalty = s.repetition_penalty.unwrap_or(defaults::REPETITION_PENALTY);
        if !(penalty.is_finite() && penalty > 0.0 && penalty <= 1e6) {
            return Err(field(
                "sampling.repetition_penalty",
                format!(
                    "must be above 0 (1: none), got {}",
                    crate::error::shown(penalty)
                ),
            ));
        }
        let l = &self.limits;
        let limit = max_tokens_limit.min(MAX_GEN_TOKENS);
        let max_tokens = l.max_tokens.unwrap_or(defaults::MAX_TOKENS.min(limit));
        if max_tokens == 0 || max_tokens > limit {
            return Err(field(
                "limits.max_tokens",
                format!("must be between 1 and {limit}, got {max_tokens}"),
            ));
        }
        let context = l.context.unwrap_or(defaults::CONTEXT);
        if context == 0 {
            return Err(field("limits.context", "must be at least 1 token".into()));
        }
        let draft_max = l.draft_max.unwrap_or(defaults::DRAFT_MAX);
        if draft_max == 0 {
            return Err(field("limits.draft_max", "must be at least 1 token".into()));
        }
        if let Some(g) = &self.guard {
            if g.max_span == 0 {
                return Err(field(
                    "guard.max_span",
                    "is the longest span of the corpus the output may repeat: at least 1 \
                     (0 would forbid every token of the corpus)"
                        .into(),
                ));
            }
        }
        let (estimator, uses_model, mix) = match &self.scorer {
            Scorer::Infgram { estimator } => (estimator_of(estimator)?, false, false),
            Scorer::Model => (estimator_of(&EstimatorSpec::default())?, true, false),
            Scorer::Mixture => (estimator_of(&EstimatorSpec::default())?, true, true),
        };
        if !uses_model && !self.drafters.is_empty() {
            return Err(field(
                "drafters",
                "drafts are verified by a model: choose the model or the mixture as the scorer"
                    .into(),
            ));
        }
        // Settings that would change nothing are refused by name, not ignored.
        if !uses_model && penalty != 1.0 {
            return Err(field(
                "sampling.repetition_penalty",
                "applies to a model's generation; the ∞-gram samples without one: generate \
                 with a model, or leave it out"
                    .into(),
            ));
        }
        if self.drafters.is_empty() && l.draft_max.is_some() {
            return Err(field(
                "limits.draft_max",
                "is the longest draft of speculative decoding, and this generation drafts \
                 nothing: ask for speculative decoding, or leave it out"
                    .into(),
            ));
        }
        Ok(CheckedRequest {
            prompt: self.prompt.clone(),
            estimator,
            uses_model,
            mix,
            drafters: self.drafters.clone(),
            corpus_rule: self.corpus_rule,
            guard: self.guard,
            sampler: SamplerConfig {
                temperature,
                top_p,
                top_k: s.top_k.unwrap_or(defaults::TOP_K),
            },
            seed: s.seed,
            repetition_penalty: penalty as f32,
            max_tokens,
            context,
            draft_max,
        })
    }
}

/// The estimator a request's spec asks for; its fields named as the request names them.
fn estimator_of(spec: &EstimatorSpec) -> Result<Estimator> {
    spec.estimator().map_err(|e| {
        e.rename_field(&[
            ("estimator.k", "scorer.estimator.k"),
            ("estimator.decay", "scorer.estimator.decay"),
            ("estimator.order", "scorer.estimator.order"),
            ("estimator.alpha", "scorer.estimator.alpha"),
        ])
    })
}

impl CheckedRequest {
    /// The prompt's token ids: text tokenized with `tok`, ids checked against its vocabulary.
    pub fn prompt_ids(&self, tok: &dyn crate::tokenizer::Tokenizer) -> Result<Vec<u32>> {
        match &self.prompt {
            Prompt::Text(t) => tok.encode(t),
            Prompt::Chat {
                messages,
                parse_special,
            } => crate::tokenizer::chat::encode_chat(tok, messages, *parse_special),
            Prompt::Ids(ids) => {
                let vocab = tok.vocab_size();
                if let Some(t) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(field(
                        "prompt",
                        format!("token id {t} is not in the vocabulary (ids below {vocab})"),
                    ));
                }
                Ok(ids.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut GenerateRequest)) -> Result<CheckedRequest> {
        let mut r = GenerateRequest::default();
        f(&mut r);
        r.check(MAX_GEN_TOKENS)
    }

    fn field_of(r: Result<CheckedRequest>) -> &'static str {
        match r {
            Err(Error::Field { field, .. }) => field,
            other => panic!("not a field error: {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_in_and_ranges_name_their_field() {
        let c = with(|_| {}).unwrap();
        assert_eq!(c.sampler.temperature, defaults::TEMPERATURE);
        assert_eq!((c.max_tokens, c.context, c.draft_max), (500, 200, 16));
        assert!(!c.uses_model && c.drafters.is_empty());
        type Edit = fn(&mut GenerateRequest);
        let cases: [(Edit, &str); 10] = [
            (
                |r| r.sampling.temperature = Some(-1.0),
                "sampling.temperature",
            ),
            (
                |r| r.sampling.temperature = Some(f64::NAN),
                "sampling.temperature",
            ),
            (|r| r.sampling.top_p = Some(0.0), "sampling.top_p"),
            (
                |r| r.sampling.repetition_penalty = Some(0.0),
                "sampling.repetition_penalty",
            ),
            (|r| r.limits.max_tokens = Some(0), "limits.max_tokens"),
            (|r| r.limits.context = Some(0), "limits.context"),
            (|r| r.limits.draft_max = Some(0), "limits.draft_max"),
            (
                |r| {
                    r.guard = Some(GuardSpec {
                        max_span: 0,
                        ignore_prompt: false,
                    })
                },
                "guard.max_span",
            ),
            (
                |r| {
                    r.scorer = Scorer::Infgram {
                        estimator: EstimatorSpec::Sbis {
                            k: Some(0),
                            decay: None,
                        },
                    }
                },
                "scorer.estimator.k",
            ),
            (|r| r.drafters = vec![DrafterSpec::PromptLookup], "drafters"),
        ];
        for (f, name) in cases {
            assert_eq!(field_of(with(f)), name);
        }
        // A caller's lower limit on max_tokens, and the default under it.
        let r = GenerateRequest::default();
        assert_eq!(r.check(16).unwrap().max_tokens, 16);
        let r = GenerateRequest {
            limits: GenLimits {
                max_tokens: Some(17),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(field_of(r.check(16)), "limits.max_tokens");
    }

    #[test]
    fn the_wire_form_is_plain_json() {
        let r: GenerateRequest = serde_json::from_str(
            r#"{"prompt": [1, 2], "scorer": {"kind": "mixture"}, "drafters": ["prompt_lookup",
                "corpus"], "guard": {"max_span": 8}, "sampling": {"temperature": 0, "seed": 3},
                "limits": {"max_tokens": 12}}"#,
        )
        .unwrap();
        let c = r.check(MAX_GEN_TOKENS).unwrap();
        assert!(c.mix && c.uses_model && c.drafters.len() == 2);
        assert_eq!(
            (c.max_tokens, c.seed, c.sampler.temperature),
            (12, Some(3), 0.0)
        );
        assert!(serde_json::from_str::<GenerateRequest>(r#"{"temprature": 1}"#).is_err());
        let back: GenerateRequest =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
