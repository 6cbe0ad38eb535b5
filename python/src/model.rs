//! `Model`: a neural model run by infgram (feature `neural`), loaded once per object. Two uses:
//!
//! * `generate`: a generation through the service's one door
//!   ([`infgram::service::run::generate`]): plain, speculative (prompt lookup, past outputs,
//!   the corpus index), mixed with the ∞-gram of the index, guarded against copying, with
//!   `compare`'s plain run; it returns the report `infgram gen --json` prints and the server's
//!   completion carries (`infgram` field), as a dict.
//! * `forward_bytes` / `rollback`: the model as a `step` of `infgram.speculative.generate`
//!   (Python's `Model.step` turns the bytes into a numpy array), so the reference loop and
//!   another engine's hook run on infgram's own model.
//!
//! The model sits behind a mutex: calls from several threads run one at a time; each releases
//! the GIL while it runs. On the native CPU backend the model runs on a batcher's thread, the
//! mutex holding one sequence of it, so that the caches of ended generations are kept (a
//! prompt that starts as an earlier one reads only the rest). With `Model(..., parallel=N)`
//! (N > 1) `generate` called from several Python threads runs the generations at once on
//! sequences of their own, their new tokens sharing the model's passes, each answer the one it
//! gets alone; `step` and the other calls keep the one sequence.
use crate::index::Index;
use crate::Guarded;
use crate::{detokenize_with, runtime, to_py, tokenize_with, Ans, Idx};
use infgram::service::chat::{encode_chat, Message};
use infgram::service::Tokenizer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

use infgram::service::models::{
    load_model, Backend, Batcher, Device, LanguageModel, LoadedModel, ModelOptions, Requantize,
};
use infgram::service::request::{
    defaults, DrafterSpec, GenLimits, GenerateRequest, GuardSpec, Prompt, Sampling, Scorer,
    MAX_GEN_TOKENS,
};
use infgram::service::run::{load_mixer, mixer_file, Mixer, ModelIndex, PAST_OUTPUTS_BUDGET};
use infgram::service::{PastStore, Resources, RunOptions};
use std::sync::{Mutex, MutexGuard};

/// Python's parameter names for the request's fields (a bad value names the parameter).
const PARAMETER_NAMES: &[(&str, &str)] = &[
    ("sampling.temperature", "temperature"),
    ("sampling.top_p", "top_p"),
    ("sampling.top_k", "top_k"),
    ("sampling.repetition_penalty", "repetition_penalty"),
    ("limits.max_tokens", "max_tokens"),
    ("limits.context", "context"),
    ("limits.draft_max", "draft_max"),
    ("guard.max_span", "guard"),
    ("prompt", "prompt_ids"),
];

/// An option given as its name (`"candle"`, `"cuda"`, `"q8_0"`), read as the CLI reads it.
fn named<T: serde::de::DeserializeOwned>(what: &str, value: &str) -> PyResult<T> {
    serde_json::from_value(serde_json::Value::String(value.to_string()))
        .map_err(|_| PyValueError::new_err(format!("{what} {value:?} is not one infgram knows")))
}

/// The drafting index argument, checked against the model's tokenizer `tok`: a directory or an
/// `infgram.Index` opened here, or an `infgram.Index` over shards held elsewhere (`ask=`).
fn drafting_arg(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    tok: &dyn Tokenizer,
) -> PyResult<ModelIndex> {
    let checked = match obj.cast::<Index>() {
        Ok(index) if index.get().files.is_none() => {
            let index = index.get();
            ModelIndex::elsewhere(index.corpus.clone(), index.tok.as_ref(), tok)
        }
        _ => ModelIndex::check(index_arg(py, "index", obj)?, tok, false),
    };
    checked.map_err(|e| PyValueError::new_err(e.to_string()))
}

/// An index argument: a directory, or an `infgram.Index` opened here.
fn index_arg(py: Python<'_>, what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Arc<Idx>> {
    if let Ok(index) = obj.cast::<Index>() {
        return index.get().local(what).cloned();
    }
    let dir: PathBuf = obj.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "{what}: give an index directory or an infgram.Index"
        ))
    })?;
    py.guarded(|| infgram::service::Index::open(&dir))?
        .map(Arc::new)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A neural model with what its generations draw on (see the module docs).
