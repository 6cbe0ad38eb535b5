//! An index written by `infgram index` read by `infgram query` in other processes; damaged
//! indexes, wrong tokenizers and shard directories outside an index refused.

use super::*;

#[test]
fn index_then_query_in_other_processes() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let v = json(&infgram(&[
        "query", idx, "count", "--text", "cat", "--json",
    ]));
    assert_eq!(v["count"], 3);
    let v = json(&infgram(&["query", idx, "count", "--text", "", "--json"]));
    // Every position, one separator per document included (infini-gram's count([])).
    assert_eq!(v["count"], 22 + 22 + 11 + 5 + 4);
    let v = json(&infgram(&[
        "query",
        idx,
        "prob",
        "--text",
        "the ca",
        "--cont-text",
        "t",
        "--json",
    ]));
    assert_eq!(
        (v["prompt_cnt"].as_u64(), v["cont_cnt"].as_u64()),
        (Some(2), Some(2))
    );
    let v = json(&infgram(&[
        "query",
        idx,
        "ntd",
        "--text",
        "sat on the ",
        "--json",
    ]));
    assert_eq!(v["prompt_cnt"], 2);
    assert_eq!(
        v["result_by_token_id"][(b'm' as u32).to_string()]["cont_cnt"],
        1
    );
    let v = json(&infgram(&[
        "query",
        idx,
        "infgram_ntd",
        "--text",
        "xyz the d",
        "--json",
    ]));
    assert_eq!(v["suffix_len"], 5);
    let v = json(&infgram(&["query", idx, "find", "--text", "at", "--json"]));
    assert_eq!(v["cnt"], 7); // cat ×3, sat ×2, mat, ate
    let v = json(&infgram(&[
        "query",
        idx,
        "search_docs",
        "--cnf",
        "cat AND sat",
        "--json",
    ]));
    assert_eq!(v["documents"].as_array().unwrap().len(), 1);
    assert!(v["documents"][0]["metadata"]
        .as_str()
        .unwrap()
        .contains("a.txt"));
    // Metadata of jsonl documents keeps the other fields.
    let v = json(&infgram(&[
        "query",
        idx,
        "search_docs",
        "--cnf",
        "a cat",
        "--json",
    ]));
    assert!(v["documents"][0]["metadata"]
        .as_str()
        .unwrap()
        .contains("gz"));
    // A file given itself is named by its file name, never by an absolute path of this
    // machine (a server shows metadata to its clients).
    let single = tmp.path().join("single");
    let a = tmp.path().join("corpus").join("a.txt");
    ok(&infgram(&[
        "index",
        "-o",
        single.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    let v = json(&infgram(&[
        "query",
        single.to_str().unwrap(),
        "get_doc_by_rank",
        "--rank",
        "0",
        "--json",
    ]));
    assert_eq!(v["metadata"], "{\"path\":\"a.txt\"}", "{v}");
    // A readable table without --json.
    let table = ok(&infgram(&["query", idx, "ntd", "--text", "the "]));
    assert!(table.contains("\"c\"") && table.contains("prompt_cnt"));
    // Batch: one result per line, a bad line gets an error object and the batch goes on.
    let batch = tmp.path().join("q.jsonl");
    std::fs::write(
        &batch,
        "{\"query_type\": \"count\", \"input_ids\": [116, 104, 101]}\n\
         not json\n\
         {\"query_type\": \"prob\", \"prompt_ids\": [116, 104], \"cont_id\": 101}\n\
         {\"query_type\": \"count\", \"input_ids\": [999]}\n\
         {\"query_type\": \"infgram_ntd\", \"text\": \"the c\"}\n",
    )
    .unwrap();
    let out = ok(&infgram(&[
        "query",
        idx,
        "--batch",
        batch.to_str().unwrap(),
    ]));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["count"], 5);
    assert!(lines[1]["error"].is_string());
    assert_eq!(lines[2]["prob"], 1.0);
    assert!(lines[3]["error"].as_str().unwrap().contains("vocabulary"));
    assert_eq!(lines[4]["suffix_len"], 5);
    // Stdin works too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["query", idx, "--batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"query_type\": \"count\", \"text\": \"sat\"}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "{\"approx\":false,\"count\":2}"
    );
    ok(&infgram(&["verify", idx]));
}

