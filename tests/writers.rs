//! Every command that writes a file, walked with its output set to what a careless or hostile
//! user can name: a symbolic link, a FIFO, a character device, an existing directory, an
//! existing user file, a file inside an index, and a planted temporary name (the names
//! infgram once wrote to, `.NAME.tmp-PID` and `NAME.tmp-PID`, as links to a victim). After
//! each run, byte for byte, nothing outside the output changed: not the victim, not the index,
//! not `/dev/null` (still a character device), not the links (still links).

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `infgram ARGS`, through bash so that names planted with the process's own PID exist when
/// it starts (`plant`: link `.OUT.tmp-PID` and `OUT.tmp-PID` beside the output to `victim`).
fn infgram(args: &[String], plant: Option<(&Path, &Path)>) -> Output {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let mut script = String::new();
    if let Some((out, victim)) = plant {
        let dir = out.parent().unwrap().display();
        let name = out.file_name().unwrap().to_string_lossy();
        let v = victim.display();
        script +=
            &format!("ln -s '{v}' '{dir}/.{name}.tmp-'$$ && ln -s '{v}' '{dir}/{name}.tmp-'$$ && ");
    }
    script += &format!(
        "exec '{}' {}",
        env!("CARGO_BIN_EXE_infgram"),
        quoted.join(" ")
    );
    Command::new("bash")
        .args(["-c", &script])
        .env(
            "INFGRAM_CACHE",
            std::env::temp_dir().join("infgram-test-cache"),
        )
        .env("INFGRAM_MODELS", infgram::assets::models_dir())
        .output()
        .expect("run infgram")
}

/// What is under `dir`: each entry's kind, a link's target, a file's bytes (links not
/// followed).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut seen = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let kind = e.file_type().unwrap();
            let what = if kind.is_symlink() {
                format!("link to {}", std::fs::read_link(&p).unwrap().display())
            } else if kind.is_dir() {
                stack.push(p.clone());
                "dir".into()
            } else if kind.is_fifo() {
                "fifo".into()
            } else if kind.is_char_device() {
                "character device".into()
            } else {
                format!("{:?}", std::fs::read(&p).unwrap())
            };
            seen.insert(p, what);
        }
    }
    seen
}

/// A writer's arguments with its output at the path given.
type Args = Box<dyn Fn(&Path) -> Vec<String>>;

