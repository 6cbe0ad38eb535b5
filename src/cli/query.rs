//! `infgram query`: one query from flags, or a batch of JSON lines, through the service's one
//! executor ([`infgram::service::query`]). Requests and results use the infini-gram Python
//! package's parameter and field names.

use anyhow::{Context, Result};
use clap::Args;
use clap::ValueEnum as _;
use infgram::service::query::{execute, parse_cnf, Answer, DocAnswer, Query, TokenProb};
use infgram::service::Tokenizer;
use serde_json::json;
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
    InfgramRows,
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
    /// search_docs: documents to return [default: 1].
    #[arg(long)]
    pub maxnum: Option<usize>,
    /// search_docs: largest distance in tokens between clauses [default: 100].
    #[arg(long)]
    pub max_diff_tokens: Option<usize>,
    /// search_docs: occurrences per n-gram above which a clause is sampled (approx)
    /// [default: 50000].
    #[arg(long)]
    pub max_clause_freq: Option<usize>,
    /// Tokens of a document window to display [default: 1000].
    #[arg(long)]
    pub max_disp_len: Option<usize>,
    /// get_doc_by_rank / get_doc_by_ptr: the shard [default: 0].
    #[arg(long)]
    pub shard: Option<usize>,
    /// get_doc_by_rank: the suffix-array rank.
    #[arg(long)]
    pub rank: Option<usize>,
    /// get_doc_by_ptr: the token position in the shard.
    #[arg(long)]
    pub ptr: Option<usize>,
    /// ntd / infgram_ntd / infgram_rows: report documents' ends under this id (infini-gram's `eos_token_id`);
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

/// The request fields the flags of `infgram query` set, and the flags' names (for errors).
const FLAG_NAMES: &[(&str, &str)] = &[
    ("text", "--text"),
    ("input_ids", "--ids"),
    ("cont_id", "--cont-id"),
    ("cont_text", "--cont-text"),
    ("maxnum", "--maxnum"),
    ("max_diff_tokens", "--max-diff-tokens"),
    ("max_clause_freq", "--max-clause-freq"),
    ("max_disp_len", "--max-disp-len"),
];

/// Refuses a flag that the query type does not read (each would be accepted and ignored),
/// naming the flag and the query type; and `--cnf` beside `--text` / `--ids`, where the CNF
/// is the query and the n-gram would be ignored.
fn check_flags_apply(args: &QueryArgs, qt: QueryType) -> Result<()> {
    use QueryType::*;
    let subject = args.text.is_some() || args.ids.is_some();
    let flags: [(&str, bool, &[QueryType]); 11] = [
        (
            "--text / --ids",
            subject,
            &[
                Count,
                Prob,
                Ntd,
                InfgramProb,
                InfgramNtd,
                InfgramRows,
                Find,
                SearchDocs,
                LongestMatch,
            ],
        ),
        (
            "--cont-text / --cont-id",
            args.cont_text.is_some() || args.cont_id.is_some(),
            &[Prob, InfgramProb],
        ),
        ("--cnf", args.cnf.is_some(), &[Count, SearchDocs]),
        ("--maxnum", args.maxnum.is_some(), &[SearchDocs]),
        (
            "--max-diff-tokens",
            args.max_diff_tokens.is_some(),
            &[Count, SearchDocs],
        ),
        (
            "--max-clause-freq",
            args.max_clause_freq.is_some(),
            &[Count, SearchDocs],
        ),
        (
            "--max-disp-len",
            args.max_disp_len.is_some(),
            &[SearchDocs, GetDocByRank, GetDocByPtr],
        ),
        (
            "--shard",
            args.shard.is_some(),
            &[GetDocByRank, GetDocByPtr],
        ),
        ("--rank", args.rank.is_some(), &[GetDocByRank]),
        ("--ptr", args.ptr.is_some(), &[GetDocByPtr]),
        (
            "--eos-token-id",
            args.eos_token_id.is_some(),
            &[Ntd, InfgramNtd, InfgramRows],
        ),
    ];
    let name = |q: QueryType| {
        q.to_possible_value()
            .expect("not hidden")
            .get_name()
            .to_string()
    };
    for (flag, given, applies) in flags {
        if given && !applies.contains(&qt) {
            anyhow::bail!(
                "{flag} does not apply to {}: leave it out (it is read by {})",
                name(qt),
                applies
                    .iter()
                    .map(|&q| name(q))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if args.cnf.is_some() && subject {
        anyhow::bail!(
            "--cnf and --text / --ids both name what {} looks for: give one of them",
            name(qt)
        );
    }
    let cnf_only = args.max_diff_tokens.is_some() || args.max_clause_freq.is_some();
    if qt == Count && cnf_only && args.cnf.is_none() {
        anyhow::bail!("--max-diff-tokens and --max-clause-freq apply to count with --cnf only");
    }
    Ok(())
}

/// The query the flags describe: the flags given, as the request's fields (those not given
/// take the library's defaults).
fn query_from_flags(args: &QueryArgs, qt: QueryType, tok: &dyn Tokenizer) -> Result<Query> {
    check_flags_apply(args, qt)?;
    let cnf = args.cnf.as_deref().map(|c| parse_cnf(c, tok)).transpose()?;
    match qt {
        QueryType::GetDocByRank if args.rank.is_none() => {
            anyhow::bail!("get_doc_by_rank needs --rank")
        }
        QueryType::GetDocByPtr if args.ptr.is_none() => anyhow::bail!("get_doc_by_ptr needs --ptr"),
        _ => {}
    }
    let fields = json!({
        "query_type": qt.to_possible_value().expect("no query type is hidden").get_name(),
        "input_ids": args.ids,
        "text": args.text,
        "cont_id": args.cont_id,
        "cont_text": args.cont_text,
        "cnf": cnf,
        "maxnum": args.maxnum,
        "max_diff_tokens": args.max_diff_tokens,
        "max_clause_freq": args.max_clause_freq,
        "max_disp_len": args.max_disp_len,
        "s": args.shard,
        "rank": args.rank,
        "ptr": args.ptr,
        "eos_token_id": args.eos_token_id,
    });
    // A flag not given is a field not sent (null).
    Ok(Query::from_value(fields)?)
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
                        .map(|a| a.to_value())
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
        anyhow::bail!("give a query type (count, prob, ntd, infgram_prob, infgram_ntd, infgram_rows, find, search_docs, longest_match, get_doc_by_rank, get_doc_by_ptr) or --batch FILE");
    };
    let query = query_from_flags(&args, qt, tok.as_ref())?;
    let answer = execute(&index, tok.as_ref(), &query).map_err(|e| e.rename_field(FLAG_NAMES))?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&answer)?)?;
    } else {
        print_table(&mut out, &query, &answer, tok.as_ref())?;
    }
    Ok(())
}

