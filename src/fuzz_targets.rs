//! What the fuzz targets under `fuzz/` run (cargo fuzz, libFuzzer), shared with
//! `tests/fuzz_regressions.rs`, which replays the kept inputs under `cargo test`. Each takes
//! arbitrary bytes and must return without panicking, whatever they are: these are the readers
//! of untrusted input (a query line or HTTP body, a CNF, a corpus file, the bytes of an index).

use crate::index::build::{ShardBytes, ShardWriter};
use crate::index::shards::Shards;
use crate::index::Index;
use crate::service::query::{execute, parse_cnf, Query};
use crate::tokenizer::{ByteTokenizer, Tokenizer};
use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;

/// Three small documents, byte-level: what the query targets ask.
fn documents() -> Vec<Vec<u32>> {
    [
        "the cat sat on the mat",
        "the dog sat on a log",
        "a cat and a dog",
    ]
    .iter()
    .map(|d| d.bytes().map(u32::from).collect())
    .collect()
}

/// The index the query targets ask, built once.
fn small_index() -> &'static Index<Vec<u8>> {
    static INDEX: OnceLock<Index<Vec<u8>>> = OnceLock::new();
    INDEX.get_or_init(|| {
        Index::from_docs(ByteTokenizer.spec(), &documents(), 2, true).expect("a small index")
    })
}

/// A query line (`infgram query --batch`), and the same bytes as an HTTP API body: parsed,
/// and executed when they parse.
pub fn query_line(data: &[u8]) {
    let index = small_index();
    if let Ok(line) = std::str::from_utf8(data) {
        if let Ok(q) = Query::from_json(line) {
            let _ = execute(index, &ByteTokenizer, &q);
        }
    }
    let limits = crate::service::query::QueryLimits::SERVED;
    if let Ok(request) = crate::service::api::read_request(data, &limits) {
        if let Ok((q, _)) = request.to_query(&ByteTokenizer, &limits) {
            let _ = execute(index, &ByteTokenizer, &q);
        }
    }
}

/// A CNF as the command line takes it (`a b OR c AND d`, or JSON ids): parsed, then counted
/// and searched with bounds from the first bytes.
pub fn cnf(data: &[u8]) {
    let Some((&bound, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(cnf) = parse_cnf(text, &ByteTokenizer) else {
        return;
    };
    let q = Query::SearchDocs {
        subject: Default::default(),
        cnf: Some(cnf.clone()),
        maxnum: bound as usize % 4,
        max_diff_tokens: usize::MAX >> (bound % 64),
        max_clause_freq: 1 + bound as usize,
        max_disp_len: bound as usize,
    };
    let _ = execute(small_index(), &ByteTokenizer, &q);
    let count = Query::Count {
        subject: Default::default(),
        cnf: Some(cnf),
        max_diff_tokens: bound as usize,
        max_clause_freq: 1 + bound as usize,
    };
    let _ = execute(small_index(), &ByteTokenizer, &count);
}

/// A corpus file: the first byte picks plain, gzip or zstd JSON lines, the rest is the file.
pub fn corpus_file(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let path = Path::new("fuzz.jsonl");
    let reader: Box<dyn Read + '_> = match kind % 3 {
        0 => Box::new(rest),
        1 => Box::new(flate2::read::MultiGzDecoder::new(rest)),
        _ => match zstd::Decoder::new(rest) {
            Ok(d) => Box::new(d),
            Err(_) => return,
        },
    };
    // Bounded: a tiny compressed input may expand a lot.
    let mut budget = 1usize << 24;
    let _ = crate::corpus::for_each_jsonl_doc(reader.take(1 << 24), path, |doc, _| {
        budget = budget.saturating_sub(doc.text.len());
        if budget == 0 {
            return Err(crate::error::Error::input("enough"));
        }
        Ok(())
    });
}

/// The shards of the index the damaged-index target starts from.
fn pristine_shards() -> &'static Vec<ShardBytes> {
    static SHARDS: OnceLock<Vec<ShardBytes>> = OnceLock::new();
    SHARDS.get_or_init(|| {
        documents()
            .chunks(2)
            .map(|chunk| {
                let mut w = ShardWriter::new(1);
                for d in chunk {
                    w.push(d, "{\"i\": 1}").expect("a document");
                }
                w.finish(256, true).expect("a shard")
            })
            .collect()
    })
}