#[pyclass(frozen, subclass, module = "infgram._native")]
pub struct Model {
    loaded: Mutex<LoadedModel>,
    /// The model's tokenizer (a copy of the loaded one, used without the model's lock).
    tok: Arc<dyn Tokenizer>,
    /// The file or folder it came from.
    name: String,
    /// The index it drafts from, mixes with and guards against (checked once, here).
    index: Option<ModelIndex>,
    /// The copy guard's own index (default: `index`).
    guard_index: Option<Arc<Idx>>,
    mixer: Option<Mixer>,
    past: Option<PastStore>,
    /// With `parallel` > 1: the batcher whose sequences the generations run on.
    batcher: Option<Batcher>,
}

impl Model {
    fn lock(&self) -> MutexGuard<'_, LoadedModel> {
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Model {
    /// Loads `model` (a short name such as `"smollm2-135m"`, fetched on first use; a `.gguf`
    /// file; a safetensors folder; `hf:OWNER/REPO[:FILE]`). `index`: the index it drafts from,
    /// mixes with and guards against (a directory or an `infgram.Index`, built with the model's
    /// tokenizer; an `Index(ask=...)` over shards held elsewhere drafts, mixes and guards
    /// there); `guard_index`: the guard's own; `mixer`: a `mix.json` (default: the built-in
    /// mixer); `past_outputs`: a file the outputs are kept in across runs (drafted from, added
    /// to after each generation). `threads`, `backend` (`"native"` or `"candle"`), `device`
    /// (`"cpu"` or `"cuda"`), `requantize` (`"q8_0"`, `"q4_0"`) and `tokenizer` (the model's
    /// `tokenizer.json`, in place of the one its GGUF file carries) are `infgram gen`'s options.
    /// `parallel`: with more than 1 (the native backend, on the CPU or a GPU), `generate`
    /// called from that many Python threads at once shares the model's passes (`serve
    /// --parallel`).
    #[new]
    #[pyo3(signature = (model, *, index=None, guard_index=None, mixer=None, past_outputs=None, past_outputs_budget=None, threads=0, backend=None, device="cpu", requantize=None, tokenizer=None, parallel=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &str,
        index: Option<Bound<'_, PyAny>>,
        guard_index: Option<Bound<'_, PyAny>>,
        mixer: Option<PathBuf>,
        past_outputs: Option<PathBuf>,
        past_outputs_budget: Option<usize>,
        threads: usize,
        backend: Option<&str>,
        device: &str,
        requantize: Option<&str>,
        tokenizer: Option<PathBuf>,
        parallel: usize,
    ) -> PyResult<Self> {
        let device: Device = named("device", device)?;
        let opts = ModelOptions {
            threads,
            backend: match backend {
                Some(b) => named("backend", b)?,
                None => Backend::default(),
            },
            requantize: requantize
                .map(|r| named::<Requantize>("requantize", r))
                .transpose()?,
            device,
            tokenizer,
            isa: None,
        };
        let invalid = |e: infgram::Error| PyValueError::new_err(e.to_string());
        let guard_index = guard_index
            .map(|i| index_arg(py, "guard_index", &i))
            .transpose()?;
        let mixer = mixer
            .map(|m| load_mixer(mixer_file(&m)))
            .transpose()
            .map_err(invalid)?;
        let mut loaded = py.guarded(|| load_model(model, &opts))?.map_err(invalid)?;
        // A model of several sequences runs on a batcher's thread even at one generation at a
        // time: the sequences keep what they read, so a prompt that starts as an earlier one
        // reads only the rest.
        let batched = match (parallel, loaded.model.sequences().is_some()) {
            (0 | 1, false) => None,
            _ => Some(
                py.guarded(|| loaded.batch(Default::default()))?
                    .map_err(invalid)?,
            ),
        };
        let batcher = batched.filter(|_| parallel > 1);
        let tok: Arc<dyn Tokenizer> = Arc::new(loaded.tokenizer.clone());
        // Each index is checked against the model's tokenizer once, here.
        let index = index
            .map(|i| drafting_arg(py, &i, tok.as_ref()))
            .transpose()?;
        if let Some(g) = &guard_index {
            ModelIndex::check(g.clone(), tok.as_ref(), false).map_err(invalid)?;
        }
        let budget = past_outputs_budget.unwrap_or(PAST_OUTPUTS_BUDGET);
        let past = past_outputs
            .map(|file| PastStore::load(&file, tok.as_ref(), budget))
            .transpose()
            .map_err(invalid)?;
        Ok(Model {
            name: loaded.path.display().to_string(),
            loaded: Mutex::new(loaded),
            tok,
            index,
            guard_index,
            mixer,
            past,
            batcher,
        })
    }

