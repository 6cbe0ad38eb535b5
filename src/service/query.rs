//! The typed query protocol: one [`Query`] enum with the infini-gram Python package's parameter
//! names, read from JSON (`infgram query --batch`, and next the HTTP server and Python) or built
//! from command-line flags, and one [`execute`] that answers it with the package's field names.
//!
//! A query line looks like `{"query_type": "prob", "prompt_ids": [1, 2], "cont_id": 3}`; the
//! tokens of a query come from `input_ids` / `prompt_ids` or from `text` (tokenized with the
//! index's tokenizer), a continuation from `cont_id` or `cont_text`.

use crate::error::{Error, Result};
pub use crate::eval::attribution::{attribute, creativity, Creativity, Span};
pub use crate::index::query::TokenProb;
use crate::index::query::{CountResult, Document, FindResult, Match, NtdResult, ProbResult};
use crate::index::shards::Shards;
use crate::ngram::batch::{rows_over, Rows, RowsOptions};
use crate::ngram::EstimatorSpec;
use crate::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The tokens a query is about: ids, or text for the index's tokenizer (ids win).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Subject {
    /// Token ids (the package's name for n-gram queries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<Vec<u32>>,
    /// Token ids (the package's name for prompts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Text, tokenized with the index's tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Subject {
    /// The subject given as ids.
    pub fn ids(ids: Vec<u32>) -> Self {
        Subject {
            input_ids: Some(ids),
            ..Default::default()
        }
    }

    /// The subject given as text.
    pub fn text(text: impl Into<String>) -> Self {
        Subject {
            text: Some(text.into()),
            ..Default::default()
        }
    }

    /// The token ids (empty when nothing is given: the empty n-gram). Two ways of giving
    /// them at once are refused rather than one silently ignored.
    pub fn tokens(&self, tok: &dyn Tokenizer) -> Result<Vec<u32>> {
        let given = [
            self.input_ids.is_some(),
            self.prompt_ids.is_some(),
            self.text.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(Error::input(
                "give the query's tokens one way: \"input_ids\", \"prompt_ids\" or \"text\", \
                 not several",
            ));
        }
        if let Some(ids) = self.input_ids.as_ref().or(self.prompt_ids.as_ref()) {
            return Ok(ids.clone());
        }
        match &self.text {
            Some(t) => tok.encode(t),
            None => Ok(Vec::new()),
        }
    }
}

/// The one token after a prompt: an id, or text that must be exactly one token.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Continuation {
    /// The continuation's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cont_id: Option<u32>,
    /// The continuation as text (one token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cont_text: Option<String>,
}

impl Continuation {
    /// The continuation's id.
    pub fn token(&self, tok: &dyn Tokenizer) -> Result<u32> {
        if self.cont_id.is_some() && self.cont_text.is_some() {
            return Err(Error::input(
                "give the continuation one way: \"cont_id\" or \"cont_text\", not both",
            ));
        }
        if let Some(c) = self.cont_id {
            return Ok(c);
        }
        let Some(t) = &self.cont_text else {
            return Err(Error::Field {
                field: "cont_id",
                message: "is needed by this query: a token id (or cont_text: one token as text)"
                    .into(),
            });
        };
        match tok.encode(t)?.as_slice() {
            [one] => Ok(*one),
            ids => Err(Error::Field {
                field: "cont_text",
                message: format!("{t:?} is {} tokens; it must be exactly one", ids.len()),
            }),
        }
    }
}

/// The one set of defaults of a query's optional parameters: the CLI, the HTTP API, a
/// `--batch` line and Python all fall back on these (the infini-gram API's values).
pub mod defaults {
    /// `search_docs`: documents returned.
    pub const MAXNUM: usize = 1;
    /// Tokens of a document window shown (`search_docs`, `get_doc_by_*`).
    pub const MAX_DISP_LEN: usize = 1000;
    /// CNF queries: largest distance in tokens between clauses.
    pub const MAX_DIFF_TOKENS: usize = 100;
    /// CNF queries: occurrences per n-gram above which a clause is sampled.
    pub const MAX_CLAUSE_FREQ: usize = 50_000;
    /// `attribute`: shortest span reported.
    pub const MIN_LEN: usize = 8;
    /// `attribute`: documents per span.
    pub const DOCS_PER_SPAN: usize = 3;
    /// `attribute`: tokens of each document window.
    pub const SPAN_DISP_LEN: usize = 100;
    /// `creativity`: shortest span length scored.
    pub const MIN_N: usize = 5;
    /// `creativity`: longest span length scored.
    pub const MAX_N: usize = 12;

