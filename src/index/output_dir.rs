//! Where a build writes: a temporary directory beside the output, renamed into place when the
//! index is whole, and the rules that keep a user's files safe.
//!
//! A build writes into `OUT.tmp-PID` (or `OUT.tmp-PID-K` when that name is taken) and renames
//! it to `OUT` only when every file and the header are written; a failure removes it. infgram
//! removes nothing it did not create:
//! - every directory it creates beside `OUT` holds a marker ([`MARKER_FILE`]: its role, the
//!   PID of the build and the absolute output it belongs to); a later build removes a sibling
//!   only when that marker names the same output and a process that no longer runs, and the
//!   directory holds nothing but index files. A user's `corpus.old-2023` has no marker and is
//!   never touched, whatever its name;
//! - `--force` replaces `OUT` only when its `index.json` is an infgram header (magic, version)
//!   and every entry in it is a file infgram writes into an index; anything else is refused
//!   with the entry named.

use crate::error::{Error, Result};
use crate::index::format::{HEADER_FILE, MAGIC};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Name of the marker file in a directory that a build created beside its output.
pub const MARKER_FILE: &str = ".infgram-build.json";

/// The name a build marker is written under before it is renamed to [`MARKER_FILE`].
const MARKER_PART: &str = ".infgram-build.json.part";

/// The files of one shard directory, as [`write_shard`](super::build::write_shard) writes them.
const SHARD_FILES: [&str; 7] = [
    "tokens.bin",
    "sa.bin",
    "rsa.bin",
    "sample.bin",
    "docs.bin",
    "meta.jsonl",
    "meta_offsets.bin",
];

/// What a build writes into each directory it creates beside its output.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Marker {
    /// `"tmp"` (being built) or `"old"` (an index being replaced).
    role: String,
    /// The process of the build.
    pid: u32,
    /// The absolute output directory the build belongs to.
    out: PathBuf,
}