    /// Generates from `prompt` (text: as the user's turn of the model's chat template, after
    /// `system` if given, unless `raw` or a base model), `prompt_ids`, or `messages` (a list of
    /// `(role, content)` pairs, through the chat template). Messages' texts stay text: control
    /// tokens' strings in them are not control tokens unless `parse_special`. `speculative`: the model verifies drafts from
    /// prompt lookup, the past outputs and the index (or the `drafters` named: `"prompt_lookup"`,
    /// `"past_outputs"`, `"corpus"`; `corpus_rule`: how the index drafts, `"sbis"` or
    /// `"longest_suffix"`); `mix`: the mixture of the model and the ∞-gram of the
    /// index scores; `guard`: the longest span of the guard's index the output may repeat;
    /// `compare`: also decode without drafts and report both speeds and whether the outputs are
    /// the same. Every parameter left out takes the library's default (those of `infgram gen`
    /// and the server). Returns the report `infgram gen --json` prints, as a dict.
    #[pyo3(signature = (prompt=None, *, prompt_ids=None, messages=None, system=None, parse_special=false, max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None, repetition_penalty=None, speculative=false, drafters=None, mix=false, guard=None, guard_ignore_prompt=false, draft_max=None, draft_trees=false, corpus_rule="sbis", compare=false, raw=false))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Option<&str>,
        prompt_ids: Option<Vec<u32>>,
        messages: Option<Vec<(String, String)>>,
        system: Option<&str>,
        parse_special: bool,
        max_tokens: Option<usize>,
        temperature: Option<f64>,
        top_p: Option<f64>,
        top_k: Option<usize>,
        seed: Option<u64>,
        repetition_penalty: Option<f64>,
        speculative: bool,
        drafters: Option<Vec<String>>,
        mix: bool,
        guard: Option<usize>,
        guard_ignore_prompt: bool,
        draft_max: Option<usize>,
        draft_trees: bool,
        corpus_rule: &str,
        compare: bool,
        raw: bool,
    ) -> Ans {
        let corpus_rule = crate::drafter::corpus_rule_named(corpus_rule)?;
        let drafters = match (drafters, speculative) {
            (Some(_), true) => {
                return Err(PyValueError::new_err(
                    "give speculative=True (every drafter) or drafters=[...], not both",
                ))
            }
            (Some(names), false) => names
                .iter()
                .map(|n| named::<DrafterSpec>("drafter", n))
                .collect::<PyResult<Vec<_>>>()?,
            (None, true) => defaults::SPECULATIVE_DRAFTERS.to_vec(),
            (None, false) => Vec::new(),
        };
        let prompt = match (prompt, prompt_ids, messages) {
            (_, Some(ids), None) if prompt.is_none() => Some(Prompt::Ids(ids)),
            (None, None, Some(messages)) => {
                let mut turns = Vec::with_capacity(messages.len() + 1);
                turns.extend(system.map(|s| Message::new("system", s)));
                turns.extend(messages.iter().map(|(r, c)| Message::new(r, c)));
                Some(Prompt::Chat {
                    messages: turns,
                    parse_special,
                })
            }
            // The chat template, as `infgram gen` applies it.
            (text, None, None) => self.lock().prompt(text, system, raw, parse_special),
            _ => {
                return Err(PyValueError::new_err(
                    "give one of prompt (text), prompt_ids and messages",
                ))
            }
        };
        let request = GenerateRequest {
            prompt: prompt.unwrap_or_default(),
            scorer: if mix { Scorer::Mixture } else { Scorer::Model },
            drafters,
            corpus_rule,
            guard: guard.map(|max_span| GuardSpec {
                max_span,
                ignore_prompt: guard_ignore_prompt,
            }),
            sampling: Sampling {
                temperature,
                top_p,
                top_k,
                seed,
                repetition_penalty,
            },
            limits: GenLimits {
                max_tokens,
                context: None,
                draft_max,
            },
        };
        let invalid = |e: infgram::Error| PyValueError::new_err(e.to_string());
        let checked = request
            .check(MAX_GEN_TOKENS)
            .map_err(|e| invalid(e.rename_field(PARAMETER_NAMES)))?;
        let opts = RunOptions {
            trees: draft_trees,
            compare,
            ..Default::default()
        };
        let report = py
            .guarded(|| {
                // With a batcher, a sequence of its own (the lock only for the costs).
                let mut sequence = None;
                let mut loaded = None;
                let costs = self.lock().pass_costs();
                let model: &mut dyn LanguageModel = match &self.batcher {
                    Some(b) => sequence.insert(b.sequence()?),
                    None => loaded.insert(self.lock()).model.as_mut(),
                };
                let mut res = Resources::model(model, self.tok.as_ref(), self.name.clone())
                    .drafting_index(self.index.clone(), self.mixer.clone())
                    .guard_index(self.guard_index.clone())?
                    .past_outputs(self.past.clone())
                    .pass_costs(costs);
                infgram::service::run::generate(&checked, &mut res, &opts, |_| {})
            })?
            .map_err(|e| invalid(e.rename_field(PARAMETER_NAMES)))?;
        let value =
            serde_json::to_value(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        to_py(py, &value)
    }

    /// The prompt's token ids as `generate` feeds them: `prompt` through the chat template
    /// (unless `raw` or a base model; after `system`; the prompt's text as text unless
    /// `parse_special`), tokenized, after the model's first token if it asks for one (Gemma's
    /// `<bos>`).
    #[pyo3(signature = (prompt, raw=false, system=None, parse_special=false))]
    fn prompt_ids(
        &self,
        prompt: &str,
        raw: bool,
        system: Option<&str>,
        parse_special: bool,
    ) -> PyResult<Vec<u32>> {
        let loaded = self.lock();
        let ids = match loaded.prompt(Some(prompt), system, raw, parse_special) {
            Some(Prompt::Chat {
                messages,
                parse_special,
            }) => encode_chat(self.tok.as_ref(), &messages, parse_special)
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
            _ => tokenize_with(self.tok.as_ref(), prompt)?,
        };
        Ok(infgram::service::generate::fed_prompt(&*loaded.model, &ids).into_owned())
    }

    /// Feeds `new_ids` after the cached tokens and returns one row of logits per new token, as
    /// little-endian float32 bytes (`len(new_ids) × vocab_size`); `Model.step` makes them a
    /// numpy array.
    fn forward_bytes<'py>(
        &self,
        py: Python<'py>,
        new_ids: Vec<u32>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        if new_ids.is_empty() {
            return Err(PyValueError::new_err("forward needs at least one token"));
        }
        let rows = py.guarded(|| {
            let mut loaded = self.lock();
            let vocab = self.tok.vocab_size().max(loaded.model.vocab_size());
            if let Some(t) = new_ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(PyValueError::new_err(format!(
                    "token id {t} is not in the vocabulary (ids below {vocab})"
                )));
            }
            loaded.model.forward(&new_ids).map_err(runtime)
        })??;
        let mut bytes = Vec::with_capacity(rows.iter().map(|r| r.len() * 4).sum());
        for row in &rows {
            for x in row {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
        }
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// Keeps the first `length` tokens of the model's cache (drops the rest).
    fn rollback(&self, length: usize) -> PyResult<()> {
        let mut loaded = self.lock();
        let cached = loaded.model.cache_len();
        if length > cached {
            return Err(PyValueError::new_err(format!(
                "rollback({length}): the cache holds {cached} tokens"
            )));
        }
        loaded.model.truncate(length);
        Ok(())
    }

    /// Empties the model's cache.
    fn reset(&self) {
        self.lock().model.clear();
    }

    /// Tokens in the model's cache.
    #[getter]
    fn cache_len(&self) -> usize {
        self.lock().model.cache_len()
    }

    /// The number of logits of a row.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.lock().model.vocab_size()
    }

    /// The model's end tokens.
    #[getter]
    fn eos_ids(&self) -> Vec<u32> {
        self.lock().model.eos_tokens().to_vec()
    }

    /// The GGUF file or folder the model came from.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The fingerprint of the model's tokenizer (an index built with it has the same).
    #[getter]
    fn fingerprint(&self) -> String {
        self.tok.fingerprint()
    }

    /// Token ids of `text` with the model's tokenizer (no chat template; control tokens'
    /// strings are control tokens).
    fn tokenize(&self, text: &str) -> PyResult<Vec<u32>> {
        tokenize_with(self.tok.as_ref(), text)
    }

    /// The model's own chat template (Jinja), or None for a file without one.
    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.tok.chat_template().map(|t| t.source().to_string())
    }

    /// Text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        detokenize_with(self.tok.as_ref(), &ids)
    }

    /// The past outputs: `{outputs, tokens, budget}` (`None` without `past_outputs`).
    fn past_outputs(&self, py: Python<'_>) -> Ans {
        let Some(past) = &self.past else {
            return Ok(py.None());
        };
        let stats = past
            .outputs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .stats();
        let value =
            serde_json::to_value(stats).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        to_py(py, &value)
    }
}
