//! How infgram writes a file: beside its destination under a fresh name, synced, renamed into
//! place; never through a link, never over anything that is not a regular file, never inside
//! an index.
//!
//! Every file the library and the binary write (ARPA models, past outputs, mixer files,
//! traces, HTML pages, plots, cache records) goes through [`write_file`] or
//! [`write_via_path`]:
//! 1. The destination is checked first ([`check`]): a symbolic link, a directory, a socket, a
//!    block device, a path whose directory is missing, and a path inside an index directory
//!    (infgram's or infini-gram's) are refused with the reason and what to do. `-` (standard
//!    output), a character device (`/dev/null`) and a FIFO are written as a stream, where the
//!    command allows one ([`Accept::Streams`]); nothing is renamed over them.
//! 2. A regular file is written into a temporary file beside it, created exclusively
//!    (`O_EXCL`, `O_NOFOLLOW`, a random name `.NAME.XXXXXX.tmp`, by the `tempfile` crate), so a
//!    name planted by someone else (a link or a file) is never followed or consumed.
//! 3. The temporary file is flushed and synced, the destination checked again, the file
//!    renamed over it (a reader sees the old file or the new, never half of one) and the
//!    directory synced. A replaced file keeps its permission bits; a new one gets the umask's.
//! 4. Any failure, or a signal handled by the binary
//!    ([`crate::index::output_dir::remove_unfinished`], which index builds share), removes the
//!    temporary file: a failed write leaves nothing behind.

use crate::error::{Error, Result};
use crate::index::output_dir::unfinished;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a destination may be besides a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    /// A regular file only (a file infgram reads back: past outputs, mixers, caches).
    Files,
    /// A regular file, or a stream: `-` (standard output), a character device or a FIFO.
    Streams,
}

/// Where a checked destination's bytes go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A regular file, new or replaced (its permission bits when it exists).
    File {
        /// The destination.
        path: PathBuf,
        /// The permission bits it will have.
        mode: u32,
    },
    /// Standard output (`-`).
    Stdout,
    /// A character device or a FIFO, written in place.
    Stream(PathBuf),
}

