//! The typed query protocol: one [`Query`] enum with the infini-gram Python package's parameter
//! names, read from JSON (`infgram query --batch`, and next the HTTP server and Python) or built
//! from command-line flags, and one [`execute`] that answers it with the package's field names.
//!
//! A query line looks like `{"query_type": "prob", "prompt_ids": [1, 2], "cont_id": 3}`; the
//! tokens of a query come from `input_ids` / `prompt_ids` or from `text` (tokenized with the
//! index's tokenizer), a continuation from `cont_id` or `cont_text`.

use crate::error::{Error, Result};
use crate::eval::attribution::{attribute, creativity, Span};
use crate::index::query::Document;
use crate::index::Index;
use crate::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

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
                "give the query's tokens one way: \"input_ids\", \"prompt_ids\" or \"text\" \
                 (--ids or --text), not several",
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
                "give the continuation one way: \"cont_id\" or \"cont_text\" (--cont-id or \
                 --cont-text), not both",
            ));
        }
        if let Some(c) = self.cont_id {
            return Ok(c);
        }
        let Some(t) = &self.cont_text else {
            return Err(Error::input(
                "this query needs a continuation: --cont-id N or --cont-text T (\"cont_id\" in a batch)",
            ));
        };
        match tok.encode(t)?.as_slice() {
            [one] => Ok(*one),
            ids => Err(Error::input(format!(
                "--cont-text {t:?} is {} tokens; it must be exactly one",
                ids.len()
            ))),
        }
    }
}

/// Documents to show: how many tokens of each.
fn default_disp_len() -> usize {
    100
}
fn default_maxnum() -> usize {
    10
}
fn default_max_diff_tokens() -> usize {
    10
}
fn default_max_clause_freq() -> usize {
    100_000
}
fn default_min_len() -> usize {
    8
}
fn default_docs_per_span() -> usize {
    3
}
fn default_min_n() -> usize {
    5
}
fn default_max_n() -> usize {
    12
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
        #[serde(default = "default_max_diff_tokens")]
        max_diff_tokens: usize,
        /// With `cnf`: occurrences per n-gram above which a clause is sampled (approx).
        #[serde(default = "default_max_clause_freq")]
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
        #[serde(default = "default_maxnum")]
        maxnum: usize,
        /// Largest distance in tokens between clauses.
        #[serde(default = "default_max_diff_tokens")]
        max_diff_tokens: usize,
        /// Occurrences per n-gram above which a clause is sampled (approx).
        #[serde(default = "default_max_clause_freq")]
        max_clause_freq: usize,
        /// Tokens of a document window to show.
        #[serde(default = "default_disp_len")]
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
        #[serde(default = "default_min_len")]
        min_len: usize,
        /// Documents per span.
        #[serde(default = "default_docs_per_span")]
        maxnum: usize,
        /// Tokens of a document window to show.
        #[serde(default = "default_disp_len")]
        max_disp_len: usize,
    },
    /// L-uniqueness for `n = min_n ..= max_n` and the Creativity Index.
    Creativity {
        #[serde(flatten)]
        subject: Subject,
        /// Shortest span length scored.
        #[serde(default = "default_min_n")]
        min_n: usize,
        /// Longest span length scored.
        #[serde(default = "default_max_n")]
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
        #[serde(default = "default_disp_len")]
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
        #[serde(default = "default_disp_len")]
        max_disp_len: usize,
    },
}

impl Query {
    /// Reads one query from a JSON line (an error names what is wrong).
    pub fn from_json(line: &str) -> Result<Query> {
        serde_json::from_str(line).map_err(|e| Error::input(format!("bad query line: {e}")))
    }