fn show_token(tok: &dyn Tokenizer, id: u32) -> String {
    let s = tok.decode(&[id]).unwrap_or_else(|_| format!("<{id}>"));
    format!("{s:?}")
}

fn print_table(
    out: &mut impl Write,
    query: &Query,
    answer: &Answer,
    tok: &dyn Tokenizer,
) -> Result<()> {
    match answer {
        Answer::Ntd(ntd) => {
            if let Some(l) = ntd.suffix_len {
                writeln!(out, "suffix_len  {l}")?;
            }
            writeln!(out, "prompt_cnt  {}", ntd.prompt_cnt)?;
            writeln!(out, "{:>8}  {:>10}  {:>8}  token", "id", "cont_cnt", "prob")?;
            let mut rows: Vec<(&u32, &TokenProb)> = ntd.result_by_token_id.iter().collect();
            rows.sort_by(|a, b| b.1.cont_cnt.cmp(&a.1.cont_cnt).then(a.0.cmp(b.0)));
            for (id, p) in rows {
                writeln!(
                    out,
                    "{id:>8}  {:>10}  {:>8.5}  {}",
                    p.cont_cnt,
                    p.prob,
                    show_token(tok, *id)
                )?;
            }
        }
        Answer::LongestMatch(lm) => {
            let ids = query.subject().tokens(tok)?;
            writeln!(
                out,
                "{:>5}  {:>12}  {:>6}  {:>10}  span ending here",
                "pos", "token", "len", "count"
            )?;
            for (j, m) in lm.matches.iter().enumerate() {
                let span = tok.decode(&ids[j + 1 - m.len..=j]).unwrap_or_default();
                writeln!(
                    out,
                    "{j:>5}  {:>12}  {:>6}  {:>10}  {span:?}",
                    show_token(tok, ids[j]),
                    m.len,
                    m.count
                )?;
            }
        }
        Answer::Rows(answer) => {
            let ids = query.subject().tokens(tok)?;
            writeln!(
                out,
                "{:>5}  {:>12}  {:>6}  {:>10}  {:>8}  most likely next",
                "pos", "token", "suffix", "count", "distinct"
            )?;
            for (j, row) in answer.rows.iter().enumerate() {
                let best = row
                    .ids
                    .iter()
                    .zip(&row.logprobs)
                    .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)));
                let best = best.map_or(String::new(), |(&id, &lp)| {
                    format!("{} {:.4}", show_token(tok, id), (lp as f64).exp())
                });
                writeln!(
                    out,
                    "{j:>5}  {:>12}  {:>6}  {:>10}  {:>8}  {best}",
                    show_token(tok, ids[j]),
                    row.suffix_len,
                    row.count,
                    row.distinct
                )?;
            }
        }
        Answer::SearchDocs(found) => {
            let approx = if found.approx { " (approx)" } else { "" };
            writeln!(out, "cnt {}{approx}", found.cnt)?;
            for d in &found.documents {
                print_document(out, d)?;
            }
        }
        Answer::Document(d) => print_document(out, d)?,
        other => {
            for (k, x) in other.to_value().as_object().into_iter().flatten() {
                writeln!(out, "{k:<18}{x}")?;
            }
        }
    }
    Ok(())
}

fn print_document(out: &mut impl Write, d: &DocAnswer) -> Result<()> {
    let doc = &d.document;
    writeln!(
        out,
        "--- doc {} (shard {}, {} tokens) {}",
        doc.doc_ix, doc.s, doc.doc_len, doc.metadata
    )?;
    writeln!(out, "{}", d.text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines come without their newline; an overlong one is reported and skipped, not kept,
    /// and the lines after it are read as usual.
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