    pub(super) fn rows_window() -> usize {
        crate::ngram::batch::ROWS_WINDOW
    }
    pub(super) fn maxnum() -> usize {
        MAXNUM
    }
    pub(super) fn max_disp_len() -> usize {
        MAX_DISP_LEN
    }
    pub(super) fn max_diff_tokens() -> usize {
        MAX_DIFF_TOKENS
    }
    pub(super) fn max_clause_freq() -> usize {
        MAX_CLAUSE_FREQ
    }
    pub(super) fn min_len() -> usize {
        MIN_LEN
    }
    pub(super) fn docs_per_span() -> usize {
        DOCS_PER_SPAN
    }
    pub(super) fn span_disp_len() -> usize {
        SPAN_DISP_LEN
    }
    pub(super) fn min_n() -> usize {
        MIN_N
    }
    pub(super) fn max_n() -> usize {
        MAX_N
    }
}

/// One query of the infini-gram protocol.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "query_type", rename_all = "snake_case")]
pub enum Query {
    /// Occurrences of an n-gram, or of a CNF of n-grams (AND of ORs: occurrences of the
    /// rarest clause with every other clause within `max_diff_tokens`, as `search_docs`).
    Count {
        #[serde(flatten)]
        subject: Subject,
        /// Clauses, each a list of n-grams (lists of ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cnf: Option<Vec<Vec<Vec<u32>>>>,
        /// With `cnf`: largest distance in tokens between clauses.
        #[serde(default = "defaults::max_diff_tokens")]
        max_diff_tokens: usize,
        /// With `cnf`: occurrences per n-gram above which a clause is sampled (approx).
        #[serde(default = "defaults::max_clause_freq")]
        max_clause_freq: usize,
    },
    /// n-gram probability of a continuation (no backoff).
    Prob {
        #[serde(flatten)]
        subject: Subject,
        #[serde(flatten)]
        cont: Continuation,
    },
    /// n-gram next-token distribution.
    Ntd {
        #[serde(flatten)]
        subject: Subject,
        /// The id that documents' ends are reported under (infini-gram's `eos_token_id`);
        /// without it they are counted in `prompt_cnt` but not listed.
        #[serde(default)]
        eos_token_id: Option<u32>,
    },
    /// ∞-gram probability: `prob` on the longest suffix of the prompt that occurs.
    InfgramProb {
        #[serde(flatten)]
        subject: Subject,
        #[serde(flatten)]
        cont: Continuation,
    },
    /// ∞-gram next-token distribution.
    InfgramNtd {
        #[serde(flatten)]
        subject: Subject,
        /// The id that documents' ends are reported under (infini-gram's `eos_token_id`);
        /// without it they are counted in `prompt_cnt` but not listed.
        #[serde(default)]
        eos_token_id: Option<u32>,
    },
    /// Every position's ∞-gram next-token distribution of the subject in one query: row `j`
    /// is the distribution after its first `j + 1` tokens (`ngram::batch`), with the suffix
    /// length, count and distinct continuations it comes from.
    InfgramRows {
        #[serde(flatten)]
        subject: Subject,
        /// The id that documents' ends are reported under (a neural model's end token), and
        /// read back from in the subject; without it, the index's separator id.
        #[serde(default)]
        eos_token_id: Option<u32>,
        /// Context tokens a row looks at.
        #[serde(default = "defaults::rows_window")]
        window: usize,
        /// The ids a row may hold (a neural model's vocabulary size).
        #[serde(default)]
        vocab: Option<usize>,
        /// The estimator: `{"name": "infgram"}` (default) or `{"name": "sbis", "k": 2}`.
        #[serde(default)]
        estimator: Option<EstimatorSpec>,
    },
    /// Suffix-array ranges of an n-gram in every shard.
    Find {
        #[serde(flatten)]
        subject: Subject,
    },
    /// Documents matching a CNF of n-grams (AND of ORs); the subject alone when no CNF.
    SearchDocs {
        #[serde(flatten)]
        subject: Subject,
        /// Clauses, each a list of n-grams (lists of ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cnf: Option<Vec<Vec<Vec<u32>>>>,
        /// Documents to return.
        #[serde(default = "defaults::maxnum")]
        maxnum: usize,
        /// Largest distance in tokens between clauses.
        #[serde(default = "defaults::max_diff_tokens")]
        max_diff_tokens: usize,
        /// Occurrences per n-gram above which a clause is sampled (approx).
        #[serde(default = "defaults::max_clause_freq")]
        max_clause_freq: usize,
        /// Tokens of a document window to show.
        #[serde(default = "defaults::max_disp_len")]
        max_disp_len: usize,
    },
    /// For each position, the longest span ending there that occurs in the corpus.
    LongestMatch {
        #[serde(flatten)]
        subject: Subject,
    },
    /// The maximal spans of the text that occur in the corpus, with counts and documents.
    Attribute {
        #[serde(flatten)]
        subject: Subject,
        /// Shortest span reported, in tokens.
        #[serde(default = "defaults::min_len")]
        min_len: usize,
        /// Documents per span.
        #[serde(default = "defaults::docs_per_span")]
        maxnum: usize,
        /// Tokens of a document window to show.
        #[serde(default = "defaults::span_disp_len")]
        max_disp_len: usize,
    },
    /// L-uniqueness for `n = min_n ..= max_n` and the Creativity Index.
    Creativity {
        #[serde(flatten)]
        subject: Subject,
        /// Shortest span length scored.
        #[serde(default = "defaults::min_n")]
        min_n: usize,
        /// Longest span length scored.
        #[serde(default = "defaults::max_n")]
        max_n: usize,
    },
    /// The document window around suffix-array rank `rank` of shard `s`.
    GetDocByRank {
        #[serde(flatten)]
        subject: Subject,
        /// The shard.
        #[serde(default)]
        s: usize,
        /// Suffix-array rank.
        rank: usize,
        /// Tokens of the window to show.
        #[serde(default = "defaults::max_disp_len")]
        max_disp_len: usize,
    },
    /// The document window around token position `ptr` of shard `s`.
    GetDocByPtr {
        #[serde(flatten)]
        subject: Subject,
        /// The shard.
        #[serde(default)]
        s: usize,
        /// Token position in the shard.
        ptr: usize,
        /// Tokens of the window to show.
        #[serde(default = "defaults::max_disp_len")]
        max_disp_len: usize,
    },
}