    /// The package's name of the query type.
    pub fn query_type(&self) -> &'static str {
        match self {
            Query::Count { .. } => "count",
            Query::Prob { .. } => "prob",
            Query::Ntd { .. } => "ntd",
            Query::InfgramProb { .. } => "infgram_prob",
            Query::InfgramNtd { .. } => "infgram_ntd",
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

fn to_json<T: Serialize>(x: T) -> Result<Value> {
    serde_json::to_value(x).map_err(|e| Error::input(format!("cannot encode the result: {e}")))
}

/// Answers one query with the Python package's field names (plus `text` for documents).
pub fn execute<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    tok: &dyn Tokenizer,
    query: &Query,
) -> Result<Value> {
    let ids = query.subject().tokens(tok)?;
    match query {
        Query::Count {
            cnf: Some(cnf),
            max_diff_tokens,
            max_clause_freq,
            ..
        } => {
            check_cnf_limits(cnf, *max_clause_freq)?;
            let r = index.search_docs(cnf, 0, *max_diff_tokens, *max_clause_freq, 0)?;
            Ok(json!({ "count": r.cnt, "approx": r.approx }))
        }
        Query::Count { .. } => to_json(index.count(&ids)?),
        Query::Prob { cont, .. } => to_json(index.prob(&ids, cont.token(tok)?)?),
        Query::Ntd { eos_token_id, .. } => to_json(index.ntd(&ids, *eos_token_id)?),
        Query::InfgramProb { cont, .. } => to_json(index.infgram_prob(&ids, cont.token(tok)?)?),
        Query::InfgramNtd { eos_token_id, .. } => to_json(index.infgram_ntd(&ids, *eos_token_id)?),
        Query::Find { .. } => to_json(index.find(&ids)?),
        Query::LongestMatch { .. } => Ok(json!({ "matches": index.longest_match(&ids)? })),
        Query::Attribute {
            min_len,
            maxnum,
            max_disp_len,
            ..
        } => {
            let spans = attribute(index, &ids, *min_len, *maxnum, *max_disp_len)?;
            Ok(json!({ "spans": spans_json(&spans, &ids, tok)?, "token_ids": ids }))
        }
        Query::Creativity { min_n, max_n, .. } => to_json(creativity(index, &ids, *min_n, *max_n)?),
        Query::SearchDocs {
            cnf,
            maxnum,
            max_diff_tokens,
            max_clause_freq,
            max_disp_len,
            ..
        } => {
            let cnf = cnf.clone().unwrap_or_else(|| vec![vec![ids]]);
            check_cnf_limits(&cnf, *max_clause_freq)?;
            let r = index.search_docs(
                &cnf,
                *maxnum,
                *max_diff_tokens,
                *max_clause_freq,
                *max_disp_len,
            )?;
            let mut v = to_json(&r)?;
            v["documents"] = r
                .documents
                .iter()
                .map(|d| doc_json(d, tok))
                .collect::<Result<_>>()?;
            Ok(v)
        }
        Query::GetDocByRank {
            s,
            rank,
            max_disp_len,
            ..
        } => doc_json(
            &index.get_doc_by_rank(*s, *rank, ids.len(), *max_disp_len)?,
            tok,
        ),
        Query::GetDocByPtr {
            s,
            ptr,
            max_disp_len,
            ..
        } => doc_json(
            &index.get_doc_by_ptr(*s, *ptr, ids.len(), *max_disp_len)?,
            tok,
        ),
    }
}

/// Clauses of a CNF query at most (the infini-gram API's limit).
pub const MAX_CLAUSES: usize = 4;
/// n-grams per clause at most (the infini-gram API's limit).
pub const MAX_TERMS: usize = 4;
/// `max_clause_freq` at most (the infini-gram API's limit).
pub const MAX_CLAUSE_FREQ: usize = 500_000;

/// Refuses CNF queries past the protocol's limits, which bound the work of one query.
fn check_cnf_limits(cnf: &[Vec<Vec<u32>>], max_clause_freq: usize) -> Result<()> {
    if cnf.len() > MAX_CLAUSES || cnf.iter().any(|c| c.len() > MAX_TERMS) {
        return Err(Error::input(format!(
            "a CNF may have at most {MAX_CLAUSES} clauses of at most {MAX_TERMS} n-grams each"
        )));
    }
    if !(1..=MAX_CLAUSE_FREQ).contains(&max_clause_freq) {
        return Err(Error::input(format!(
            "max_clause_freq must be between 1 and {MAX_CLAUSE_FREQ} (got {max_clause_freq})"
        )));
    }
    Ok(())
}

/// Attributed spans with the package's fields, plus the `text` of each span and document.
pub fn spans_json(spans: &[Span], ids: &[u32], tok: &dyn Tokenizer) -> Result<Value> {
    spans
        .iter()
        .map(|sp| {
            let mut v = to_json(sp)?;
            v["text"] = json!(tok.decode(&ids[sp.l..sp.r])?);
            v["docs"] = sp
                .docs
                .iter()
                .map(|d| doc_json(d, tok))
                .collect::<Result<_>>()?;
            Ok(v)
        })
        .collect()
}

/// A document window with the package's fields, plus its `text`.
fn doc_json(doc: &Document, tok: &dyn Tokenizer) -> Result<Value> {
    let mut v = to_json(doc)?;
    v["text"] = json!(tok.decode(&doc.token_ids)?);
    Ok(v)
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
                assert_eq!(*maxnum, 10);
            }
            other => panic!("{other:?}"),
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
