//! `infgram query`: one query from flags, or a batch of JSON lines, through one executor.
//! Requests and results use the infini-gram Python package's parameter and field names.

use anyhow::{bail, Context, Result};
use clap::Args;
use infgram::index::query::NtdResult;
use infgram::tokenizer::Tokenizer;
use infgram::Index;
use memmap2::Mmap;
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Arguments of `infgram query`.
#[derive(Args, Debug)]
pub struct QueryArgs {
    /// The index directory.
    pub index: PathBuf,
    /// count | prob | ntd | infgram_prob | infgram_ntd | find | search_docs | longest_match |
    /// get_doc_by_rank | get_doc_by_ptr
    pub query_type: Option<String>,
    /// The query (or prompt) as text, tokenized with the index's tokenizer.
    #[arg(long)]
    pub text: Option<String>,
    /// The query (or prompt) as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub ids: Option<Vec<u32>>,
    /// Continuation as text (one token) for prob / infgram_prob.
    #[arg(long)]
    pub cont_text: Option<String>,
    /// Continuation token id for prob / infgram_prob.
    #[arg(long)]
    pub cont_id: Option<u32>,
    /// CNF for search_docs: `a b OR c d AND e f`, or JSON ids `[[[1,2],[3]],[[4]]]`.
    #[arg(long)]
    pub cnf: Option<String>,
    /// search_docs: documents to return.
    #[arg(long, default_value_t = 10)]
    pub maxnum: usize,
    /// search_docs: largest distance in tokens between clauses.
    #[arg(long, default_value_t = 10)]
    pub max_diff_tokens: usize,
    /// search_docs: occurrences per n-gram above which a clause is sampled (approx).
    #[arg(long, default_value_t = 100_000)]
    pub max_clause_freq: usize,
    /// Tokens of a document window to display.
    #[arg(long, default_value_t = 100)]
    pub max_disp_len: usize,
    /// get_doc_by_rank / get_doc_by_ptr: the shard.
    #[arg(long, default_value_t = 0)]
    pub shard: usize,
    /// get_doc_by_rank: suffix-array rank; get_doc_by_ptr: token position.
    #[arg(long)]
    pub rank: Option<usize>,
    /// Tokenizer to use (must match the index); default: the one the index names.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// One JSON query per line from FILE (`-` for stdin); one JSON result per line.
    #[arg(long)]
    pub batch: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A query, as a batch line or assembled from flags.
#[derive(Deserialize, Debug, Default)]
pub struct Request {
    query_type: String,
    #[serde(default)]
    input_ids: Option<Vec<u32>>,
    #[serde(default)]
    prompt_ids: Option<Vec<u32>>,
    #[serde(default)]
    cont_id: Option<u32>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    cont_text: Option<String>,
    #[serde(default)]
    cnf: Option<Value>,
    #[serde(default)]
    maxnum: Option<usize>,
    #[serde(default)]
    max_diff_tokens: Option<usize>,
    #[serde(default)]
    max_clause_freq: Option<usize>,
    #[serde(default)]
    max_disp_len: Option<usize>,
    #[serde(default)]
    s: Option<usize>,
    #[serde(default)]
    rank: Option<usize>,
    #[serde(default)]
    ptr: Option<usize>,
}

/// Opens the index and the tokenizer that must go with it.
pub fn open_index(
    dir: &std::path::Path,
    tokenizer: Option<&str>,
) -> Result<(Index<Mmap>, Box<dyn Tokenizer>)> {
    let index = Index::open(dir)?;
    let tok = match tokenizer {
        Some(name) => {
            let tok = infgram::tokenizer::load(&resolve_tokenizer_name(name)?)?;
            infgram::tokenizer::check_fingerprint(&index.header().tokenizer, tok.as_ref())?;
            tok
        }
        None => infgram::tokenizer::from_spec(&index.header().tokenizer)?,
    };
    Ok((index, tok))
}

/// Maps model names (`smollm2-135m`, fetched on first use; a safetensors directory;
/// `hf:OWNER/REPO[:FILE]`) to the file their tokenizer comes from; other names (`bytes`,
/// tokenizer files) pass through.
pub fn resolve_tokenizer_name(name: &str) -> Result<String> {
    if infgram::assets::model_path_for_name(name).is_some() {
        // A known model: fetched on first use, as for --model.
        return Ok(infgram::assets::ensure_model(name)?.display().to_string());
    }
    let path = std::path::Path::new(name);
    if name.starts_with("hf:") || path.join("config.json").exists() {
        let source = infgram::neural::source::ModelSource::resolve(name)?;
        return Ok(source.tokenizer_file().display().to_string());
    }
    Ok(name.to_string())
}

/// Runs `infgram query`.
pub fn run(args: QueryArgs) -> Result<()> {
    let (index, tok) = open_index(&args.index, args.tokenizer.as_deref())?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if let Some(batch) = &args.batch {
        let reader: Box<dyn BufRead> = if batch.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(batch).with_context(|| format!("{}", batch.display()))?,
            ))
        };
        for line in reader.lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let result = serde_json::from_str::<Request>(&line)
                .map_err(|e| anyhow::anyhow!("bad query line: {e}"))
                .and_then(|req| execute(&index, tok.as_ref(), &req));
            let v = result.unwrap_or_else(|e| json!({ "error": format!("{e:#}") }));
            if writeln!(out, "{v}").is_err() {
                return Ok(()); // broken pipe: the reader is gone
            }
        }
        return Ok(());
    }
    let Some(qt) = args.query_type.clone() else {
        bail!("give a query type (count, prob, ntd, infgram_prob, infgram_ntd, find, search_docs, longest_match, get_doc_by_rank, get_doc_by_ptr) or --batch FILE");
    };
    let req = Request {
        query_type: qt,
        input_ids: args.ids.clone(),
        text: args.text.clone(),
        cont_id: args.cont_id,
        cont_text: args.cont_text.clone(),
        cnf: args
            .cnf
            .as_deref()
            .map(|c| parse_cnf_arg(c, tok.as_ref()))
            .transpose()?,
        maxnum: Some(args.maxnum),
        max_diff_tokens: Some(args.max_diff_tokens),
        max_clause_freq: Some(args.max_clause_freq),
        max_disp_len: Some(args.max_disp_len),
        s: Some(args.shard),
        rank: args.rank,
        ptr: args.rank,
        ..Default::default()
    };
    let v = execute(&index, tok.as_ref(), &req)?;
    if args.json {
        writeln!(out, "{v}")?;
    } else {
        print_table(&mut out, &req, &v, tok.as_ref())?;
    }
    Ok(())
}