/// Every query type's name (the package's), as [`Query::query_type`] gives them.
pub const QUERY_TYPES: [&str; 13] = [
    "count",
    "prob",
    "ntd",
    "infgram_prob",
    "infgram_ntd",
    "infgram_rows",
    "find",
    "search_docs",
    "longest_match",
    "attribute",
    "creativity",
    "get_doc_by_rank",
    "get_doc_by_ptr",
];

impl Query {
    /// Reads one query from a JSON line (an error names what is wrong).
    pub fn from_json(line: &str) -> Result<Query> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| Error::input(format!("bad query line: {e}")))?;
        Query::from_value(value)
    }

    /// The package's name of the query type.
    pub fn query_type(&self) -> &'static str {
        match self {
            Query::Count { .. } => "count",
            Query::Prob { .. } => "prob",
            Query::Ntd { .. } => "ntd",
            Query::InfgramProb { .. } => "infgram_prob",
            Query::InfgramNtd { .. } => "infgram_ntd",
            Query::InfgramRows { .. } => "infgram_rows",
            Query::Find { .. } => "find",
            Query::SearchDocs { .. } => "search_docs",
            Query::LongestMatch { .. } => "longest_match",
            Query::Attribute { .. } => "attribute",
            Query::Creativity { .. } => "creativity",
            Query::GetDocByRank { .. } => "get_doc_by_rank",
            Query::GetDocByPtr { .. } => "get_doc_by_ptr",
        }
    }

    /// The tokens the query is about.
    pub fn subject(&self) -> &Subject {
        match self {
            Query::Count { subject, .. }
            | Query::Prob { subject, .. }
            | Query::Ntd { subject, .. }
            | Query::InfgramProb { subject, .. }
            | Query::InfgramNtd { subject, .. }
            | Query::InfgramRows { subject, .. }
            | Query::Find { subject }
            | Query::SearchDocs { subject, .. }
            | Query::LongestMatch { subject }
            | Query::Attribute { subject, .. }
            | Query::Creativity { subject, .. }
            | Query::GetDocByRank { subject, .. }
            | Query::GetDocByPtr { subject, .. } => subject,
        }
    }
}