/// A damaged index: each 4 bytes of `data` flip one byte of its token, suffix-array, sample or
/// document-offset files (`data[0]` picks the file, `data[1..3]` the offset, `data[3]` the
/// XOR), as damage a large file's sampled checks can miss; then every query runs over it.
pub fn damaged_index(data: &[u8]) {
    let mut shards = pristine_shards().clone();
    for edit in data.chunks_exact(4) {
        let shard = &mut shards[edit[0] as usize % 2];
        let file: &mut Vec<u8> = match (edit[0] / 2) % 5 {
            0 => &mut shard.tokens,
            1 => &mut shard.sa,
            2 => shard.rsa.as_mut().expect("built with rsa"),
            3 => &mut shard.sample,
            _ => &mut shard.docs,
        };
        if !file.is_empty() {
            let at = u16::from_le_bytes([edit[1], edit[2]]) as usize % file.len();
            file[at] ^= edit[3];
        }
    }
    let index = Index::from_shards(ByteTokenizer.spec(), 1, shards);
    let q: Vec<u32> = data.iter().take(6).map(|&b| u32::from(b % 128)).collect();
    every_query(&index, &q, &[0, 3, 17]);
}

/// Runs every query type on `q` over `index`, and fetches the documents at `ranks` (as
/// suffix-array ranks and as positions) in every shard, ignoring the answers: over a damaged
/// index, each must return (an answer or an error) without panicking.
pub fn every_query<S: AsRef<[u8]> + Sync>(index: &Index<S>, q: &[u32], ranks: &[usize]) {
    let _ = index.count(q);
    let _ = index.ntd(q, Some(0));
    let _ = index.infgram_ntd(q, None);
    let _ = index.infgram_prob(q, 97);
    let _ = index.find(q);
    let _ = index.longest_match(q);
    if !q.is_empty() {
        let _ = index.search_docs(&[vec![q.to_vec()]], 3, 10, 100, 20);
    }
    for s in 0..index.shards().len() {
        for &rank in ranks {
            let _ = index.get_doc_by_rank(s, rank, 2, 20);
            let _ = index.get_doc_by_ptr(s, rank, 2, 20);
        }
    }
}

/// A GGUF file through the checked reader, the tokenizer rebuilt from it, and the model's
/// description and loading (the metadata the loaders read: counts, widths, ε, rotary bases)
/// with both backends (feature `neural`).
#[cfg(feature = "neural")]
pub fn gguf(data: &[u8]) {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    // The loaders read a path: the input goes into this process's own directory.
    let path = DIR.get_or_init(|| scratch_dir("gguf")).join("fuzz.gguf");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = crate::neural::native::decoder::Decoder::load(&path, None);
    let _ = crate::neural::candle::decoder::CandleDecoder::load(&path, None);
    let mut file = std::fs::File::open(&path).expect("just written");
    if let Ok(content) = crate::gguf::read(&mut file, &path) {
        let path = Path::new("fuzz.gguf");
        if let Ok(json) = crate::tokenizer::gguf::tokenizer_json_of(&content, path) {
            if let Ok(tok) = crate::tokenizer::HfTokenizer::from_json_str(&json, "gguf", path) {
                if let Ok(ids) = tok.encode("Hello, world! 123") {
                    let _ = tok.decode(&ids);
                }
            }
        }
    }
}

/// A new directory in the system's temporary directory for one fuzzing process (created
/// exclusively under a random name: nothing that was there is followed or removed).
fn scratch_dir(name: &str) -> std::path::PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("infgram-fuzz-{name}-"))
        .tempdir()
        .expect("a scratch directory")
        .keep()
}

/// An index directory's files: (path relative to the directory, bytes).
type DirFiles = Vec<(String, Vec<u8>)>;

/// The files of a small index in both layouts: infgram's (`index.json` and a shard
/// directory) and infini-gram's (`tokenized.0`, `table.0`, `offset.0`, ...), as (relative path,
/// bytes), written once by infgram's own builder and converter.
fn pristine_dirs() -> &'static [DirFiles; 2] {
    static DIRS: OnceLock<[DirFiles; 2]> = OnceLock::new();
    DIRS.get_or_init(|| {
        let dir = scratch_dir("pristine");
        let corpus = dir.join("c.jsonl");
        let lines: String = documents()
            .iter()
            .map(|d| {
                let text: String = d.iter().map(|&b| b as u8 as char).collect();
                format!("{{\"text\": {text:?}}}\n")
            })
            .collect();
        std::fs::write(&corpus, lines).expect("a corpus");
        let out = dir.join("infgram");
        let opts = crate::index::pipeline::BuildOptions {
            progress: false,
            ..Default::default()
        };
        crate::index::pipeline::build_index(&[corpus], &out, &ByteTokenizer, &opts)
            .expect("a small index");
        let infgram = files_under(&out);
        let infini = infini_gram_files(&documents());
        let _ = std::fs::remove_dir_all(&dir);
        [infgram, infini]
    })
}

/// Every file under `dir`, as (path relative to `dir`, bytes).
fn files_under(dir: &Path) -> DirFiles {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.expect("a readable entry");
        if entry.file_type().is_file() {
            let rel = entry.path().strip_prefix(dir).expect("inside");
            let bytes = std::fs::read(entry.path()).expect("readable");
            out.push((rel.display().to_string(), bytes));
        }
    }
    out
}