/// Checks `dest` as an output of kind `accept` and says where its bytes will go; an error
/// names the path, why it is refused and what to do.
pub fn check(dest: &Path, accept: Accept) -> Result<Target> {
    let streams = accept == Accept::Streams;
    if dest.as_os_str() == "-" {
        return if streams {
            Ok(Target::Stdout)
        } else {
            Err(Error::input(
                "- (standard output) cannot hold this file, which infgram reads back: name a \
                 regular file",
            ))
        };
    }
    let name_ok = dest.file_name().is_some_and(|n| n != "." && n != "..")
        && !dest.as_os_str().to_string_lossy().ends_with('/');
    if !name_ok {
        return Err(Error::input(format!(
            "{}: not a file name: name a file to write",
            dest.display()
        )));
    }
    let parent = parent_of(dest);
    match dest.symlink_metadata() {
        Ok(meta) => {
            use std::os::unix::fs::FileTypeExt;
            let kind = meta.file_type();
            if kind.is_symlink() {
                let to = std::fs::read_link(dest)
                    .map(|t| format!(" (to {})", t.display()))
                    .unwrap_or_default();
                return Err(Error::input(format!(
                    "{} is a symbolic link{to}; infgram never writes through a link: name the \
                     file itself, or remove the link",
                    dest.display()
                )));
            }
            if kind.is_dir() {
                return Err(Error::input(format!(
                    "{} is a directory: name a file inside it",
                    dest.display()
                )));
            }
            if kind.is_char_device() || kind.is_fifo() {
                let what = if kind.is_fifo() {
                    "a FIFO"
                } else {
                    "a character device"
                };
                if streams {
                    return Ok(Target::Stream(dest.to_path_buf()));
                }
                return Err(Error::input(format!(
                    "{} is {what}, and this file is read back: name a regular file",
                    dest.display()
                )));
            }
            if !kind.is_file() {
                return Err(Error::input(format!(
                    "{} is not a regular file (a socket or a block device): it is left alone; \
                     name a regular file",
                    dest.display()
                )));
            }
            crate::index::output_dir::refuse_inside_index(dest, &parent)?;
            use std::os::unix::fs::PermissionsExt;
            Ok(Target::File {
                path: dest.to_path_buf(),
                mode: meta.permissions().mode() & 0o7777,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !parent.is_dir() {
                return Err(Error::input(format!(
                    "{}: the directory {} does not exist: create it first",
                    dest.display(),
                    parent.display()
                )));
            }
            crate::index::output_dir::refuse_inside_index(dest, &parent)?;
            Ok(Target::File {
                path: dest.to_path_buf(),
                mode: 0o666 & !umask(),
            })
        }
        Err(e) => Err(Error::io(dest, e)),
    }
}

/// Checks that `dest` can be written as a regular file now: [`check`], and a temporary file
/// created and removed beside it (a read-only directory fails here, not after the work).
pub fn check_writable(dest: &Path) -> Result<()> {
    check(dest, Accept::Files)?;
    let parent = parent_of(dest);
    temp_beside(dest, &parent, 0o600, "").map(drop)
}

/// Writes `dest` by `write`, as the module docs say: a stream in place, a regular file beside
/// it and renamed over it when `write` succeeds. Returns what `write` returns.
pub fn write_file<T>(
    dest: &Path,
    accept: Accept,
    write: impl FnOnce(&mut dyn Write) -> Result<T>,
) -> Result<T> {
    match check(dest, accept)? {
        Target::Stdout => {
            let mut out = std::io::stdout().lock();
            let value = write(&mut out)?;
            out.flush().map_err(|e| Error::io("standard output", e))?;
            Ok(value)
        }
        Target::Stream(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
            let value = write(&mut out)?;
            out.flush().map_err(|e| Error::io(&path, e))?;
            Ok(value)
        }
        Target::File { path, mode } => {
            let parent = parent_of(&path);
            let tmp = temp_beside(&path, &parent, mode, "")?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, &tmp.file);
            let value = write(&mut out)?;
            out.flush().map_err(|e| Error::io(&tmp.path, e))?;
            drop(out);
            tmp.commit(&path, &parent)?;
            Ok(value)
        }
    }
}

/// Writes `bytes` to `dest`, a regular file (see [`write_file`]).
pub fn write_bytes(dest: &Path, bytes: &[u8]) -> Result<()> {
    write_file(dest, Accept::Files, |out| {
        out.write_all(bytes).map_err(|e| Error::io(dest, e))
    })
}

/// For writers that take a path (an image encoder, which picks its format by the name's
/// extension): `write` writes the temporary file at the path it is given (a fresh file of
/// this process, ending `.ext`); it is then synced and renamed over `dest`. Regular files
/// only.
pub fn write_via_path<T>(
    dest: &Path,
    ext: &str,
    write: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let Target::File { path, mode } = check(dest, Accept::Files)? else {
        unreachable!("Accept::Files checks to a file")
    };
    let parent = parent_of(&path);
    let mut tmp = temp_beside(&path, &parent, mode, ext)?;
    let value = write(&tmp.path)?;
    // Reopened without following a link (the writer may have replaced the file).
    use std::os::unix::fs::OpenOptionsExt;
    tmp.file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp.path)
        .map_err(|e| Error::io(&tmp.path, e))?;
    tmp.commit(&path, &parent)?;
    Ok(value)
}

/// A temporary file being written: removed when dropped unless committed.
struct Unfinished {
    path: PathBuf,
    file: std::fs::File,
    /// Renamed into place (nothing to remove).
    done: bool,
}