/// Bounds on a query's size and work, checked by [`Query::check`] before it runs: a server
/// sets them from its flags; the CLI and Python leave them [`QueryLimits::UNBOUNDED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLimits {
    /// Characters of a query given as text.
    pub text_chars: usize,
    /// Tokens of a query (all the n-grams of a CNF together).
    pub tokens: usize,
    /// `maxnum` at most (documents of `search_docs`, documents per span of `attribute`).
    pub maxnum: usize,
    /// `max_disp_len` at most.
    pub max_disp_len: usize,
    /// `max_diff_tokens` at most.
    pub max_diff_tokens: usize,
}

impl QueryLimits {
    /// No bound but the protocol's own ([`MAX_CLAUSES`], [`MAX_TERMS`], [`MAX_CLAUSE_FREQ`]).
    pub const UNBOUNDED: QueryLimits = QueryLimits {
        text_chars: usize::MAX,
        tokens: usize::MAX,
        maxnum: usize::MAX,
        max_disp_len: usize::MAX,
        max_diff_tokens: usize::MAX,
    };

    /// The bounds of infini-gram's public API, which `infgram serve` takes by default: 1,000
    /// characters of text, 500 tokens, 10 documents, windows of 10,000 tokens, clauses 1,000
    /// tokens apart.
    pub const SERVED: QueryLimits = QueryLimits {
        text_chars: 1000,
        tokens: 500,
        maxnum: 10,
        max_disp_len: 10_000,
        max_diff_tokens: 1000,
    };

    /// Refuses a query text of more than [`QueryLimits::text_chars`] characters (field `text`).
    pub fn check_text(&self, text: &str) -> Result<()> {
        let chars = text.chars().count();
        if chars > self.text_chars {
            return Err(Error::Field {
                field: "text",
                message: format!(
                    "is {chars} characters; at most {} are taken",
                    self.text_chars
                ),
            });
        }
        Ok(())
    }

    /// Refuses a query of more than [`QueryLimits::tokens`] tokens (field `input_ids`).
    pub fn check_tokens(&self, n: usize) -> Result<()> {
        if n > self.tokens {
            return Err(Error::Field {
                field: "input_ids",
                message: format!("is {n} tokens; at most {} are taken", self.tokens),
            });
        }
        Ok(())
    }
}

impl Default for QueryLimits {
    fn default() -> Self {
        QueryLimits::UNBOUNDED
    }
}

/// `value` of the field `field` within `0 ..= max`.
fn at_most(field: &'static str, value: usize, max: usize) -> Result<()> {
    if value > max {
        return Err(Error::Field {
            field,
            message: format!("must be an integer between 0 and {max}, got {value}"),
        });
    }
    Ok(())
}

impl Query {
    /// Reads one query from a JSON value: absent (or `null`) parameters take [`defaults`]; a
    /// missing required one is named.
    pub fn from_value(mut value: Value) -> Result<Query> {
        if let Value::Object(fields) = &mut value {
            fields.retain(|_, v| !v.is_null());
        }
        let query_type = value
            .get("query_type")
            .and_then(Value::as_str)
            .unwrap_or("this query")
            .to_string();
        serde_json::from_value(value).map_err(|e| {
            let msg = e.to_string();
            match msg
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
            {
                Some(field) => Error::input(format!(
                    "{query_type} needs \"{field}\" (a non-negative integer)"
                )),
                None => Error::input(format!("bad query: {msg}")),
            }
        })
    }

