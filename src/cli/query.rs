//! `infgram query`: one query from flags, or a batch of JSON lines, through the service's one
//! executor ([`infgram::service::query`]). Requests and results use the infini-gram Python
//! package's parameter and field names.

use anyhow::{Context, Result};
use clap::Args;
use infgram::service::query::{execute, parse_cnf, Continuation, Query, Subject};
use infgram::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// The query types of the infini-gram package.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
#[value(rename_all = "snake_case")]
pub enum QueryType {
    Count,
    Prob,
    Ntd,
    InfgramProb,
    InfgramNtd,
    Find,
    SearchDocs,
    LongestMatch,
    GetDocByRank,
    GetDocByPtr,
}

/// Arguments of `infgram query`.
#[derive(Args, Debug)]
pub struct QueryArgs {
    /// The index directory.
    pub index: PathBuf,
    /// The query type.
    #[arg(value_enum)]
    pub query_type: Option<QueryType>,
    /// The query (or prompt) as text, tokenized with the index's tokenizer.
    #[arg(long, conflicts_with = "ids")]
    pub text: Option<String>,
    /// The query (or prompt) as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub ids: Option<Vec<u32>>,
    /// Continuation as text (one token) for prob / infgram_prob.
    #[arg(long, conflicts_with = "cont_id")]
    pub cont_text: Option<String>,
    /// Continuation token id for prob / infgram_prob.
    #[arg(long)]
    pub cont_id: Option<u32>,
    /// CNF for search_docs and count: `a b OR c d AND e f`, or JSON ids `[[[1,2],[3]],[[4]]]`.
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
    /// get_doc_by_rank: the suffix-array rank.
    #[arg(long)]
    pub rank: Option<usize>,
    /// get_doc_by_ptr: the token position in the shard.
    #[arg(long)]
    pub ptr: Option<usize>,
    /// ntd / infgram_ntd: report documents' ends under this id (infini-gram's `eos_token_id`);
    /// without it they count in `prompt_cnt` but are not listed.
    #[arg(long)]
    pub eos_token_id: Option<u32>,
    /// Tokenizer to use (must match the index); default: the one the index names.
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// One JSON query per line from FILE (`-` for stdin); one JSON result per line. The
    /// queries come from the lines alone: no query flag goes with it.
    #[arg(long, conflicts_with_all = [
        "query_type", "text", "ids", "cont_text", "cont_id", "cnf", "maxnum", "max_diff_tokens",
        "max_clause_freq", "max_disp_len", "shard", "rank", "ptr", "eos_token_id",
    ])]
    pub batch: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The query the flags describe.
fn query_from_flags(args: &QueryArgs, qt: QueryType, tok: &dyn Tokenizer) -> Result<Query> {
    let subject = Subject {
        input_ids: args.ids.clone(),
        text: args.text.clone(),
        ..Default::default()
    };
    let cont = || Continuation {
        cont_id: args.cont_id,
        cont_text: args.cont_text.clone(),
    };
    Ok(match qt {
        QueryType::Count => Query::Count {
            subject,
            cnf: args.cnf.as_deref().map(|c| parse_cnf(c, tok)).transpose()?,
            max_diff_tokens: args.max_diff_tokens,
            max_clause_freq: args.max_clause_freq,
        },
        QueryType::Prob => Query::Prob {
            subject,
            cont: cont(),
        },
        QueryType::Ntd => Query::Ntd {
            subject,
            eos_token_id: args.eos_token_id,
        },
        QueryType::InfgramProb => Query::InfgramProb {
            subject,
            cont: cont(),
        },
        QueryType::InfgramNtd => Query::InfgramNtd {
            subject,
            eos_token_id: args.eos_token_id,
        },
        QueryType::Find => Query::Find { subject },
        QueryType::LongestMatch => Query::LongestMatch { subject },
        QueryType::SearchDocs => Query::SearchDocs {
            subject,
            cnf: args.cnf.as_deref().map(|c| parse_cnf(c, tok)).transpose()?,
            maxnum: args.maxnum,
            max_diff_tokens: args.max_diff_tokens,
            max_clause_freq: args.max_clause_freq,
            max_disp_len: args.max_disp_len,
        },
        QueryType::GetDocByRank => Query::GetDocByRank {
            subject,
            s: args.shard,
            rank: args.rank.context("get_doc_by_rank needs --rank")?,
            max_disp_len: args.max_disp_len,
        },
        QueryType::GetDocByPtr => Query::GetDocByPtr {
            subject,
            s: args.shard,
            ptr: args.ptr.context("get_doc_by_ptr needs --ptr")?,
            max_disp_len: args.max_disp_len,
        },
    })
}

