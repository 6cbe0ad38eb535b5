//! The inputs kept from fuzzing (`fuzz/regressions/TARGET/*`: crashes found and fixed, and a
//! minimized corpus), replayed through the same functions the fuzz targets run. Each must
//! return without panicking.

use std::path::Path;

/// Runs `target` on every file of `fuzz/regressions/NAME`; returns how many there were.
fn replay(name: &str, target: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(name);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| target(&data));
        assert!(outcome.is_ok(), "{} panics", path.display());
        n += 1;
    }
    n
}

/// A fuzz target: its name and the function it runs.
type Target = (&'static str, fn(&[u8]));

#[test]
fn kept_fuzz_inputs_do_not_panic() {
    use infgram::fuzz_targets::*;
    let targets: &[Target] = &[
        ("query_line", query_line),
        ("cnf", cnf),
        ("corpus_file", corpus_file),
        ("damaged_index", damaged_index),
        ("index_dir", index_dir),
        #[cfg(feature = "server")]
        ("router", router),
        #[cfg(feature = "neural")]
        ("gguf", gguf),
    ];
    for &(name, target) in targets {
        assert!(replay(name, target) > 0, "no inputs kept for {name}");
    }
}