impl Unfinished {
    /// Syncs the file, checks `dest` again (something that appeared there meanwhile and is not
    /// a regular file is left alone, and the new file discarded), renames it over `dest` and
    /// syncs the directory.
    fn commit(mut self, dest: &Path, parent: &Path) -> Result<()> {
        self.file.sync_all().map_err(|e| Error::io(&self.path, e))?;
        if let Ok(meta) = dest.symlink_metadata() {
            if !meta.file_type().is_file() {
                return Err(Error::input(format!(
                    "{} was replaced by something that is not a regular file while infgram \
                     wrote it; it was left alone and the new file discarded",
                    dest.display()
                )));
            }
        }
        std::fs::rename(&self.path, dest).map_err(|e| Error::io(dest, e))?;
        self.done = true;
        // The rename is durable once the directory is synced (best effort: some file
        // systems cannot sync a directory).
        if let Ok(dir) = std::fs::File::open(parent) {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        unfinished().retain(|p| p != &self.path);
        if !self.done {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates `.NAME.XXXXXX.tmp[.EXT]` beside `dest` exclusively, with `mode`, listed as
/// unfinished.
fn temp_beside(dest: &Path, parent: &Path, mode: u32, ext: &str) -> Result<Unfinished> {
    use std::os::unix::fs::PermissionsExt;
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let ext = if ext.is_empty() {
        String::new()
    } else {
        format!(".{ext}")
    };
    // The list is held while the file comes to be, so a signal's clean-up waits for it.
    let mut list = unfinished();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(&format!(".tmp{ext}"))
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(parent)
        .map_err(|e| Error::io(dest, e))?;
    let (file, path) = tmp.keep().map_err(|e| Error::io(dest, e.error))?;
    list.push(path.clone());
    Ok(Unfinished {
        path,
        file,
        done: false,
    })
}

/// The directory `dest` is written in.
fn parent_of(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The process's umask (Linux: read from `/proc/self/status`; elsewhere 022).
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_new_file_is_written_and_nothing_is_left_beside_it() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out.txt");
        write_bytes(&out, b"hello").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"hello");
        assert_eq!(names(t.path()), ["out.txt"]);
    }

    #[test]
    fn a_replaced_file_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out.txt");
        std::fs::write(&out, "old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_bytes(&out, b"new").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out.txt");
        std::fs::write(&out, "old").unwrap();
        let r: Result<()> = write_file(&out, Accept::Files, |w| {
            w.write_all(b"half").unwrap();
            Err(Error::input("failed"))
        });
        assert!(r.is_err());
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        assert_eq!(names(t.path()), ["out.txt"]);
    }

    #[test]
    fn links_directories_and_missing_directories_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim.txt");
        std::fs::write(&victim, "mine").unwrap();
        let link = t.path().join("link.txt");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = write_bytes(&link, b"x").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = write_bytes(t.path(), b"x").unwrap_err().to_string();
        assert!(
            e.contains("not a file name") || e.contains("directory"),
            "{e}"
        );
        let sub = t.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let e = write_bytes(&sub, b"x").unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = write_bytes(&t.path().join("nowhere/out.txt"), b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"mine");
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(names(t.path()), ["link.txt", "sub", "victim.txt"]);
    }

    #[test]
    fn devices_are_streams_or_refused() {
        let null = Path::new("/dev/null");
        assert_eq!(
            check(null, Accept::Streams).unwrap(),
            Target::Stream(null.into())
        );
        write_file(null, Accept::Streams, |w| {
            w.write_all(b"gone").map_err(|e| Error::io("/dev/null", e))
        })
        .unwrap();
        assert!(check(null, Accept::Files).is_err());
        assert_eq!(
            check(Path::new("-"), Accept::Streams).unwrap(),
            Target::Stdout
        );
        assert!(check(Path::new("-"), Accept::Files).is_err());
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn planted_names_beside_the_output_are_neither_followed_nor_consumed() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim.txt");
        std::fs::write(&victim, "mine").unwrap();
        let out = t.path().join("out.txt");
        // The old predictable names, a link and a plain file.
        let link = t
            .path()
            .join(format!(".out.txt.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let plain = t.path().join(format!("out.txt.tmp-{}", std::process::id()));
        std::fs::write(&plain, "the user's").unwrap();
        write_bytes(&out, b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"mine");
        assert_eq!(std::fs::read(&plain).unwrap(), b"the user's");
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        assert!(out.symlink_metadata().unwrap().file_type().is_file());
        assert_eq!(names(t.path()).len(), 4);
    }

    #[test]
    fn a_path_inside_an_index_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let index = t.path().join("lm");
        std::fs::create_dir_all(index.join("shard-0000")).unwrap();
        let header = format!(
            r#"{{"magic": "{}", "format_version": 1}}"#,
            crate::index::format::MAGIC
        );
        std::fs::write(index.join("index.json"), &header).unwrap();
        for dest in ["index.json", "new.arpa", "shard-0000/x"] {
            let e = write_bytes(&index.join(dest), b"x")
                .unwrap_err()
                .to_string();
            assert!(e.contains("inside the index"), "{dest}: {e}");
        }
        assert_eq!(
            std::fs::read_to_string(index.join("index.json")).unwrap(),
            header
        );
        // infini-gram's layout.
        let ig = t.path().join("ig");
        std::fs::create_dir(&ig).unwrap();
        std::fs::write(ig.join("tokenized.0"), "t").unwrap();
        std::fs::write(ig.join("table.0"), "t").unwrap();
        assert!(write_bytes(&ig.join("out.arpa"), b"x").is_err());
        // Beside an index is fine.
        write_bytes(&t.path().join("out.arpa"), b"x").unwrap();
    }
}