/// One writer: its name and its arguments.
struct Writer {
    name: &'static str,
    args: Args,
    /// Whether it writes a stream into `-`, a FIFO or a device (else it refuses them).
    streams: bool,
    /// Whether it writes a directory (an index) rather than a file.
    directory: bool,
    /// Whether it replaces an existing user file (a past-outputs file refuses one).
    replaces_user_files: bool,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The writers of `infgram`, over the inputs in `root`; those of a neural model only when it
/// is built in.
fn writers(root: &Path) -> Vec<Writer> {
    let p = |n: &str| root.join(n).display().to_string();
    let (words, bytes, text) = (p("words"), p("bytes"), p("text.txt"));
    let mut all = vec![
        Writer {
            name: "export-arpa",
            args: Box::new(move |out| {
                s(&[
                    "export-arpa",
                    "--index",
                    &words,
                    "--order",
                    "2",
                    "--discount-fallback",
                    "-o",
                    &out.display().to_string(),
                ])
            }),
            streams: true,
            directory: false,
            replaces_user_files: true,
        },
        Writer {
            name: "attribute --html",
            args: Box::new({
                let (bytes, text) = (bytes.clone(), text.clone());
                move |out| {
                    s(&[
                        "attribute",
                        "--index",
                        &bytes,
                        "--text",
                        &text,
                        "--min-len",
                        "3",
                        "--html",
                        &out.display().to_string(),
                    ])
                }
            }),
            streams: true,
            directory: false,
            replaces_user_files: true,
        },
        Writer {
            name: "index",
            args: Box::new({
                let text = text.clone();
                move |out| s(&["index", "-o", &out.display().to_string(), &text])
            }),
            streams: false,
            directory: true,
            replaces_user_files: false,
        },
    ];
    if cfg!(feature = "plot") {
        let (bytes, text) = (bytes.clone(), text.clone());
        all.push(Writer {
            name: "ppl --plot",
            args: Box::new(move |out| {
                s(&[
                    "ppl",
                    "--index",
                    &bytes,
                    "--text",
                    &text,
                    "--floor",
                    "1e-10",
                    "--plot",
                    &out.display().to_string(),
                ])
            }),
            streams: false,
            directory: false,
            replaces_user_files: true,
        });
    }
    if cfg!(feature = "neural") {
        all.extend(model_writers(root, &text));
    }
    all
}

/// The writers of a neural model's subcommands (`text`: the inputs' text file).
fn model_writers(root: &Path, text: &str) -> Vec<Writer> {
    let p = |n: &str| root.join(n).display().to_string();
    let mut all = Vec::new();
    let model = [
        "--model",
        "smollm2-135m",
        "--threads",
        "1",
        "--temperature",
        "0",
    ];
    let gen = move |more: &[&str]| {
        let mut v = s(&["gen"]);
        v.extend(s(&model));
        v.extend(s(&[
            "--prompt",
            "Say hi",
            "--max-tokens",
            "3",
            "--speculative",
        ]));
        v.extend(s(more));
        v
    };
    all.push(Writer {
        name: "gen --trace",
        args: Box::new(move |out| gen(&["--trace", &out.display().to_string()])),
        streams: true,
        directory: false,
        replaces_user_files: true,
    });
    let (tokens, text) = (p("tokens"), text.to_string());
    all.push(Writer {
        name: "mix fit -o",
        args: Box::new(move |out| {
            let o = out.display().to_string();
            s(&[
                "mix",
                "fit",
                "--model",
                "smollm2-135m",
                "--index",
                &tokens,
                "--text",
                &text,
                "--window",
                "64",
                "--stride",
                "32",
                "-o",
                &o,
            ])
        }),
        streams: false,
        directory: false,
        replaces_user_files: true,
    });
    all.push(Writer {
        name: "export-tokenizer",
        args: Box::new(move |out| {
            s(&[
                "export-tokenizer",
                "smollm2-135m",
                "-o",
                &out.display().to_string(),
            ])
        }),
        streams: false,
        directory: false,
        replaces_user_files: true,
    });
    all.push(Writer {
        name: "gen --past-outputs",
        args: Box::new(move |out| gen(&["--past-outputs", &out.display().to_string()])),
        streams: false,
        directory: false,
        replaces_user_files: false,
    });

    all
}

/// The kinds of output path, each set up in `root` before a run: (name, the output path).
fn outputs(root: &Path, victim: &Path) -> Vec<(&'static str, PathBuf)> {
    let link = root.join("link.out");
    std::os::unix::fs::symlink(victim, &link).unwrap();
    let fifo = root.join("fifo.out");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let dir = root.join("dir.out");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("inside.txt"), "the user's").unwrap();
    // A character device of the test's own where it may make one (as root), so that a
    // regression cannot replace the machine's /dev/null; else /dev/null, which a user who is
    // not root cannot replace.
    let device = root.join("null.out");
    let d = std::ffi::CString::new(device.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; (1, 3) is the null device.
    let made = unsafe { libc::mknod(d.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0;
    let device = if made {
        device
    } else {
        PathBuf::from("/dev/null")
    };
    let user = root.join("user.out");
    std::fs::write(&user, "the user's own file\n").unwrap();
    vec![
        ("a symbolic link", link),
        ("a FIFO", fifo),
        ("a character device", device),
        ("an existing directory", dir),
        ("an existing user file", user),
        ("a file inside an index", root.join("bytes/index.json")),
        ("a new file inside an index", root.join("bytes/new.out")),
        ("a planted temporary name", root.join("planted.out")),
    ]
}

/// Drains `fifo` on a thread (a stream writer blocks on it until a reader comes); returns
/// what joins it, opening the FIFO for writing first in case nobody did.
fn drain(fifo: PathBuf) -> impl FnOnce() {
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).unwrap_or_default())
    };
    move || {
        if !reader.is_finished() {
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        reader.join().unwrap();
    }
}

#[test]
fn no_writer_changes_anything_outside_its_output() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let text = root.join("text.txt");
    std::fs::write(
        &text,
        "the cat sat on the mat. the dog sat on the log. the cat ran.\n",
    )
    .unwrap();
    let t = text.to_str().unwrap();
    let mut indexes = vec![("words", "words"), ("bytes", "bytes")];
    if cfg!(feature = "neural") {
        indexes.push(("tokens", "smollm2-135m"));
    }
    for (dir, tokenizer) in indexes {
        let out = infgram(
            &s(&[
                "index",
                "--tokenizer",
                tokenizer,
                "-o",
                root.join(dir).to_str().unwrap(),
                t,
            ]),
            None,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let victim = root.join("victim.txt");
    std::fs::write(&victim, "the victim's bytes\n").unwrap();
    let cases = outputs(&root, &victim);
    for writer in writers(&root) {
        for (kind, out) in &cases {
            let plant =
                (*kind == "a planted temporary name").then_some((out.as_path(), victim.as_path()));
            let before = snapshot(&root);
            let joined = (*kind == "a FIFO").then(|| drain(out.clone()));
            let run = infgram(&(writer.args)(out), plant);
            if let Some(join) = joined {
                join();
            }
            let e = String::from_utf8_lossy(&run.stderr);
            assert!(!e.contains("panicked"), "{} into {kind}: {e}", writer.name);
            let wrote = run.status.success();
            let expected = match *kind {
                "a symbolic link" | "an existing directory" => false,
                "a file inside an index" | "a new file inside an index" => false,
                "a FIFO" | "a character device" => writer.streams,
                "an existing user file" => writer.replaces_user_files,
                _ => true,
            };
            assert_eq!(wrote, expected, "{} into {kind}: {e}", writer.name);
            if !wrote {
                assert!(e.contains("error: "), "{} into {kind}: {e}", writer.name);
            }
            // Nothing but the output (and, for a planted name, the links the shell planted)
            // changed; the output is a regular file or directory where one was written.
            let after = snapshot(&root);
            let planted = |p: &Path| p.file_name().unwrap().to_string_lossy().contains(".tmp-");
            let outside = |m: &BTreeMap<PathBuf, String>| -> BTreeMap<PathBuf, String> {
                m.iter()
                    .filter(|(p, _)| !p.starts_with(out) && !planted(p))
                    .map(|(p, v)| (p.clone(), v.clone()))
                    .collect()
            };
            assert_eq!(
                outside(&after),
                outside(&before),
                "{} into {kind}",
                writer.name
            );
            for (p, what) in &after {
                if planted(p) && !before.contains_key(p) {
                    assert_eq!(
                        what,
                        &format!("link to {}", victim.display()),
                        "{}",
                        writer.name
                    );
                    std::fs::remove_file(p).unwrap();
                }
            }
            let meta = std::fs::symlink_metadata(out);
            match *kind {
                "a character device" => assert!(meta.unwrap().file_type().is_char_device()),
                "a FIFO" => assert!(meta.unwrap().file_type().is_fifo()),
                "a symbolic link" => assert!(meta.unwrap().file_type().is_symlink()),
                _ if wrote => {
                    let kind_ok = if writer.directory {
                        meta.unwrap().is_dir()
                    } else {
                        meta.unwrap().is_file()
                    };
                    assert!(kind_ok, "{} into {kind}", writer.name);
                }
                _ => {}
            }
            // A new output goes, so the next writer starts from the same paths.
            if wrote && matches!(*kind, "a planted temporary name") {
                if writer.directory {
                    std::fs::remove_dir_all(out).unwrap();
                } else {
                    std::fs::remove_file(out).unwrap();
                }
            }
            if *kind == "an existing user file" && wrote {
                std::fs::write(out, "the user's own file\n").unwrap();
            }
        }
    }
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "the victim's bytes\n"
    );
}