/// `a b OR c d AND e f` (tokenized text) or JSON ids, into the JSON CNF form.
fn parse_cnf_arg(s: &str, tok: &dyn Tokenizer) -> Result<Value> {
    if s.trim_start().starts_with('[') {
        return Ok(serde_json::from_str(s)?);
    }
    let mut cnf = Vec::new();
    for clause in s.split(" AND ") {
        let mut ors = Vec::new();
        for g in clause.split(" OR ") {
            ors.push(tok.encode(g)?);
        }
        cnf.push(ors);
    }
    Ok(serde_json::to_value(cnf)?)
}

fn ids_of(req: &Request, tok: &dyn Tokenizer) -> Result<Vec<u32>> {
    if let Some(ids) = req.input_ids.as_ref().or(req.prompt_ids.as_ref()) {
        return Ok(ids.clone());
    }
    match &req.text {
        Some(t) => Ok(tok.encode(t)?),
        None => Ok(Vec::new()),
    }
}

fn cont_of(req: &Request, tok: &dyn Tokenizer) -> Result<u32> {
    if let Some(c) = req.cont_id {
        return Ok(c);
    }
    let Some(t) = &req.cont_text else {
        bail!("this query needs a continuation: --cont-id N or --cont-text T (\"cont_id\" in a batch)");
    };
    match tok.encode(t)?.as_slice() {
        [one] => Ok(*one),
        ids => bail!(
            "--cont-text {t:?} is {} tokens; it must be exactly one",
            ids.len()
        ),
    }
}

fn ntd_json(r: NtdResult) -> Value {
    serde_json::to_value(r).expect("serializable")
}