#[test]
fn damaged_indexes_are_detected() {
    let tmp = tempfile::tempdir().unwrap();
    let good = build(tmp.path());
    let case = |name: &str, damage: &dyn Fn(&Path), expect: &str| {
        let dir = tmp.path().join(name);
        copy_dir(&good, &dir);
        damage(&dir);
        let e = err(&infgram(&[
            "query",
            dir.to_str().unwrap(),
            "count",
            "--text",
            "cat",
        ]));
        assert!(e.contains(expect), "{name}: {e}");
    };
    let shard = |d: &Path| d.join("shard-0000");
    case(
        "truncated",
        &|d| {
            let f = shard(d).join("sa.bin");
            let len = std::fs::metadata(&f).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&f)
                .unwrap()
                .set_len(len - 3)
                .unwrap();
        },
        "sa.bin",
    );
    case(
        "flipped",
        &|d| {
            let f = shard(d).join("docs.bin");
            let mut b = std::fs::read(&f).unwrap();
            b[9] ^= 0x40;
            std::fs::write(&f, b).unwrap();
        },
        "checksum",
    );
    case(
        "version",
        &|d| {
            let f = d.join("index.json");
            let s = std::fs::read_to_string(&f)
                .unwrap()
                .replace("\"format_version\": 1", "\"format_version\": 99");
            std::fs::write(&f, s).unwrap();
        },
        "version 99",
    );
    case(
        "header",
        &|d| {
            let f = d.join("index.json");
            let s = std::fs::read_to_string(&f).unwrap().replacen(
                "\"documents\": 4",
                "\"documents\": 5",
                1,
            );
            std::fs::write(&f, s).unwrap();
        },
        "checksum",
    );
    case(
        "missing-shard",
        &|d| std::fs::remove_dir_all(shard(d)).unwrap(),
        "shard-0000",
    );
    case(
        "missing-header",
        &|d| std::fs::remove_file(d.join("index.json")).unwrap(),
        "index.json",
    );
    // verify catches damage to a large file that opening does not read.
    let e = err(&infgram(&[
        "query",
        tmp.path().join("nope").to_str().unwrap(),
        "count",
        "--text",
        "x",
    ]));
    assert!(e.contains("infgram index"), "{e}");
}

#[test]
fn wrong_tokenizer_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    // A tiny word-level tokenizer.json: a different tokenizer from `bytes`.
    let tj = word_level_tokenizer(tmp.path());
    let e = err(&infgram(&[
        "query",
        index.to_str().unwrap(),
        "count",
        "--text",
        "cat",
        "--tokenizer",
        tj.to_str().unwrap(),
    ]));
    assert!(e.contains("tokenizer") && e.contains("rebuild"), "{e}");
    // ... while an index built with it answers with it.
    let corpus = tmp.path().join("w.txt");
    std::fs::write(&corpus, "the cat the cat the").unwrap();
    let widx = tmp.path().join("widx");
    ok(&infgram(&[
        "index",
        "-o",
        widx.to_str().unwrap(),
        "--tokenizer",
        tj.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]));
    let v = json(&infgram(&[
        "query",
        widx.to_str().unwrap(),
        "count",
        "--text",
        "the cat",
        "--json",
    ]));
    assert_eq!(v["count"], 2);
}