    /// Checks the query's parameters against the protocol's bounds and `limits`; errors name
    /// the field ([`Error::Field`]) for a front end to rename.
    pub fn check(&self, limits: &QueryLimits) -> Result<()> {
        let subject = self.subject();
        if let Some(text) = &subject.text {
            limits.check_text(text)?;
        }
        let ids = subject.input_ids.as_ref().or(subject.prompt_ids.as_ref());
        limits.check_tokens(ids.map_or(0, Vec::len))?;
        match self {
            Query::Count {
                cnf,
                max_diff_tokens,
                max_clause_freq,
                ..
            } => {
                at_most("max_diff_tokens", *max_diff_tokens, limits.max_diff_tokens)?;
                check_cnf(cnf.as_deref(), *max_clause_freq, limits)
            }
            Query::SearchDocs {
                cnf,
                maxnum,
                max_diff_tokens,
                max_clause_freq,
                max_disp_len,
                ..
            } => {
                at_most("maxnum", *maxnum, limits.maxnum)?;
                at_most("max_disp_len", *max_disp_len, limits.max_disp_len)?;
                at_most("max_diff_tokens", *max_diff_tokens, limits.max_diff_tokens)?;
                check_cnf(cnf.as_deref(), *max_clause_freq, limits)
            }
            Query::Attribute {
                maxnum,
                max_disp_len,
                ..
            } => {
                at_most("maxnum", *maxnum, limits.maxnum)?;
                at_most("max_disp_len", *max_disp_len, limits.max_disp_len)
            }
            Query::GetDocByRank { max_disp_len, .. } | Query::GetDocByPtr { max_disp_len, .. } => {
                at_most("max_disp_len", *max_disp_len, limits.max_disp_len)
            }
            _ => Ok(()),
        }
    }
}

/// A document window with its `text` (decoded with the index's tokenizer).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DocAnswer {
    /// The window, with the package's fields.
    #[serde(flatten)]
    pub document: Document,
    /// Its tokens as text.
    pub text: String,
}

impl DocAnswer {
    fn new(document: Document, tok: &dyn Tokenizer) -> Result<DocAnswer> {
        let text = tok.decode(&document.token_ids)?;
        Ok(DocAnswer { document, text })
    }
}

/// `search_docs`' answer: the package's fields, documents with their text.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchAnswer {
    /// Matching occurrences.
    pub cnt: u64,
    /// Whether a clause was sampled.
    pub approx: bool,
    /// Up to `maxnum` matching documents.
    pub documents: Vec<DocAnswer>,
}

/// An attributed span with its `text`, and its documents with theirs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SpanAnswer {
    /// First token of the span in the text.
    pub l: usize,
    /// One past its last token.
    pub r: usize,
    /// `r − l`.
    pub length: usize,
    /// Occurrences in the corpus.
    pub count: u64,
    /// The documents it occurs in, a window each.
    pub docs: Vec<DocAnswer>,
    /// Whether documents were left out (the answer's token budget was spent).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub docs_cut: bool,
    /// The span as text.
    pub text: String,
}

/// `attribute`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttributeAnswer {
    /// The maximal spans that occur.
    pub spans: Vec<SpanAnswer>,
    /// The text's tokens.
    pub token_ids: Vec<u32>,
}

/// `infgram_rows`' answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowsAnswer {
    /// The estimator of the rows.
    pub estimator: EstimatorSpec,
    /// The ids a row may hold.
    pub vocab: usize,
    /// A row per token of the subject.
    pub rows: Vec<RowAnswer>,
}

/// One row of `infgram_rows`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowAnswer {
    /// The length of the longest suffix with a next token (0: the unigram).
    pub suffix_len: u32,
    /// Its occurrences followed by a token (or a document's end).
    pub count: u64,
    /// The distinct tokens that follow it.
    pub distinct: u32,
    /// The ids with p > 0, ascending.
    pub ids: Vec<u32>,
    /// Their ln p.
    pub logprobs: Vec<f32>,
}

impl RowsAnswer {
    fn new(rows: &Rows) -> RowsAnswer {
        RowsAnswer {
            estimator: rows.estimator.clone(),
            vocab: rows.vocab,
            rows: (0..rows.len())
                .map(|j| {
                    let (ids, logprobs) = rows.row(j);
                    RowAnswer {
                        suffix_len: rows.suffix_len[j],
                        count: rows.count[j],
                        distinct: rows.distinct[j],
                        ids: ids.to_vec(),
                        logprobs: logprobs.to_vec(),
                    }
                })
                .collect(),
        }
    }
}