/// `docs` in infini-gram's layout, byte tokens, one shard: every document after a separator
/// byte, byte pointers sorted by the tokens' bytes.
fn infini_gram_files(docs: &[Vec<u32>]) -> DirFiles {
    let (mut tokens, mut offsets, mut meta, mut metaoff) = (vec![], vec![], vec![], vec![]);
    for d in docs {
        offsets.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
        tokens.push(0xFF);
        tokens.extend(d.iter().map(|&t| t as u8));
        metaoff.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        meta.extend_from_slice(b"{}\n");
    }
    let mut sa: Vec<usize> = (0..tokens.len()).collect();
    sa.sort_by(|&a, &b| tokens[a..].cmp(&tokens[b..]));
    let width = crate::index::infini_gram::pointer_bytes(tokens.len() as u64);
    let table: Vec<u8> = sa
        .iter()
        .flat_map(|&p| (p as u64).to_le_bytes()[..width].to_vec())
        .collect();
    vec![
        ("tokenized.0".into(), tokens),
        ("table.0".into(), table),
        ("offset.0".into(), offsets),
        ("metadata.0".into(), meta),
        ("metaoff.0".into(), metaoff),
    ]
}

/// A whole index directory read by [`Index::open`], either layout: `data[0]` picks the layout;
/// in infgram's, the rest of `data` after a length byte replaces `index.json` (the header a
/// fuzzer learns to write); then each 4 bytes edit one file (`[file, at, at, op]`: flip a byte,
/// or cut the file short). Whatever opens is queried with every query type. Nothing may panic.
pub fn index_dir(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let layout = usize::from(pick % 2);
    let mut files = pristine_dirs()[layout].clone();
    let mut edits = rest;
    if layout == 0 {
        if let Some((&len, tail)) = rest.split_first() {
            let len = (len as usize * 4).min(tail.len());
            if len > 0 {
                if let Some(f) = files.iter_mut().find(|f| f.0 == "index.json") {
                    f.1 = tail[..len].to_vec();
                }
            }
            edits = &tail[len..];
        }
    }
    for edit in edits.chunks_exact(4) {
        let n = files.len();
        let file = &mut files[edit[0] as usize % n].1;
        if file.is_empty() {
            continue;
        }
        let at = u16::from_le_bytes([edit[1], edit[2]]) as usize % file.len();
        match edit[3] {
            0 => file.truncate(at),
            x => file[at] ^= x,
        }
    }
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| scratch_dir("index"));
    let _ = std::fs::remove_dir_all(dir);
    for (rel, bytes) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::write(path, bytes);
    }
    if let Ok(index) = Index::open(dir) {
        let q: Vec<u32> = data
            .iter()
            .rev()
            .take(6)
            .map(|&b| u32::from(b % 128))
            .collect();
        every_query(&index, &q, &[0, 3, 17]);
    }
}

/// An HTTP request to the server's routes, end to end (feature `server`): `data[0]` picks the
/// method and path, the rest is the body; the answer is read whole. The server holds a small
/// index, generates within tight limits, and must answer every request without panicking.
#[cfg(feature = "server")]
pub fn router(data: &[u8]) {
    use crate::server::{router_for, Limits, ServerConfig};
    struct App {
        runtime: tokio::runtime::Runtime,
        router: axum::Router,
    }
    static APP: OnceLock<App> = OnceLock::new();
    let app = APP.get_or_init(|| {
        let dir = scratch_dir("router");
        let files = &pristine_dirs()[0];
        for (rel, bytes) in files {
            let path = dir.join("idx").join(rel);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
            std::fs::write(path, bytes).expect("written");
        }
        let config = ServerConfig {
            addr: ([127, 0, 0, 1], 0).into(),
            indexes: vec![("small".into(), dir.join("idx"))],
            tokenizers: Vec::new(),
            model: None,
            model_options: Default::default(),
            limits: Limits {
                max_tokens: 16,
                generation_time: std::time::Duration::from_millis(50),
                ..Limits::default()
            },
            log_requests: false,
            past_outputs_file: None,
            corpus_rule: Default::default(),
            allowed_hosts: Vec::new(),
        };
        App {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
            router: router_for(&config).expect("a router"),
        }
    });
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (method, path) = [
        ("POST", "/"),
        ("POST", "/v1/completions"),
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("GET", "/"),
        ("POST", "/nowhere"),
        ("PUT", "/v1/completions"),
    ][pick as usize % 8];
    let Ok(request) = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
    else {
        return;
    };
    app.runtime.block_on(async {
        let Ok(response) = tower::ServiceExt::oneshot(app.router.clone(), request).await;
        let _ = axum::body::to_bytes(response.into_body(), 1 << 24).await;
    });
}
