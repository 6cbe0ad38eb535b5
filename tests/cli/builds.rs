//! Builds: a failed or interrupted build leaves nothing behind, `--force` replaces only
//! indexes, a user's files are never removed, inputs that are not files are named, `--mem`
//! bounds one large document.

use super::*;

#[test]
fn failed_builds_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\n{\"no_text\": 1}\n").unwrap();
    let out = tmp.path().join("idx");
    let e = err(&infgram(&[
        "index",
        "-o",
        out.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]));
    assert!(e.contains("bad.jsonl:2") && e.contains("text"), "{e}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "only the input remains: {left:?}");
    // An existing index is not overwritten without --force.
    let good = tmp.path().join("good.txt");
    std::fs::write(&good, "hello").unwrap();
    ok(&infgram(&[
        "index",
        "-o",
        out.to_str().unwrap(),
        good.to_str().unwrap(),
    ]));
    let e = err(&infgram(&[
        "index",
        "-o",
        out.to_str().unwrap(),
        good.to_str().unwrap(),
    ]));
    assert!(e.contains("--force"), "{e}");
    let e = err(&infgram(&[
        "index",
        "-o",
        tmp.path().join("x").to_str().unwrap(),
        "/nonexistent/file.txt",
    ]));
    assert!(e.contains("no such file"), "{e}");
}

/// `--force` never destroys what is not an index, never an input, and swaps a rebuilt index in
/// whole: queries running during rebuilds see the old index or the new one, never a hole.
#[test]
fn force_replaces_only_indexes_and_readers_never_see_a_hole() {
    let tmp = tempfile::tempdir().unwrap();
    let index = build(tmp.path());
    let idx = index.to_str().unwrap();
    let corpus = tmp.path().join("corpus");
    let c = corpus.to_str().unwrap();
    // A directory of the user's files, and the input itself, are refused.
    let e = err(&infgram(&["index", "-o", c, "--force", c]));
    assert!(e.contains("not an infgram index"), "{e}");
    assert!(corpus.join("a.txt").exists());
    // Rebuild four times while another thread queries (bounded in count).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let idx = idx.to_string();
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            for _ in 0..400 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let out = infgram(&["query", &idx, "count", "--text", "cat", "--json"]);
                if !out.status.success() {
                    failures.push(String::from_utf8_lossy(&out.stderr).into_owned());
                }
            }
            failures
        })
    };
    for _ in 0..4 {
        ok(&infgram(&["index", "-o", idx, "--force", c]));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures = reader.join().unwrap();
    assert!(failures.is_empty(), "{failures:?}");
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-") || n.contains(".old-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Inputs that are neither files nor directories are named for what they are: a FIFO or a
/// device, a loop of symbolic links, a missing path.
#[cfg(unix)]
#[test]
fn inputs_that_are_not_files_are_named_for_what_they_are() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path in our temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let a = tmp.path().join("loop-a");
    let b = tmp.path().join("loop-b");
    std::os::unix::fs::symlink(&a, &b).unwrap();
    std::os::unix::fs::symlink(&b, &a).unwrap();
    let out = tmp.path().join("idx");
    for (input, says) in [
        (fifo.to_str().unwrap(), "FIFO, device or socket"),
        ("/dev/null", "FIFO, device or socket"),
        (a.to_str().unwrap(), "loop of symbolic links"),
        (tmp.path().join("nothing").to_str().unwrap(), "no such file"),
    ] {
        let e = err(&infgram(&["index", "-o", out.to_str().unwrap(), input]));
        assert!(e.contains(says), "{input}: {e}");
        assert!(!out.exists());
    }
}