/// `longest_match`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LongestMatchAnswer {
    /// For each position, the longest span ending there that occurs.
    pub matches: Vec<Match>,
}

/// The typed answer of a [`Query`]: one variant per kind of answer, serialized with the
/// infini-gram package's field names (plus `text` for documents and spans). The CLI prints
/// its table from it; the server, `--batch` and Python serialize it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// `count` (of an n-gram or a CNF).
    Count(CountResult),
    /// `prob`, `infgram_prob`.
    Prob(ProbResult),
    /// `ntd`, `infgram_ntd`.
    Ntd(NtdResult),
    /// `infgram_rows`.
    Rows(RowsAnswer),
    /// `find`.
    Find(FindResult),
    /// `search_docs`.
    SearchDocs(SearchAnswer),
    /// `longest_match`.
    LongestMatch(LongestMatchAnswer),
    /// `attribute`.
    Attribute(AttributeAnswer),
    /// `creativity`.
    Creativity(Creativity),
    /// `get_doc_by_rank`, `get_doc_by_ptr`.
    Document(DocAnswer),
}

impl Answer {
    /// The answer as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("answers serialize to JSON")
    }
}

impl Query {
    /// `attribute` of `ids`: spans of at least `min_len` tokens, `maxnum` documents each,
    /// windows of `max_disp_len` tokens; each left out takes the protocol's default.
    pub fn attribute(
        ids: Vec<u32>,
        min_len: Option<usize>,
        maxnum: Option<usize>,
        max_disp_len: Option<usize>,
    ) -> Query {
        Query::Attribute {
            subject: Subject::ids(ids),
            min_len: min_len.unwrap_or(defaults::MIN_LEN),
            maxnum: maxnum.unwrap_or(defaults::DOCS_PER_SPAN),
            max_disp_len: max_disp_len.unwrap_or(defaults::SPAN_DISP_LEN),
        }
    }

    /// `creativity` of `ids` for `n = min_n ..= max_n`; each left out takes the protocol's
    /// default.
    pub fn creativity(ids: Vec<u32>, min_n: Option<usize>, max_n: Option<usize>) -> Query {
        Query::Creativity {
            subject: Subject::ids(ids),
            min_n: min_n.unwrap_or(defaults::MIN_N),
            max_n: max_n.unwrap_or(defaults::MAX_N),
        }
    }
}

/// What [`attribute_spans`] found: the spans, and the shortest length they were asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Attribution {
    /// The answer.
    pub answer: AttributeAnswer,
    /// The shortest span reported, in tokens.
    pub min_len: usize,
}

/// Runs `query` (built by [`Query::attribute`]) over `index`: its typed answer.
pub fn attribute_spans(
    index: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    query: &Query,
) -> Result<Attribution> {
    typed_answer(index, tok, query, "attribute", |query, answer| {
        match (query, answer) {
            (Query::Attribute { min_len, .. }, Answer::Attribute(answer)) => Some(Attribution {
                answer,
                min_len: *min_len,
            }),
            _ => None,
        }
    })
}

/// Runs `query` (built by [`Query::creativity`]) over `index`: its typed answer.
pub fn creativity_of(
    index: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    query: &Query,
) -> Result<Creativity> {
    typed_answer(index, tok, query, "creativity", |_, answer| match answer {
        Answer::Creativity(c) => Some(c),
        _ => None,
    })
}

/// Runs `query`, which must be of type `kind`, and returns what `pick` takes from its answer.
fn typed_answer<T>(
    index: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    query: &Query,
    kind: &str,
    pick: impl FnOnce(&Query, Answer) -> Option<T>,
) -> Result<T> {
    if query.query_type() != kind {
        return Err(Error::input(format!(
            "this runs a {kind} query, not {}",
            query.query_type()
        )));
    }
    pick(query, execute(index, tok, query)?)
        .ok_or_else(|| Error::input(format!("a {kind} query was answered otherwise")))
}