/// Runs one request and returns its JSON result.
pub fn execute<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    tok: &dyn Tokenizer,
    req: &Request,
) -> Result<Value> {
    let ids = ids_of(req, tok)?;
    Ok(match req.query_type.as_str() {
        "count" => serde_json::to_value(index.count(&ids)?)?,
        "prob" => serde_json::to_value(index.prob(&ids, cont_of(req, tok)?)?)?,
        "ntd" => ntd_json(index.ntd(&ids)?),
        "infgram_prob" => serde_json::to_value(index.infgram_prob(&ids, cont_of(req, tok)?)?)?,
        "infgram_ntd" => ntd_json(index.infgram_ntd(&ids)?),
        "find" => serde_json::to_value(index.find(&ids)?)?,
        "longest_match" => json!({ "matches": index.longest_match(&ids)? }),
        "search_docs" => {
            let cnf: Vec<Vec<Vec<u32>>> = match &req.cnf {
                Some(v) => serde_json::from_value(v.clone()).context(
                    "cnf must be a list of clauses, each a list of n-grams (lists of ids)",
                )?,
                None => vec![vec![ids]],
            };
            let r = index.search_docs(
                &cnf,
                req.maxnum.unwrap_or(10),
                req.max_diff_tokens.unwrap_or(10),
                req.max_clause_freq.unwrap_or(100_000),
                req.max_disp_len.unwrap_or(100),
            )?;
            let mut v = serde_json::to_value(&r)?;
            for (d, doc) in v["documents"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .zip(&r.documents)
            {
                d["text"] = json!(tok.decode(&doc.token_ids)?);
            }
            v
        }
        "get_doc_by_rank" | "get_doc_by_ptr" => {
            let s = req.s.unwrap_or(0);
            let disp = req.max_disp_len.unwrap_or(100);
            let doc = if req.query_type == "get_doc_by_rank" {
                let rank = req
                    .rank
                    .context("get_doc_by_rank needs \"rank\" (--rank)")?;
                index.get_doc_by_rank(s, rank, ids.len(), disp)?
            } else {
                let ptr = req.ptr.context("get_doc_by_ptr needs \"ptr\" (--rank)")?;
                index.get_doc_by_ptr(s, ptr, ids.len(), disp)?
            };
            let mut v = serde_json::to_value(&doc)?;
            v["text"] = json!(tok.decode(&doc.token_ids)?);
            v
        }
        other => bail!("unknown query type {other:?}"),
    })
}

fn show_token(tok: &dyn Tokenizer, id: u32) -> String {
    let s = tok.decode(&[id]).unwrap_or_else(|_| format!("<{id}>"));
    format!("{s:?}")
}

fn print_table(out: &mut impl Write, req: &Request, v: &Value, tok: &dyn Tokenizer) -> Result<()> {
    match req.query_type.as_str() {
        "ntd" | "infgram_ntd" => {
            if let Some(l) = v.get("suffix_len") {
                writeln!(out, "suffix_len  {l}")?;
            }
            writeln!(out, "prompt_cnt  {}", v["prompt_cnt"])?;
            writeln!(out, "{:>8}  {:>10}  {:>8}  token", "id", "cont_cnt", "prob")?;
            let mut rows: Vec<(u32, u64, f64)> = v["result_by_token_id"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, x)| {
                    (
                        k.parse().unwrap_or(0),
                        x["cont_cnt"].as_u64().unwrap_or(0),
                        x["prob"].as_f64().unwrap_or(0.0),
                    )
                })
                .collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            for (id, c, p) in rows {
                writeln!(out, "{id:>8}  {c:>10}  {p:>8.5}  {}", show_token(tok, id))?;
            }
        }
        "longest_match" => {
            let ids = ids_of(req, tok)?;
            writeln!(
                out,
                "{:>5}  {:>12}  {:>6}  {:>10}  span ending here",
                "pos", "token", "len", "count"
            )?;
            for (j, m) in v["matches"].as_array().into_iter().flatten().enumerate() {
                let len = m["len"].as_u64().unwrap_or(0) as usize;
                let span = tok.decode(&ids[j + 1 - len..=j]).unwrap_or_default();
                writeln!(
                    out,
                    "{j:>5}  {:>12}  {len:>6}  {:>10}  {span:?}",
                    show_token(tok, ids[j]),
                    m["count"]
                )?;
            }
        }
        "search_docs" | "get_doc_by_rank" | "get_doc_by_ptr" => {
            let docs: Vec<&Value> = match v.get("documents") {
                Some(d) => {
                    writeln!(
                        out,
                        "cnt {}{}",
                        v["cnt"],
                        if v["approx"] == json!(true) {
                            " (approx)"
                        } else {
                            ""
                        }
                    )?;
                    d.as_array().into_iter().flatten().collect()
                }
                None => vec![v],
            };
            for d in docs {
                writeln!(
                    out,
                    "--- doc {} (shard {}, {} tokens) {}",
                    d["doc_ix"],
                    d["s"],
                    d["doc_len"],
                    d["metadata"].as_str().unwrap_or("")
                )?;
                writeln!(out, "{}", d["text"].as_str().unwrap_or(""))?;
            }
        }
        _ => {
            for (k, x) in v.as_object().into_iter().flatten() {
                writeln!(out, "{k:<18}{x}")?;
            }
        }
    }
    Ok(())
}
