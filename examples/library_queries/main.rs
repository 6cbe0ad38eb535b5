//! Library use, part 1: index a corpus and run every query type.
//!
//! Builds a byte-level index of Tiny Shakespeare's training split in memory (as
//! `infgram index` would on disk; `Index::open(dir)` memory-maps one), then asks each query of
//! the infini-gram protocol twice: through the typed methods of [`Index`], and as the JSON
//! query a batch line, an HTTP request or Python would send ([`Query`], [`execute`]).
//!
//! `cargo run --release --example library_queries`

use infgram::index::shards::Shards;
use infgram::service::query::{execute, Query};
use infgram::tokenizer::{ByteTokenizer, Tokenizer};
use infgram::Index;

fn main() -> infgram::Result<()> {
    let (train, _val) = infgram::assets::tiny_shakespeare_split()?;
    let tok = ByteTokenizer;
    let docs = vec![tok.encode(&train)?];
    // One shard, with the reversed suffix array (fast ∞-gram and SBIS queries).
    let index = Index::from_docs(tok.spec(), &docs, 1, true)?;
    println!("{} tokens indexed\n", index.total_tokens());

    // Typed calls: token ids in, result structs out.
    let ids = tok.encode("wherefore art thou")?;
    println!("count {:?}", index.count(&ids)?.count);
    let prompt = tok.encode("my lor")?;
    let d = tok.encode("d")?[0];
    println!("prob(d | my lor) = {:.4}", index.prob(&prompt, d)?.prob);
    let ntd = index.infgram_ntd(&tok.encode("O Romeo, Romeo! wherefore art thou R")?, None)?;
    println!(
        "∞-gram: longest matching suffix {} tokens, {} next tokens",
        ntd.suffix_len.unwrap_or(0),
        ntd.result_by_token_id.len()
    );

    // The same protocol as JSON: what `infgram query --batch`, the server and Python speak.
    for line in [
        r#"{"query_type": "count", "text": "my lord"}"#,
        r#"{"query_type": "prob", "text": "my lor", "cont_text": "d"}"#,
        r#"{"query_type": "ntd", "text": "ROME"}"#,
        r#"{"query_type": "infgram_prob", "text": "To be, or not to b", "cont_text": "e"}"#,
        r#"{"query_type": "infgram_ntd", "text": "xyzzy. To be, or not to b"}"#,
        r#"{"query_type": "find", "text": "Juliet"}"#,
        r#"{"query_type": "search_docs", "text": "gentle Romeo", "maxnum": 1, "max_disp_len": 40}"#,
        r#"{"query_type": "longest_match", "text": "sweet sorrow"}"#,
        r#"{"query_type": "get_doc_by_rank", "s": 0, "rank": 12345, "max_disp_len": 30}"#,
        r#"{"query_type": "get_doc_by_ptr", "s": 0, "ptr": 1000, "max_disp_len": 30}"#,
        r#"{"query_type": "count", "input_ids": [999]}"#,
    ] {
        let answer = Query::from_json(line).and_then(|q| execute(&index, &tok, &q));
        match answer {
            Ok(v) => {
                let mut s = v.to_value().to_string();
                if s.len() > 160 {
                    let cut = (0..=160)
                        .rev()
                        .find(|&c| s.is_char_boundary(c))
                        .unwrap_or(0);
                    s.truncate(cut);
                    s.push('…');
                }
                println!("{line}\n  → {s}");
            }
            // Bad queries are errors that say what is wrong, never panics.
            Err(e) => println!("{line}\n  → error: {e}"),
        }
    }
    Ok(())
}