/// Answers one query, unbounded but for the protocol's own limits ([`execute_within`]).
pub fn execute(
    index: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    query: &Query,
) -> Result<Answer> {
    execute_within(index, tok, query, &QueryLimits::UNBOUNDED)
}

/// Checks a query against `limits` ([`Query::check`]), tokenizes it and answers it over
/// `index`: an in-process [`crate::Index`], or any other [`Shards`] (a router over shards
/// held elsewhere).
pub fn execute_within(
    index: &(impl Shards + ?Sized),
    tok: &dyn Tokenizer,
    query: &Query,
    limits: &QueryLimits,
) -> Result<Answer> {
    query.check(limits)?;
    let ids = query.subject().tokens(tok)?;
    limits.check_tokens(ids.len())?;
    Ok(match query {
        Query::Count {
            cnf: Some(cnf),
            max_diff_tokens,
            max_clause_freq,
            ..
        } => {
            let r = index.search_docs(cnf, 0, *max_diff_tokens, *max_clause_freq, 0)?;
            Answer::Count(CountResult {
                count: r.cnt,
                approx: r.approx,
            })
        }
        Query::Count { .. } => Answer::Count(index.count(&ids)?),
        Query::Prob { cont, .. } => Answer::Prob(index.prob(&ids, cont.token(tok)?)?),
        Query::Ntd { eos_token_id, .. } => Answer::Ntd(index.ntd(&ids, *eos_token_id)?),
        Query::InfgramProb { cont, .. } => {
            Answer::Prob(index.infgram_prob(&ids, cont.token(tok)?)?)
        }
        Query::InfgramNtd { eos_token_id, .. } => {
            Answer::Ntd(index.infgram_ntd(&ids, *eos_token_id)?)
        }
        Query::InfgramRows {
            eos_token_id,
            window,
            vocab,
            estimator,
            ..
        } => {
            let options = RowsOptions {
                estimator: estimator.clone().unwrap_or(EstimatorSpec::Infgram),
                window: *window,
                end_token: *eos_token_id,
                vocab: *vocab,
            };
            Answer::Rows(RowsAnswer::new(&rows_over(index, &ids, &options)?))
        }
        Query::Find { .. } => Answer::Find(index.find(&ids)?),
        Query::LongestMatch { .. } => Answer::LongestMatch(LongestMatchAnswer {
            matches: index.longest_match(&ids)?,
        }),
        Query::Attribute {
            min_len,
            maxnum,
            max_disp_len,
            ..
        } => {
            let spans = attribute(index, &ids, (*min_len).max(1), *maxnum, *max_disp_len)?;
            Answer::Attribute(AttributeAnswer {
                spans: span_answers(spans, &ids, tok)?,
                token_ids: ids,
            })
        }
        Query::Creativity { min_n, max_n, .. } => {
            Answer::Creativity(creativity(index, &ids, *min_n, *max_n)?)
        }
        Query::SearchDocs {
            cnf,
            maxnum,
            max_diff_tokens,
            max_clause_freq,
            max_disp_len,
            ..
        } => {
            let cnf = cnf.clone().unwrap_or_else(|| vec![vec![ids]]);
            let r = index.search_docs(
                &cnf,
                *maxnum,
                *max_diff_tokens,
                *max_clause_freq,
                *max_disp_len,
            )?;
            Answer::SearchDocs(SearchAnswer {
                cnt: r.cnt,
                approx: r.approx,
                documents: r
                    .documents
                    .into_iter()
                    .map(|d| DocAnswer::new(d, tok))
                    .collect::<Result<_>>()?,
            })
        }
        Query::GetDocByRank {
            s,
            rank,
            max_disp_len,
            ..
        } => Answer::Document(DocAnswer::new(
            index.get_doc_by_rank(*s, *rank, ids.len(), *max_disp_len)?,
            tok,
        )?),
        Query::GetDocByPtr {
            s,
            ptr,
            max_disp_len,
            ..
        } => Answer::Document(DocAnswer::new(
            index.get_doc_by_ptr(*s, *ptr, ids.len(), *max_disp_len)?,
            tok,
        )?),
    })
}