#[test]
fn sharded_mmap_index_agrees_with_in_memory_index() {
    use infgram::tokenizer::{ByteTokenizer, Tokenizer};
    let tmp = tempfile::tempdir().unwrap();
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    // ~240k bytes in 12 files: a tiny --mem budget forces several shards (≥ 64k tokens each).
    let mut docs = Vec::new();
    let mut x: u64 = 12345;
    for f in 0..12 {
        let text: String = (0..20_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ["the ", "cat ", "sat ", "on ", "a ", "mat\n"][(x >> 33) as usize % 6]
            })
            .collect::<String>()[..20_000]
            .to_string();
        std::fs::write(corpus.join(format!("{f:02}.txt")), &text).unwrap();
        docs.push(ByteTokenizer.encode(&text).unwrap());
    }
    let dir = tmp.path().join("idx");
    ok(&infgram(&[
        "index",
        "-o",
        dir.to_str().unwrap(),
        "--mem",
        "0.000001",
        corpus.to_str().unwrap(),
    ]));
    let mapped = infgram::Index::open(&dir).unwrap();
    assert!(
        mapped.shards().len() >= 3,
        "{} shards",
        mapped.shards().len()
    );
    let memory = infgram::Index::from_docs(ByteTokenizer.spec(), &docs, docs.len(), true).unwrap();
    let text = std::fs::read_to_string(corpus.join("03.txt")).unwrap();
    for start in (0..19_000).step_by(997) {
        for len in [1usize, 3, 8, 30, 120] {
            let q = ByteTokenizer.encode(&text[start..start + len]).unwrap();
            assert_eq!(mapped.count(&q).unwrap(), memory.count(&q).unwrap());
            assert_eq!(
                mapped.ntd(&q, Some(0)).unwrap(),
                memory.ntd(&q, Some(0)).unwrap()
            );
            assert_eq!(
                mapped.infgram_ntd(&q, Some(0)).unwrap(),
                memory.infgram_ntd(&q, Some(0)).unwrap()
            );
            assert_eq!(
                mapped.longest_match(&q).unwrap(),
                memory.longest_match(&q).unwrap()
            );
        }
    }
}

/// A damaged index in the `gen --corpus` cache is rebuilt, with a note, instead of an error
/// that asks the user to rebuild a cache path.
#[test]
fn a_damaged_cached_index_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let corpus = tmp.path().join("c.txt");
    std::fs::write(&corpus, "the cat sat on the mat. ".repeat(20)).unwrap();
    let gen = || {
        Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(["gen", "--corpus", corpus.to_str().unwrap()])
            .args([
                "--prompt",
                "the",
                "--seed",
                "1",
                "--max-tokens",
                "20",
                "--json",
            ])
            .env("INFGRAM_CACHE", &cache)
            .output()
            .unwrap()
    };
    let first = json(&gen());
    let indexes: Vec<PathBuf> = std::fs::read_dir(cache.join("indexes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(indexes.len(), 1, "{indexes:?}");
    let tokens = indexes[0].join("shard-0000/tokens.bin");
    let mut bytes = std::fs::read(&tokens).unwrap();
    bytes[3] ^= 0x20;
    std::fs::write(&tokens, bytes).unwrap();
    let out = gen();
    let note = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(note.contains("rebuilding"), "{note}");
    assert_eq!(json(&out)["text"], first["text"]);
    // The header gone (a build cut short long ago): rebuilt as well.
    std::fs::remove_file(indexes[0].join("index.json")).unwrap();
    assert_eq!(json(&gen())["text"], first["text"]);
}

/// A header whose shard directory points out of the index is refused as corrupt, not followed,
/// even with a valid checksum.
#[test]
fn a_shard_directory_outside_the_index_is_refused() {
    use infgram::index::format::Header;
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    // A copy of the shard outside the index, where a rewritten header could send the reader.
    copy_dir(&index.join("shard-0000"), &tmp.path().join("elsewhere"));
    let original = std::fs::read(index.join("index.json")).unwrap();
    for bad in ["../elsewhere", "/etc", "", "./shard-0000/.."] {
        let mut header = Header::read(&index).unwrap();
        header.shards[0].dir = bad.to_string();
        header.seal();
        header.write(&index).unwrap();
        let e = err(&infgram(&[
            "query",
            index.to_str().unwrap(),
            "count",
            "--text",
            "cat",
        ]));
        assert!(e.contains("not a name inside the index"), "{bad:?}: {e}");
    }
    std::fs::write(index.join("index.json"), &original).unwrap();
    ok(&infgram(&[
        "query",
        index.to_str().unwrap(),
        "count",
        "--text",
        "cat",
    ]));
}