/// No build removes a path outside its output and its own temporary directory: not with
/// `--force` onto a directory whose `index.json` is not infgram's (also as `-o "$PWD"`), not a
/// user's `OUT.old-2023` beside the output (not even when it is the build's input), and not a
/// look-alike of a build's temporary after a build was killed with SIGKILL.
#[test]
fn builds_never_remove_a_users_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let text = "the cat sat on the mat and the dog sat on the log";
    let a = root.join("a.txt");
    std::fs::write(&a, text).unwrap();
    forced_builds_remove_nothing_of_a_users(&root, &a);

    // 2. A user's `data.old-2023` beside `-o data`, given as the input, and a directory named
    // like a dead build's temporary: both survive, and so do they after a killed build.
    let s = root.join("s");
    std::fs::create_dir_all(s.join("data.old-2023")).unwrap();
    std::fs::write(s.join("data.old-2023/tiny.txt"), text).unwrap();
    std::fs::create_dir_all(s.join("data.tmp-4294967")).unwrap();
    std::fs::write(s.join("data.tmp-4294967/draft.txt"), "draft").unwrap();
    let users = snapshot(&s);
    let data = s.join("data");
    let input = s.join("data.old-2023");
    ok(&infgram(&[
        "index",
        "-o",
        data.to_str().unwrap(),
        input.to_str().unwrap(),
    ]));
    ok(&infgram(&[
        "index",
        "--force",
        "-o",
        data.to_str().unwrap(),
        input.to_str().unwrap(),
    ]));
    let after = snapshot(&s);
    for (path, bytes) in &users {
        assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
    }
    // The other commands that write (an HTML page, the cache's corpus and index, a fetched
    // text) write their own files and remove nothing of the user's.
    let cache = root.join("cache");
    let before = snapshot(&s);
    let page = s.join("page.html");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args(args)
            .env("INFGRAM_CACHE", &cache)
            .env("INFGRAM_MODELS", infgram::assets::models_dir())
            .output()
            .unwrap();
        ok(&out);
    };
    let tiny = s.join("data.old-2023/tiny.txt");
    let (d, t) = (data.to_str().unwrap(), tiny.to_str().unwrap());
    run(&[
        "attribute",
        "--index",
        d,
        "--text",
        t,
        "--html",
        page.to_str().unwrap(),
    ]);
    run(&["gen", "--corpus", t, "--prompt", "the", "--max-tokens", "5"]);
    run(&["fetch", "tiny-shakespeare"]);
    let after = snapshot(&s);
    for (path, bytes) in &before {
        assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
    }
    assert!(page.exists());
    // A build killed outright leaves its marked temporary; the next build removes exactly that.
    #[cfg(unix)]
    {
        let big = root.join("big.txt");
        std::fs::write(&big, text.repeat(200_000)).unwrap();
        let data2 = s.join("data2");
        let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args([
                "index",
                "-o",
                data2.to_str().unwrap(),
                big.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let left = s.join(format!("data2.tmp-{}", child.id()));
        for _ in 0..2000 {
            if left.join(".infgram-build.json").exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if !data2.exists() {
            assert!(left.exists(), "the killed build left no temporary");
            ok(&infgram(&[
                "index",
                "-o",
                data2.to_str().unwrap(),
                a.to_str().unwrap(),
            ]));
            assert!(!left.exists(), "a dead build's temporary was kept");
        }
        let after = snapshot(&s);
        for (path, bytes) in &users {
            assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
        }
    }
}

/// `--force -o u` where u holds a user's notes and a foreign index.json, as the output and
/// as the working directory; `--force` onto a link to an index; an index holding a user's file
/// (`a`: a text to index, in `root`).
fn forced_builds_remove_nothing_of_a_users(root: &Path, a: &Path) {
    let u = root.join("u");
    std::fs::create_dir(&u).unwrap();
    std::fs::write(u.join("notes.txt"), "precious").unwrap();
    std::fs::write(u.join("index.json"), "{}").unwrap();
    // `index --force -o OUT a.txt`, which must fail: its error.
    let force = |out: &Path| {
        err(&infgram(&[
            "index",
            "--force",
            "-o",
            out.to_str().unwrap(),
            a.to_str().unwrap(),
        ]))
    };
    let before = snapshot(root);
    let e = force(&u);
    assert!(e.contains("not an infgram index"), "{e}");
    // The same with the working directory as the output.
    let out = Command::new(env!("CARGO_BIN_EXE_infgram"))
        .args(["index", "--force", "-o", u.to_str().unwrap(), "../a.txt"])
        .current_dir(&u)
        .output()
        .unwrap();
    assert!(err(&out).contains("not an infgram index"));
    assert_eq!(snapshot(root), before, "a failed --force changed files");
    // `--force -o LINK`, LINK a link to an index, replaced the link by a new
    // directory and left the index stale. Refused; both left as they were.
    let linked = root.join("linked");
    ok(&infgram(&[
        "index",
        "-o",
        linked.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    std::os::unix::fs::symlink(&linked, root.join("link")).unwrap();
    let before = snapshot(root);
    let e = force(&root.join("link"));
    assert!(e.contains("symbolic link"), "{e}");
    assert_eq!(snapshot(root), before, "--force onto a link changed files");
    // A real index holding a user's file is not replaced either.
    let idx = root.join("idx");
    ok(&infgram(&[
        "index",
        "-o",
        idx.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    std::fs::write(idx.join("my-notes.txt"), "mine").unwrap();
    let e = err(&infgram(&[
        "index",
        "--force",
        "-o",
        idx.to_str().unwrap(),
        a.to_str().unwrap(),
    ]));
    assert!(e.contains("my-notes.txt"), "{e}");
    assert!(idx.join("my-notes.txt").exists());
    std::fs::remove_file(idx.join("my-notes.txt")).unwrap();
}

/// SIGINT or SIGTERM during a build removes its temporary directory, and the process ends with
/// the shell's status for the signal.
#[cfg(unix)]
#[test]
fn interrupted_builds_leave_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    // Enough text that the build is still running when the signal comes (it takes seconds).
    let corpus = tmp.path().join("big.txt");
    let mut x = 1u64;
    let text: Vec<u8> = (0..8_000_000)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            b"abcdefgh ijklmnop\n"[(x >> 59) as usize % 18]
        })
        .collect();
    std::fs::write(&corpus, text).unwrap();
    for (signal, status) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let out = tmp.path().join(format!("idx{signal}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_infgram"))
            .args([
                "index",
                "-o",
                out.to_str().unwrap(),
                corpus.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let tmp_dir = tmp.path().join(format!("idx{signal}.tmp-{}", child.id()));
        let mut started = false;
        for _ in 0..2000 {
            if tmp_dir.exists() {
                started = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(started, "the build did not start");
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let code = child.wait().unwrap().code();
        assert_eq!(code, Some(status), "signal {signal}");
        assert!(!tmp_dir.exists(), "{} left behind", tmp_dir.display());
        assert!(!out.exists());
    }
}

/// Symbolic links in an input directory are followed (loops, links to themselves and broken
/// links are skipped with a warning), and a `.txt` file that is not UTF-8 is indexed with a warning that counts the bytes.
#[cfg(unix)]
#[test]
fn symlinks_are_followed_and_lossy_text_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("linked.txt"), "zebra crossing").unwrap();
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir_all(corpus.join("sub")).unwrap();
    std::fs::write(corpus.join("plain.txt"), "plain text").unwrap();
    std::fs::write(corpus.join("binary.txt"), b"ok \xff\xfe\x80 ok").unwrap();
    std::os::unix::fs::symlink(outside.join("linked.txt"), corpus.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(&corpus, corpus.join("sub/loop")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("nowhere"), corpus.join("broken.txt")).unwrap();
    std::os::unix::fs::symlink(corpus.join("self.txt"), corpus.join("self.txt")).unwrap();
    let idx = tmp.path().join("idx");
    let out = infgram(&[
        "index",
        "-o",
        idx.to_str().unwrap(),
        corpus.to_str().unwrap(),
    ]);
    ok(&out);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("binary.txt: 3 bytes are not UTF-8"), "{e}");
    assert!(e.contains("skipping") && e.contains("loop"), "{e}");
    assert!(e.contains("broken.txt"), "{e}");
    assert!(e.contains("skipping") && e.contains("self.txt"), "{e}");
    let count = json(&infgram(&[
        "query",
        idx.to_str().unwrap(),
        "count",
        "--text",
        "zebra",
        "--json",
    ]));
    assert_eq!(count["count"], 1, "the linked file is indexed once");
}

/// `index --mem` bounds a build whatever its documents: a text file larger than a tenth of the
/// budget is refused before anything is read or written (the 300 MB file here is sparse:
/// reading it would hold 300 MB); so is a JSON line as long, once reached, without holding it;
/// and a document whose tokens outgrow a shard of the budget is refused once tokenized. Each
/// error says what to do, and leaves no output.
#[test]
fn index_mem_bounds_one_large_document() {
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big.txt");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(300_000_000)
        .unwrap();
    let out = tmp.path().join("out.idx");
    let o = out.to_str().unwrap();
    let started = std::time::Instant::now();
    let e = err(&infgram(&[
        "index",
        "--mem",
        "0.5",
        "-o",
        o,
        big.to_str().unwrap(),
    ]));
    assert!(
        e.contains("big.txt") && e.contains("300 MB") && e.contains("--mem to at least 3.0 GB"),
        "{e}"
    );
    eprintln!("refused in {:?}", started.elapsed());
    assert!(!out.exists());
    // A JSON line of 200 kB with a budget of 1 MB (documents up to 100 kB).
    let lines = tmp.path().join("lines.jsonl");
    let long = format!("{{\"text\": \"{}\"}}", "ab ".repeat(70_000));
    std::fs::write(&lines, format!("{{\"text\": \"short\"}}\n{long}\n")).unwrap();
    let e = err(&infgram(&[
        "index",
        "--mem",
        "0.001",
        "-o",
        o,
        lines.to_str().unwrap(),
    ]));
    assert!(
        e.contains("lines.jsonl:2") && e.contains("raise --mem"),
        "{e}"
    );
    assert!(!out.exists());
    // 90 kB of text is read within 1 MB, but its 90,000 byte tokens outgrow a shard of
    // 71,428 tokens (1 MB at 14 bytes a token).
    let mid = tmp.path().join("mid.txt");
    std::fs::write(&mid, "the cat sat ".repeat(7_500)).unwrap();
    let e = err(&infgram(&[
        "index",
        "--mem",
        "0.001",
        "-o",
        o,
        mid.to_str().unwrap(),
    ]));
    assert!(
        e.contains("90000 tokens") && e.contains("mid.txt") && e.contains("raise --mem"),
        "{e}"
    );
    assert!(!out.exists());
    // The same text within 2 MB is indexed.
    ok(&infgram(&[
        "index",
        "--mem",
        "0.002",
        "-o",
        o,
        mid.to_str().unwrap(),
    ]));
}