/// Clauses of a CNF query at most (the infini-gram API's limit).
pub const MAX_CLAUSES: usize = 4;
/// n-grams per clause at most (the infini-gram API's limit).
pub const MAX_TERMS: usize = 4;
/// `max_clause_freq` at most (the infini-gram API's limit).
pub const MAX_CLAUSE_FREQ: usize = 500_000;

/// Refuses CNF queries past the protocol's limits, which bound the work of one query.
fn check_cnf(
    cnf: Option<&[Vec<Vec<u32>>]>,
    max_clause_freq: usize,
    limits: &QueryLimits,
) -> Result<()> {
    if let Some(cnf) = cnf {
        if cnf.len() > MAX_CLAUSES || cnf.iter().any(|c| c.len() > MAX_TERMS) {
            return Err(Error::input(format!(
                "a CNF may have at most {MAX_CLAUSES} clauses of at most {MAX_TERMS} n-grams each"
            )));
        }
        limits.check_tokens(cnf.iter().flatten().map(Vec::len).sum())?;
    }
    if !(1..=MAX_CLAUSE_FREQ).contains(&max_clause_freq) {
        return Err(Error::Field {
            field: "max_clause_freq",
            message: format!("must be between 1 and {MAX_CLAUSE_FREQ} (got {max_clause_freq})"),
        });
    }
    Ok(())
}

/// Attributed spans with the `text` of each span and document.
pub fn span_answers(spans: Vec<Span>, ids: &[u32], tok: &dyn Tokenizer) -> Result<Vec<SpanAnswer>> {
    spans
        .into_iter()
        .map(|sp| {
            Ok(SpanAnswer {
                text: tok.decode(&ids[sp.l..sp.r])?,
                l: sp.l,
                r: sp.r,
                length: sp.length,
                count: sp.count,
                docs_cut: sp.docs_cut,
                docs: sp
                    .docs
                    .into_iter()
                    .map(|d| DocAnswer::new(d, tok))
                    .collect::<Result<_>>()?,
            })
        })
        .collect()
}

/// Parses a CNF given on the command line: `a b OR c d AND e f` (each n-gram tokenized as
/// text), or the JSON ids form `[[[1,2],[3]],[[4]]]`.
pub fn parse_cnf(s: &str, tok: &dyn Tokenizer) -> Result<Vec<Vec<Vec<u32>>>> {
    if s.trim_start().starts_with('[') {
        return serde_json::from_str(s).map_err(|e| {
            Error::input(format!(
                "cnf must be a list of clauses, each a list of n-grams (lists of ids): {e}"
            ))
        });
    }
    s.split(" AND ")
        .map(|clause| clause.split(" OR ").map(|g| tok.encode(g)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_read_the_package_parameter_names() {
        let q = Query::from_json(r#"{"query_type": "prob", "prompt_ids": [1, 2], "cont_id": 3}"#)
            .unwrap();
        assert_eq!(
            q,
            Query::Prob {
                subject: Subject {
                    prompt_ids: Some(vec![1, 2]),
                    ..Default::default()
                },
                cont: Continuation {
                    cont_id: Some(3),
                    cont_text: None
                }
            }
        );
        let q = Query::from_json(r#"{"query_type": "search_docs", "cnf": [[[1], [2]], [[3]]]}"#)
            .unwrap();
        match &q {
            Query::SearchDocs { cnf, maxnum, .. } => {
                assert_eq!(cnf.as_ref().unwrap().len(), 2);
                assert_eq!(*maxnum, defaults::MAXNUM);
            }
            other => panic!("{other:?}"),
        }
        // Every type's name is listed, and reads back as that type.
        for name in QUERY_TYPES {
            let line = format!(r#"{{"query_type": "{name}", "rank": 0, "ptr": 0}}"#);
            assert_eq!(Query::from_json(&line).unwrap().query_type(), name);
        }
        // Round trip through JSON.
        let back = Query::from_json(&serde_json::to_string(&q).unwrap()).unwrap();
        assert_eq!(back, q);
        let e = Query::from_json(r#"{"query_type": "nope"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        let e = Query::from_json(r#"{"query_type": "get_doc_by_ptr", "s": 0}"#).unwrap_err();
        assert!(e.to_string().contains("ptr"), "{e}");
    }
}
