//! `infgram attribute` and `infgram creativity`: where a text copies its corpus, and how much
//! of it is its own ([`infgram::service::query::attribute`]).

use anyhow::{Context, Result};
use clap::Args;
use infgram::service::files::Accept;
use infgram::service::query::{attribute_spans, creativity_of, Query, SpanAnswer};
use infgram::service::Tokenizer;
use serde_json::json;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

/// The text and index flags shared by both commands.
#[derive(Args, Debug)]
pub struct TextArgs {
    /// The text to examine: a file, or `-` for standard input.
    #[arg(long, value_name = "FILE")]
    pub text: PathBuf,
    /// The index (default: Shakespeare's complete works, indexed on first use).
    #[arg(long)]
    pub index: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The index, its tokenizer and the text's token ids.
struct Loaded {
    index: infgram::service::Index<memmap2::Mmap>,
    tok: Box<dyn Tokenizer>,
    ids: Vec<u32>,
}

impl TextArgs {
    fn load(&self) -> Result<Loaded> {
        let (index, tok) = match &self.index {
            Some(d) => infgram::service::open_index(d, None)?,
            None => infgram::service::open_cached_byte_index(&[])?,
        };
        let text = read_text(&self.text)?;
        let ids = tok.encode(&text)?;
        Ok(Loaded { index, tok, ids })
    }
}

/// Reads a text file, or standard input for `-`.
fn read_text(path: &Path) -> Result<String> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the text from standard input")?;
        return Ok(s);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Arguments of `infgram attribute`.
#[derive(Args, Debug)]
pub struct AttributeArgs {
    #[command(flatten)]
    pub input: TextArgs,
    /// Shortest span reported, in the index's tokens [default: 8].
    #[arg(long)]
    pub min_len: Option<usize>,
    /// Documents shown per span [default: 3].
    #[arg(long)]
    pub docs: Option<usize>,
    /// Tokens of a document window to show around a match [default: 100].
    #[arg(long)]
    pub max_disp_len: Option<usize>,
    /// Also write a self-contained HTML page with the spans highlighted and their documents
    /// (a regular file is written beside and renamed into place; `-`, a FIFO or a device is
    /// written as a stream).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// Runs `infgram attribute`.
pub fn run_attribute(args: AttributeArgs) -> Result<()> {
    if let Some(path) = &args.html {
        // Checked before the work (a refused output costs nothing).
        infgram::service::files::check(path, Accept::Streams)?;
    }
    let Loaded { index, tok, ids } = args.input.load()?;
    let query = Query::attribute(ids.clone(), args.min_len, args.docs, args.max_disp_len);
    let t = std::time::Instant::now();
    let found = attribute_spans(&index, tok.as_ref(), &query)
        .map_err(|e| e.rename_field(&[("maxnum", "--docs"), ("max_disp_len", "--max-disp-len")]))?;
    let seconds = t.elapsed().as_secs_f64();
    let (spans, min_len) = (found.answer.spans, found.min_len);
    if let Some(path) = &args.html {
        let page = html_page(&spans, &ids, tok.as_ref())?;
        infgram::service::files::write_file(path, Accept::Streams, |out| {
            out.write_all(page.as_bytes())
                .map_err(|e| infgram::Error::io(path, e))
        })?;
    }
    let mut out = std::io::stdout().lock();
    if args.input.json {
        let v = json!({
            "spans": spans,
            "token_ids": ids,
            "latency": seconds * 1e3,
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    let colour = std::io::stdout().is_terminal();
    writeln!(out, "{}", highlighted(&spans, &ids, tok.as_ref(), colour)?)?;
    writeln!(
        out,
        "\n{} spans of at least {} tokens ({} tokens examined in {:.2} ms)",
        spans.len(),
        min_len,
        ids.len(),
        seconds * 1e3
    )?;
    for sp in &spans {
        writeln!(
            out,
            "\n[{}, {}) {} tokens, {} occurrences: {:?}",
            sp.l, sp.r, sp.length, sp.count, sp.text
        )?;
        for d in &sp.docs {
            let (snippet, d) = (&d.text, &d.document);
            let meta = if d.metadata.is_empty() || d.metadata == "{}" {
                String::new()
            } else {
                format!(" {}", d.metadata)
            };
            writeln!(out, "  doc {}{meta}: {:?}", d.doc_ix, snippet)?;
        }
    }
    Ok(())
}

/// The longest attributed span covering each token (0: none).
fn coverage(spans: &[SpanAnswer], n: usize) -> Vec<usize> {
    let mut cover = vec![0; n];
    for sp in spans {
        for c in &mut cover[sp.l..sp.r] {
            *c = (*c).max(sp.length);
        }
    }
    cover
}

/// Shade of a covered token, by the length of its longest span relative to the shortest
/// reported one: 1 (short), 2 (twice as long), 3 (four times).
fn shade(len: usize, min_len: usize) -> usize {
    match len {
        0 => 0,
        l if l >= 4 * min_len => 3,
        l if l >= 2 * min_len => 2,
        _ => 1,
    }
}

/// Runs of tokens with the same shade, as `(shade, text)`.
fn shaded_runs(
    spans: &[SpanAnswer],
    ids: &[u32],
    tok: &dyn Tokenizer,
) -> Result<Vec<(usize, String)>> {
    let min_len = spans.iter().map(|s| s.length).min().unwrap_or(1);
    let cover = coverage(spans, ids.len());
    let mut runs: Vec<(usize, Vec<u32>)> = Vec::new();
    for (&id, &len) in ids.iter().zip(&cover) {
        let s = shade(len, min_len);
        match runs.last_mut() {
            Some((last, toks)) if *last == s => toks.push(id),
            _ => runs.push((s, vec![id])),
        }
    }
    runs.into_iter()
        .map(|(s, toks)| Ok((s, tok.decode(&toks)?)))
        .collect()
}

/// The text with its copied spans coloured (yellow, orange, red as they grow), or bracketed
/// `[[…]]` without a terminal.
fn highlighted(
    spans: &[SpanAnswer],
    ids: &[u32],
    tok: &dyn Tokenizer,
    colour: bool,
) -> Result<String> {
    let mut s = String::new();
    for (shade, text) in shaded_runs(spans, ids, tok)? {
        match (shade, colour) {
            (0, _) => s.push_str(&text),
            (k, true) => {
                let bg = [0, 228, 214, 203][k];
                s.push_str(&format!("\x1b[48;5;{bg}m\x1b[30m{text}\x1b[0m"));
            }
            (_, false) => s.push_str(&format!("[[{text}]]")),
        }
    }
    Ok(s)
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A self-contained page: the text with highlighted spans, then each span with its documents.
fn html_page(spans: &[SpanAnswer], ids: &[u32], tok: &dyn Tokenizer) -> Result<String> {
    let mut body = String::new();
    for (shade, text) in shaded_runs(spans, ids, tok)? {
        let text = escape_html(&text);
        if shade == 0 {
            body.push_str(&text);
        } else {
            body.push_str(&format!("<mark class=\"s{shade}\">{text}</mark>"));
        }
    }
    let mut list = String::new();
    for sp in spans {
        list.push_str(&format!(
            "<li><p><mark class=\"s1\">{}</mark> <small>tokens {}–{}, {} long, {} occurrences</small></p><ul>",
            escape_html(&tok.decode(&ids[sp.l..sp.r])?),
            sp.l,
            sp.r,
            sp.length,
            sp.count
        ));
        for d in sp.docs.iter().map(|d| &d.document) {
            let before = tok.decode(&d.token_ids[..d.needle_offset])?;
            let hit_end = (d.needle_offset + sp.length).min(d.token_ids.len());
            let hit = tok.decode(&d.token_ids[d.needle_offset..hit_end])?;
            let after = tok.decode(&d.token_ids[hit_end..])?;
            list.push_str(&format!(
                "<li><small>doc {} {}</small><pre>{}<mark class=\"s1\">{}</mark>{}</pre></li>",
                d.doc_ix,
                escape_html(&d.metadata),
                escape_html(&before),
                escape_html(&hit),
                escape_html(&after)
            ));
        }
        list.push_str("</ul></li>");
    }
    Ok(format!(
        "<!doctype html><meta charset=\"utf-8\"><title>infgram attribution</title>\
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}\
.text{{white-space:pre-wrap;font-family:serif;font-size:1.1em;line-height:1.5}}\
pre{{white-space:pre-wrap;background:#f6f6f6;padding:.5em}}\
.s1{{background:#fff3a0}}.s2{{background:#ffc070}}.s3{{background:#ff8a80}}</style>\
<h1>Spans copied from the corpus</h1><p>{} spans; darker marks are longer spans.</p>\
<div class=\"text\">{body}</div><h2>Spans and their documents</h2><ol>{list}</ol>",
        spans.len()
    ))
}

/// Arguments of `infgram creativity`.
#[derive(Args, Debug)]
pub struct CreativityArgs {
    #[command(flatten)]
    pub input: TextArgs,
    /// Shortest span length scored (Lu et al.: 5 words) [default: 5].
    #[arg(long)]
    pub min_n: Option<usize>,
    /// Longest span length scored (Lu et al.: 12 words) [default: 12].
    #[arg(long)]
    pub max_n: Option<usize>,
}

/// Runs `infgram creativity`.
pub fn run_creativity(args: CreativityArgs) -> Result<()> {
    let Loaded { index, tok, ids } = args.input.load()?;
    let query = Query::creativity(ids, args.min_n, args.max_n);
    let c = creativity_of(&index, tok.as_ref(), &query)
        .map_err(|e| e.rename_field(&[("min_n", "--min-n"), ("max_n", "--max-n")]))?;
    let (min_n, max_n) = match (c.uniqueness.first(), c.uniqueness.last()) {
        (Some(&(lo, _)), Some(&(hi, _))) => (lo, hi),
        _ => (0, 0),
    };
    let mut out = std::io::stdout().lock();
    if args.input.json {
        writeln!(out, "{}", serde_json::to_value(&c)?)?;
        return Ok(());
    }
    writeln!(out, "{:>4}  {:>10}", "n", "uniqueness")?;
    for (n, u) in &c.uniqueness {
        writeln!(out, "{n:>4}  {u:>10.4}")?;
    }
    writeln!(
        out,
        "creativity index {:.4} (sum over n = {}..={}); {} tokens, longest copied span {}",
        c.creativity_index, min_n, max_n, c.tokens, c.max_span
    )?;
    Ok(())
}
