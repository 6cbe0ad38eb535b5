//! `service` is the waist: the front ends (the CLI, the HTTP server, the Python module) name the
//! library through `infgram::service` and its error type only, so the library's rooms below it
//! can move without a front end changing. Read from the sources: every `infgram::ROOM` path of
//! `src/cli/` and `python/src/`, and every `crate::ROOM` path of `src/server/`.

use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The rooms `prefix` paths name in `text` (`infgram::service::run` names `service`), with the
/// line of each.
fn rooms_named(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + prefix.len()..];
            // `my_infgram::x` or `$crate::x` is another path.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let first = |path: &str| -> String {
                path.trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            match rest.strip_prefix('{') {
                // `infgram::{Error, service::Index}`: each path of the group (on one line).
                Some(group) => {
                    let group = group.split('}').next().unwrap_or_default();
                    for path in group.split(',').filter(|p| !p.trim().is_empty()) {
                        out.push((n + 1, first(path)));
                    }
                }
                None => out.push((n + 1, first(rest))),
            }
        }
    }
    out
}

/// Every path of the front end in `dir` that names a room other than `allowed`.
fn strays(dir: &str, prefix: &str, allowed: &[&str], also: &[(&str, &str)]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = sources(&root.join(dir));
    assert!(!files.is_empty(), "no sources under {dir}");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (line, room) in rooms_named(&text, prefix) {
            let excepted = also.iter().any(|(f, r)| name.ends_with(f) && room == *r);
            if !allowed.contains(&room.as_str()) && !excepted {
                out.push(format!("{name}:{line}: {prefix}{room}"));
            }
        }
    }
    out
}

/// The error type, its `Result`, and `diag!` (the diagnostics that never panic), besides
/// `service`.
const ALLOWED: &[&str] = &["service", "Error", "Result", "diag"];

#[test]
fn the_command_line_names_only_the_service() {
    // `infgram serve` starts the HTTP server, another front end, beside the service.
    let strays = strays(
        "src/cli",
        "infgram::",
        ALLOWED,
        &[("src/cli/serve.rs", "server")],
    );
    assert!(strays.is_empty(), "{}", strays.join("\n"));
}

#[test]
fn the_python_module_names_only_the_service() {
    let strays = strays("python/src", "infgram::", ALLOWED, &[]);
    assert!(strays.is_empty(), "{}", strays.join("\n"));
}

#[test]
fn the_http_server_names_only_the_service() {
    let strays = strays(
        "src/server",
        "crate::",
        &["service", "Error", "Result", "error", "server", "diag"],
        &[],
    );
    assert!(strays.is_empty(), "{}", strays.join("\n"));
}

/// The check itself finds a stray path, and passes over a longer name that ends like one.
#[test]
fn a_stray_path_is_found() {
    let text = "use infgram::service::Index;\nlet x = infgram::index::Index::open(d);\n\
                let y = my_infgram::index::z; // $crate::index\n\
                use infgram::{Error, mix::Mixer};\n";
    let rooms = rooms_named(text, "infgram::");
    let named = |n: usize, room: &str| (n, room.to_string());
    assert_eq!(
        rooms,
        vec![
            named(1, "service"),
            named(2, "index"),
            named(4, "Error"),
            named(4, "mix")
        ]
    );
    assert_eq!(rooms_named(text, "crate::"), vec![]);
}

/// The speculative drafter set is the service's default
/// (`request::defaults::SPECULATIVE_DRAFTERS`); no front end writes a list of its own, and the
/// sampling and draft defaults are named, not written again as numbers.
#[test]
fn front_ends_name_the_services_defaults_and_write_none() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let written = [
        "DrafterSpec::PromptLookup",
        "DrafterSpec::PastOutputs",
        "DrafterSpec::Corpus",
        "temperature: 0.8",
        "draft_max: 16",
    ];
    let mut found = Vec::new();
    for dir in ["src/cli", "src/server", "python/src"] {
        for file in sources(&root.join(dir)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if let Some(w) = written.iter().find(|w| code.contains(*w)) {
                    let name = file.strip_prefix(root).unwrap().display();
                    found.push(format!("{name}:{}: {w}", i + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The library's own defaults are the decode layer's, named once.
    let request = std::fs::read_to_string(root.join("src/service/request.rs")).unwrap();
    for named in ["sampler::DEFAULT_TEMPERATURE", "decode::DEFAULT_DRAFT_MAX"] {
        assert!(
            request.contains(named),
            "request::defaults does not name {named}"
        );
    }
}