impl Marker {
    fn write(dir: &Path, role: &str, out: &Path) -> Result<()> {
        let marker = Marker {
            role: role.into(),
            pid: std::process::id(),
            out: out.to_path_buf(),
        };
        let path = dir.join(MARKER_FILE);
        let text = serde_json::to_string(&marker).expect("marker serializes");
        // Written under another name and renamed, so that the marker is whole or absent: a
        // build killed between creating the file and writing it left an empty marker, and
        // with it a directory no later build could prove was a build's (kept for ever). Not
        // `output_file::write_bytes`: this runs while `unfinished()` is held (see
        // `TempIndexDir::create`), which that writer takes too; the directory is this
        // build's own, just created, so a fixed name created exclusively is enough.
        let part = dir.join(MARKER_PART);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&part)
            .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
            .and_then(|()| std::fs::rename(&part, &path))
            .map_err(|e| Error::io(&path, e))
    }

    /// The marker of `dir`, if it holds a readable one.
    fn read(dir: &Path) -> Option<Marker> {
        let text = std::fs::read(dir.join(MARKER_FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

/// A directory being built: removed on drop unless [`TempIndexDir::commit`] renamed it.
pub struct TempIndexDir {
    tmp: PathBuf,
    /// The output as given.
    out: PathBuf,
    /// The output as an absolute path (its parent resolved), as markers name it.
    out_abs: PathBuf,
    overwrite: bool,
    done: bool,
}

/// The temporary directories of this process's builds and the temporary files of its writes
/// ([`crate::output_file`]) in progress: what [`remove_unfinished`] removes when the process
/// is told to stop.
static UNFINISHED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// The list of unfinished builds and writes (a panic elsewhere while it was held leaves it
/// usable). Hold it while the temporary comes to be, so a signal's clean-up waits for it.
pub(crate) fn unfinished() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    UNFINISHED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the temporary directories of this process's builds and the temporary files of its
/// writes in progress: for a signal handler (SIGINT, SIGTERM) to call before the process
/// exits, so an interrupted build or write leaves nothing behind. (A build killed outright,
/// SIGKILL, is cleaned up by the next build beside it.)
pub fn remove_unfinished() {
    for dir in unfinished().drain(..) {
        if !dir.is_dir() {
            let _ = std::fs::remove_file(&dir);
            continue;
        }
        // The build's threads may still be writing into it: try again if a file appeared
        // while it was being emptied.
        for _ in 0..5 {
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                break;
            }
        }
    }
}

/// Whether `name` is a shard directory's name (`shard-` and digits).
fn is_shard_dir_name(name: &str) -> bool {
    name.strip_prefix("shard-")
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

/// The first entry of `dir` that infgram does not write into an index directory (anything but
/// the header, a build marker, a word vocabulary, and `shard-N` directories holding shard
/// files), as a path; a
/// symbolic link is never one of infgram's.
fn foreign_entry(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type()?;
        let ours = if kind.is_file() {
            name == HEADER_FILE
                || name == MARKER_FILE
                || name == crate::tokenizer::words::VOCAB_FILE
        } else if kind.is_dir() && is_shard_dir_name(&name) {
            match foreign_shard_entry(&entry.path())? {
                Some(inner) => return Ok(Some(inner)),
                None => true,
            }
        } else {
            false
        };
        if !ours {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// The first entry of a shard directory that is not a shard file.
fn foreign_shard_entry(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !entry.file_type()?.is_file() || !SHARD_FILES.iter().any(|f| name == *f) {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// Why `dir` may not be replaced by `--force`: it must be an infgram index (its header has
/// infgram's magic and a format version) holding nothing but index files, and the directory
/// itself, not a link to one (replacing the link would leave the index it names stale).
fn not_replaceable(dir: &Path) -> Option<String> {
    if dir
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        let target =
            std::fs::read_link(dir).map_or_else(|_| "?".into(), |t| t.display().to_string());
        return Some(format!(
            "{} is a symbolic link (to {target}), not an index directory: give -o the index's \
             own path",
            dir.display()
        ));
    }
    let is_header = infgram_header(dir, u64::MAX)
        .is_some_and(|v| v.get("format_version").is_some_and(|n| n.is_u64()));
    if !is_header {
        return Some(format!(
            "{} exists and is not an infgram index ({} is missing or is not an infgram header)",
            dir.display(),
            HEADER_FILE
        ));
    }
    match foreign_entry(dir) {
        Ok(None) => None,
        Ok(Some(entry)) => Some(format!(
            "{} holds {}, which infgram did not write: move it out of the index first",
            dir.display(),
            entry.display()
        )),
        Err(e) => Some(format!("{} cannot be listed ({e})", dir.display())),
    }
}

/// Refuses to replace `out` unless it is an index of infgram's files only, and never when an
/// input lies inside it.
fn check_replaceable(out: &Path, inputs: &[PathBuf]) -> Result<()> {
    if let Some(why) = not_replaceable(out) {
        return Err(Error::input(format!(
            "{why}; --force replaces only an infgram index: choose another -o or remove it \
             yourself"
        )));
    }
    let out_abs = out.canonicalize().map_err(|e| Error::io(out, e))?;
    for input in inputs {
        if input
            .canonicalize()
            .is_ok_and(|i| i.starts_with(&out_abs) || out_abs.starts_with(&i))
        {
            return Err(Error::input(format!(
                "{} holds the input {} (or lies inside it): it will not be replaced",
                out.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Refuses `dest` when `parent` (its directory) or a directory above it is an index
/// (infgram's: an `index.json` with infgram's magic; infini-gram's: `tokenized.0` and
/// `table.0`).
pub fn refuse_inside_index(dest: &Path, parent: &Path) -> Result<()> {
    let Ok(parent) = parent.canonicalize() else {
        return Ok(());
    };
    for dir in parent.ancestors() {
        if is_index_dir(dir) {
            return Err(Error::input(format!(
                "{} lies inside the index {}: writing there would damage it; choose a path \
                 outside the index",
                dest.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Whether `dir` is an index directory of either layout.
pub fn is_index_dir(dir: &Path) -> bool {
    // A directory above the output is not ours to read whole: its first 1 MiB.
    crate::index::infini_gram::is_infini_gram_dir(dir) || infgram_header(dir, 1 << 20).is_some()
}

/// `dir/index.json` (its first `limit` bytes) as JSON when it has infgram's magic: what
/// tells an infgram index (the full check is [`super::format::Header::read`]).
fn infgram_header(dir: &Path, limit: u64) -> Option<serde_json::Value> {
    use std::io::Read;
    let file = std::fs::File::open(dir.join(HEADER_FILE)).ok()?;
    let mut text = Vec::new();
    file.take(limit).read_to_end(&mut text).ok()?;
    serde_json::from_slice::<serde_json::Value>(&text)
        .ok()
        .filter(|v| v.get("magic").and_then(|m| m.as_str()) == Some(MAGIC))
}

/// Whether process `pid` is alive (on Linux; elsewhere every process counts as alive).
fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Removes the directories beside `out_abs` that dead builds of the same output left: those
/// named `NAME.tmp-…` or `NAME.old-…` whose marker names `out_abs` and a process that no
/// longer runs, and that hold nothing but index files. Nothing else is touched.
fn remove_stale(parent: &Path, name: &str, out_abs: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let tagged = [".tmp-", ".old-"]
            .iter()
            .any(|tag| file.strip_prefix(name).is_some_and(|r| r.starts_with(tag)));
        if !tagged || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = e.path();
        let Some(marker) = Marker::read(&dir) else {
            continue;
        };
        let dead = marker.pid != std::process::id() && !process_alive(marker.pid);
        if marker.out == out_abs && dead && holds_only_ours(&dir, &marker.role) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Whether a marked directory holds only what a build puts there: index files (`tmp`), or the
/// marker and the replaced index moved into `index` (`old`).
fn holds_only_ours(dir: &Path, role: &str) -> bool {
    match role {
        "tmp" => matches!(foreign_entry(dir), Ok(None)),
        "old" => std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().all(|e| {
                let kind = e.file_type().ok();
                (e.file_name() == MARKER_FILE && kind.is_some_and(|k| k.is_file()))
                    || (e.file_name() == "index"
                        && kind.is_some_and(|k| k.is_dir())
                        && matches!(foreign_entry(&e.path()), Ok(None)))
            })
        }),
        _ => false,
    }
}

/// Distinguishes the temporary directories of builds of one output within one process.
static NEXT_SIBLING: AtomicU32 = AtomicU32::new(0);

/// Creates a new directory `OUT.TAG-PID` beside `out` (`OUT.TAG-PID-K` when that name is
/// taken: an existing entry is never reused or removed) and writes its marker.
fn create_sibling(out: &Path, out_abs: &Path, tag: &str) -> Result<PathBuf> {
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let pid = std::process::id();
    loop {
        let k = NEXT_SIBLING.fetch_add(1, Ordering::Relaxed);
        let dir = match k {
            0 => out.with_file_name(format!("{name}.{tag}-{pid}")),
            k => out.with_file_name(format!("{name}.{tag}-{pid}-{k}")),
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                if let Err(e) = Marker::write(&dir, tag, out_abs) {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&dir, e)),
        }
    }
}

/// Swaps two directory entries atomically (Linux `renameat2(RENAME_EXCHANGE)`); `false` where
/// the system cannot.
fn exchange(a: &Path, b: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let (Ok(a), Ok(b)) = (
            std::ffi::CString::new(a.as_os_str().as_bytes()),
            std::ffi::CString::new(b.as_os_str().as_bytes()),
        ) else {
            return false;
        };
        // SAFETY: both paths are valid NUL-terminated strings for the duration of the call.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        r == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        false
    }
}

impl TempIndexDir {
    /// Creates the temporary directory beside `out` (removing those that dead builds of the
    /// same output left). Fails if `out` exists, unless `overwrite` and `out` is an infgram
    /// index of infgram's files only that holds none of `inputs`.
    pub fn create(out: &Path, overwrite: bool, inputs: &[PathBuf]) -> Result<Self> {
        if out.symlink_metadata().is_ok() {
            if !overwrite {
                return Err(Error::input(format!(
                    "{} already exists; choose another -o or pass --force to replace it",
                    out.display()
                )));
            }
            check_replaceable(out, inputs)?;
        }
        let name = out
            .file_name()
            .ok_or_else(|| Error::input(format!("{}: not a directory name", out.display())))?
            .to_string_lossy()
            .into_owned();
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        // An index inside another would be a foreign entry of it (and a build there would
        // replace its files).
        refuse_inside_index(out, parent)?;
        let out_abs = parent
            .canonicalize()
            .map_err(|e| Error::io(parent, e))?
            .join(&name);
        remove_stale(parent, &name, &out_abs);
        // The list is held while the directory comes to be, so a signal's clean-up
        // ([`remove_unfinished`]) waits for it and then removes it: no moment exists when the
        // directory is there but not listed.
        let mut building = unfinished();
        let tmp = create_sibling(out, &out_abs, "tmp")?;
        building.push(tmp.clone());
        drop(building);
        Ok(TempIndexDir {
            tmp,
            out: out.to_path_buf(),
            out_abs,
            overwrite,
            done: false,
        })
    }

    /// The temporary directory.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished directory into place (its marker removed first). A new `out` is a
    /// plain rename, which fails if something appeared at `out` meanwhile (nothing is removed
    /// that this build did not create). An index being replaced (`--force`) is checked again,
    /// swapped atomically where the system can (readers see the old index or the new one,
    /// never a hole), then deleted.
    pub fn commit(mut self) -> Result<()> {
        let marker = self.tmp.join(MARKER_FILE);
        std::fs::remove_file(&marker).map_err(|e| Error::io(&marker, e))?;
        if self.out.symlink_metadata().is_ok() {
            if !self.overwrite {
                return Err(Error::input(format!(
                    "{} appeared while this index was being built; it was left alone and the \
                     new index discarded",
                    self.out.display()
                )));
            }
            if let Some(why) = not_replaceable(&self.out) {
                return Err(Error::input(format!("{why}; it was left alone")));
            }
            if exchange(&self.tmp, &self.out) {
                // `tmp` now holds the old index.
                self.done = true;
                let _ = std::fs::remove_dir_all(&self.tmp);
                return Ok(());
            }
            let old = create_sibling(&self.out, &self.out_abs, "old")?;
            let moved = old.join("index");
            std::fs::rename(&self.out, &moved).map_err(|e| Error::io(&self.out, e))?;
            std::fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
            self.done = true;
            let _ = std::fs::remove_dir_all(&old);
            return Ok(());
        }
        std::fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
        self.done = true;
        Ok(())
    }
}

impl Drop for TempIndexDir {
    fn drop(&mut self) {
        unfinished().retain(|d| d != &self.tmp);
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory that looks like an index: an infgram header (its text tagged) and a shard.
    fn index_dir(path: &Path, tag: &str) {
        std::fs::create_dir_all(path.join("shard-0000")).unwrap();
        let header = format!(r#"{{"magic": "{MAGIC}", "format_version": 1, "tag": "{tag}"}}"#);
        std::fs::write(path.join(HEADER_FILE), header).unwrap();
        std::fs::write(path.join("shard-0000/tokens.bin"), "tokens").unwrap();
    }

    fn tag_of(path: &Path) -> String {
        let text = std::fs::read_to_string(path.join(HEADER_FILE)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["tag"].as_str().unwrap().to_string()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    /// A directory `parent/name` marked as a build's, of `pid`, for the output `out`.
    fn marked(parent: &Path, name: &str, role: &str, pid: u32, out: &Path) -> PathBuf {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let m = Marker {
            role: role.into(),
            pid,
            out: out.to_path_buf(),
        };
        std::fs::write(dir.join(MARKER_FILE), serde_json::to_string(&m).unwrap()).unwrap();
        dir
    }

    /// No process has this id (above Linux's pid_max).
    const DEAD: u32 = 4_294_967;

    /// A build's marker is whole when it can be seen (written aside and renamed); a
    /// directory whose marker was never renamed into place proves nothing and is kept.
    #[test]
    fn markers_are_whole_or_absent() {
        let t = tempfile::tempdir().unwrap();
        let parent = t.path().canonicalize().unwrap();
        let out = parent.join("idx");
        let half_written = parent.join("idx.tmp-4294967");
        std::fs::create_dir(&half_written).unwrap();
        let mut part = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(half_written.join(MARKER_PART))
            .unwrap();
        std::io::Write::write_all(&mut part, b"{\"role\": \"tm").unwrap();
        let tmp = TempIndexDir::create(&out, false, &[]).unwrap();
        assert_eq!(names(tmp.path()), [MARKER_FILE]);
        let marker = Marker::read(tmp.path()).expect("a whole marker");
        assert_eq!((marker.pid, marker.out), (std::process::id(), out));
        assert!(
            half_written.join(MARKER_PART).exists(),
            "an unproven leftover was removed"
        );
        drop(tmp);
    }

    #[test]
    fn a_directory_that_appears_during_the_build_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("idx");
        let tmp = TempIndexDir::create(&out, false, &[]).unwrap();
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("mine.txt"), "keep").unwrap();
        let e = tmp.commit().unwrap_err().to_string();
        assert!(e.contains("appeared"), "{e}");
        assert_eq!(
            std::fs::read_to_string(out.join("mine.txt")).unwrap(),
            "keep"
        );
        assert_eq!(names(t.path()), ["idx"], "no temporary left");
    }

    #[test]
    fn force_replaces_only_an_index_and_swaps_it_whole() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("idx");
        // Not an index: refused, untouched.
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("thesis.txt"), "years of work").unwrap();
        let e = TempIndexDir::create(&out, true, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not an infgram index"), "{e}");
        assert!(out.join("thesis.txt").exists());
        std::fs::remove_dir_all(&out).unwrap();
        // An index holding an input: refused.
        index_dir(&out, "old");
        let input = out.join("shard-0000/sa.bin");
        std::fs::write(&input, "text").unwrap();
        let e = TempIndexDir::create(&out, true, std::slice::from_ref(&input))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("holds the input"), "{e}");
        std::fs::remove_file(&input).unwrap();
        // An index: replaced whole, nothing left beside it, no marker inside.
        let tmp = TempIndexDir::create(&out, true, &[]).unwrap();
        index_dir(tmp.path(), "new");
        tmp.commit().unwrap();
        assert_eq!(tag_of(&out), "new");
        assert_eq!(names(&out), ["index.json", "shard-0000"]);
        assert_eq!(names(t.path()), ["idx"]);
    }

    /// `--force -o LINK`, LINK a link to an index, replaced the link by a new
    /// directory and left the index it named stale. Refused at start and at the swap.
    #[test]
    fn force_refuses_a_link_to_an_index_and_leaves_both() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        index_dir(&real, "old");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = TempIndexDir::create(&link, true, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("is a symbolic link") && e.contains("real"),
            "{e}"
        );
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(tag_of(&real), "old");
        // A link put in place of the index while the build ran: refused at the swap.
        let out = t.path().join("idx");
        index_dir(&out, "old");
        let tmp = TempIndexDir::create(&out, true, &[]).unwrap();
        index_dir(tmp.path(), "new");
        std::fs::remove_dir_all(&out).unwrap();
        std::os::unix::fs::symlink(&real, &out).unwrap();
        let e = tmp.commit().err().unwrap().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert!(out.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(tag_of(&real), "old");
        assert_eq!(names(t.path()), ["idx", "link", "real"]);
    }

    /// `--force` onto a directory whose `index.json` is not infgram's, or an index that holds a
    /// file of the user's, deletes nothing (it once deleted such a file).
    #[test]
    fn force_refuses_a_foreign_header_and_an_index_holding_user_files() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("u");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("notes.txt"), "precious").unwrap();
        for header in ["{}", "not json", r#"{"magic": "infgram-index"}"#] {
            std::fs::write(out.join(HEADER_FILE), header).unwrap();
            let e = TempIndexDir::create(&out, true, &[])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains("not an infgram index"), "{header}: {e}");
            assert_eq!(names(&out), ["index.json", "notes.txt"]);
        }
        // A real header, but a file of the user's inside (at the top or in a shard).
        std::fs::remove_file(out.join(HEADER_FILE)).unwrap();
        index_dir(&out, "old");
        let e = TempIndexDir::create(&out, true, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("notes.txt") && e.contains("did not write"),
            "{e}"
        );
        std::fs::rename(out.join("notes.txt"), out.join("shard-0000/notes.txt")).unwrap();
        let e = TempIndexDir::create(&out, true, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("notes.txt"), "{e}");
        // The file appears between the check and the swap: still refused at commit.
        std::fs::remove_file(out.join("shard-0000/notes.txt")).unwrap();
        let tmp = TempIndexDir::create(&out, true, &[]).unwrap();
        index_dir(tmp.path(), "new");
        std::fs::write(out.join("notes.txt"), "precious").unwrap();
        let e = tmp.commit().unwrap_err().to_string();
        assert!(e.contains("notes.txt"), "{e}");
        assert_eq!(tag_of(&out), "old");
        assert!(out.join("notes.txt").exists());
        assert_eq!(names(t.path()), ["u"]);
    }

    /// Only directories a dead build of the same output marked, holding only index files, are
    /// removed; names alone never decide.
    #[test]
    fn only_marked_leftovers_of_dead_builds_of_the_same_output_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let parent = t.path().canonicalize().unwrap();
        let out = parent.join("data");
        let other_out = parent.join("other");
        // Removed: a dead build's temporary and replaced index, of this output.
        let stale_tmp = marked(&parent, "data.tmp-4294967", "tmp", DEAD, &out);
        index_dir(&stale_tmp, "half");
        let stale_old = marked(&parent, "data.old-4294967", "old", DEAD, &out);
        index_dir(&stale_old.join("index"), "replaced");
        // Kept: a user's directories with look-alike names, unmarked.
        let user_old = parent.join("data.old-2023");
        std::fs::create_dir(&user_old).unwrap();
        std::fs::write(user_old.join("tiny.txt"), "input").unwrap();
        let user_tmp = parent.join("data.tmp-4294967-1");
        index_dir(&user_tmp, "a user's copy of an index, unmarked");
        // Kept: marked, but for another output; by a live process; or holding a user's file.
        let foreign = marked(&parent, "data.tmp-4294968", "tmp", DEAD, &other_out);
        let alive = marked(&parent, "data.tmp-1", "tmp", 1, &out);
        let mixed = marked(&parent, "data.old-4294969", "old", DEAD, &out);
        std::fs::write(mixed.join("notes.txt"), "mine").unwrap();
        let unknown_role = marked(&parent, "data.tmp-4294970", "new", DEAD, &out);
        // A symbolic link with a build's name is never followed or removed.
        #[cfg(unix)]
        std::os::unix::fs::symlink(&user_old, parent.join("data.tmp-4294971")).unwrap();

        let tmp = TempIndexDir::create(&out, false, &[]).unwrap();
        assert!(!stale_tmp.exists() && !stale_old.exists());
        for kept in [
            &user_old,
            &user_tmp,
            &foreign,
            &alive,
            &mixed,
            &unknown_role,
        ] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(user_old.join("tiny.txt").exists());
        drop(tmp);
    }

    /// A directory with this build's own temporary name is not the build's: it is left alone
    /// and the build takes another name.
    #[test]
    fn an_existing_directory_with_the_builds_own_name_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("idx");
        let mine = t.path().join(format!("idx.tmp-{}", std::process::id()));
        std::fs::create_dir(&mine).unwrap();
        std::fs::write(mine.join("keep.txt"), "keep").unwrap();
        let tmp = TempIndexDir::create(&out, false, &[]).unwrap();
        assert_ne!(tmp.path(), mine);
        index_dir(tmp.path(), "new");
        tmp.commit().unwrap();
        assert!(mine.join("keep.txt").exists());
        assert_eq!(tag_of(&out), "new");
    }
}