/// The longest line of a `--batch` file: a query's JSON (a CNF of many n-grams fits many
/// times over); a longer line is answered with an error, not held in memory.
const MAX_BATCH_LINE: usize = 1 << 24;

/// Reads the next line of `reader` into `line` (without its newline): `None` at the end,
/// `Some(false)` when it is longer than [`MAX_BATCH_LINE`] (the rest of it is skipped, not
/// kept), `Some(true)` otherwise.
fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<Option<bool>> {
    use std::io::Read as _;
    line.clear();
    let limit = MAX_BATCH_LINE as u64 + 1;
    let got = reader.by_ref().take(limit).read_until(b'\n', line)?;
    if got == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        return Ok(Some(true));
    }
    if line.len() <= MAX_BATCH_LINE {
        return Ok(Some(true)); // the last line, without a newline
    }
    // Skip the rest of the overlong line a buffer at a time.
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                break;
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
    line.clear();
    Ok(Some(false))
}

/// Runs `infgram query`.
pub fn run(args: QueryArgs) -> Result<()> {
    let (index, tok) = infgram::service::open_index(&args.index, args.tokenizer.as_deref())?;
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
        // Output line N answers input line N: blank, non-UTF-8 and overlong lines get an error
        // object. A write error ends the batch (a closed pipe quietly, in `main`).
        let mut reader = reader;
        let mut line = Vec::new();
        for n in 0.. {
            let read = next_line(&mut reader, &mut line)
                .with_context(|| format!("reading {}", batch.display()))?;
            let result = match read {
                None => break,
                Some(false) => Err(format!(
                    "line {}: longer than {} bytes; a query line is at most that long",
                    n + 1,
                    MAX_BATCH_LINE
                )),
                Some(true) => match std::str::from_utf8(&line) {
                    Err(_) => Err(format!("line {}: not valid UTF-8", n + 1)),
                    Ok(l) if l.trim().is_empty() => Err(format!("line {}: empty query", n + 1)),
                    Ok(l) => Query::from_json(l)
                        .and_then(|q| execute(&index, tok.as_ref(), &q))
                        .map_err(|e| e.to_string()),
                },
            };
            let v = result.unwrap_or_else(|e| json!({ "error": e }));
            writeln!(out, "{v}")?;
        }
        out.flush()?;
        return Ok(());
    }
    let Some(qt) = args.query_type else {
        anyhow::bail!("give a query type (count, prob, ntd, infgram_prob, infgram_ntd, find, search_docs, longest_match, get_doc_by_rank, get_doc_by_ptr) or --batch FILE");
    };
    let query = query_from_flags(&args, qt, tok.as_ref())?;
    let v = execute(&index, tok.as_ref(), &query)?;
    if args.json {
        writeln!(out, "{v}")?;
    } else {
        print_table(&mut out, &query, &v, tok.as_ref())?;
    }
    Ok(())
}

fn show_token(tok: &dyn Tokenizer, id: u32) -> String {
    let s = tok.decode(&[id]).unwrap_or_else(|_| format!("<{id}>"));
    format!("{s:?}")
}

fn print_table(out: &mut impl Write, query: &Query, v: &Value, tok: &dyn Tokenizer) -> Result<()> {
    match query.query_type() {
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
            let ids = query.subject().tokens(tok)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines come without their newline; an overlong one is reported and skipped, not kept,
    /// and the lines after it are read as usual (issue 32, item 8).
    #[test]
    fn batch_lines_are_capped() {
        let long = vec![b'x'; MAX_BATCH_LINE + 10];
        let mut input = b"{\"a\": 1}\n\n".to_vec();
        input.extend_from_slice(&long);
        input.extend_from_slice(b"\nlast");
        let mut reader = std::io::BufReader::new(std::io::Cursor::new(input));
        let mut line = Vec::new();
        let mut got = Vec::new();
        while let Some(ok) = next_line(&mut reader, &mut line).unwrap() {
            got.push((ok, String::from_utf8(line.clone()).unwrap()));
        }
        let want = [
            (true, "{\"a\": 1}"),
            (true, ""),
            (false, ""),
            (true, "last"),
        ];
        let want: Vec<(bool, String)> = want.iter().map(|&(o, l)| (o, l.into())).collect();
        assert_eq!(got, want);
    }
}
