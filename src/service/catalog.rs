//! The catalog: the indexes a front end has opened, by name, each with the tokenizer it was
//! built with and its background full check. A server opens its indexes here once and every
//! request (a query, a completion's drafter, its copy guard) borrows them as `Arc`s: nothing
//! is opened twice.
//!
//! A loaded neural model is not shared the same way: it holds a mutable KV cache and is owned
//! by the one thread that runs generations (the server's generation worker), which loads it
//! with [`crate::service::models::load_model`].

use crate::index::Index;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use memmap2::Mmap;
use std::path::PathBuf;
use std::sync::Arc;

/// An opened index with its tokenizer.
pub struct Served {
    /// Its name in requests.
    pub name: String,
    /// The index.
    pub index: Arc<Index<Mmap>>,
    /// The tokenizer it was built with.
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Its full check, run in the background after start.
    pub check: Arc<FullCheck>,
}

/// Where the full check of a served index stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckState {
    /// Still reading (the checks of opening passed).
    Running,
    /// Every byte matched its checksum (or was already recorded as verified).
    Passed,
    /// A file did not: what is wrong. Queries to the index are refused.
    Failed(String),
}

/// The full check of one index: opening checks large files by sampled blocks only, so
/// `serve` reads every byte of each index in the background after start
/// ([`FullCheck::start`]) and refuses queries to one that fails.
#[derive(Debug)]
pub struct FullCheck {
    state: std::sync::Mutex<CheckState>,
}

impl FullCheck {
    /// Checks `index` on a background thread at low priority (an index checked whole at open
    /// has passed already; one recorded as verified is read again all the same: damage can
    /// come after). A pass is recorded, as `infgram verify` records it.
    pub fn start(name: &str, index: Arc<Index<Mmap>>) -> Arc<FullCheck> {
        let done = !index.checked_by_sampling();
        let check = Arc::new(FullCheck {
            state: std::sync::Mutex::new(if done {
                CheckState::Passed
            } else {
                CheckState::Running
            }),
        });
        if done {
            return check;
        }
        let (name, running) = (name.to_string(), check.clone());
        let spawned = std::thread::Builder::new()
            .name("infgram-verify".into())
            .spawn(move || {
                lower_priority();
                let state = match index.verify() {
                    Ok(()) => {
                        let _ = crate::service::indexes::record_verified(&index);
                        CheckState::Passed
                    }
                    Err(e) => {
                        diag!("index {name:?} failed its full check: {e}; its queries are refused");
                        CheckState::Failed(e.to_string())
                    }
                };
                running.set(state);
            });
        if let Err(e) = spawned {
            check.set(CheckState::Failed(format!(
                "the check could not start: {e}"
            )));
        }
        check
    }

    /// Where the check stands.
    pub fn state(&self) -> CheckState {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, state: CheckState) {
        *self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = state;
    }
}

/// The opened indexes, by name.
pub struct Indexes {
    list: Vec<Arc<Served>>,
}

impl Indexes {
    /// Opens each `(name, dir)` with the tokenizer `tokenizers` gives for its name, else the
    /// one it names.
    pub fn open(dirs: &[(String, PathBuf)], tokenizers: &[(String, String)]) -> Result<Self> {
        if let Some((name, _)) = tokenizers
            .iter()
            .find(|(n, _)| !dirs.iter().any(|d| &d.0 == n))
        {
            return Err(Error::input(format!(
                "a tokenizer is given for {name:?}, which is not one of the indexes (--index NAME=DIR)"
            )));
        }
        let mut list = Vec::new();
        for (name, dir) in dirs {
            if list.iter().any(|s: &Arc<Served>| &s.name == name) {
                return Err(Error::input(format!(
                    "two indexes are named {name:?}: give each --index NAME=DIR its own name"
                )));
            }
            let named = tokenizers
                .iter()
                .find(|(n, _)| n == name)
                .map(|t| t.1.as_str());
            let (index, tok) = crate::service::open_index(dir, named)?;
            let index = Arc::new(index);
            list.push(Arc::new(Served {
                name: name.clone(),
                check: FullCheck::start(name, index.clone()),
                index,
                tokenizer: Arc::from(tok),
            }));
        }
        if list.is_empty() {
            return Err(Error::input("the server needs at least one index"));
        }
        Ok(Indexes { list })
    }

    /// The index `name`, or the only one when `None`. An unknown name is
    /// [`Error::NotFound`]; an index that failed its full check is [`Error::Unavailable`].
    pub fn get(&self, name: Option<&str>) -> Result<Arc<Served>> {
        let found = match name {
            Some(n) => self.list.iter().find(|s| s.name == n),
            None if self.list.len() == 1 => self.list.first(),
            None => {
                return Err(Error::input(format!(
                    "this server has several indexes: name one in \"index\" ({})",
                    self.names()
                )))
            }
        };
        let served = found.cloned().ok_or_else(|| {
            Error::NotFound(format!(
                "no index {:?} here; this server has: {}",
                name.unwrap_or_default(),
                self.names()
            ))
        })?;
        if let CheckState::Failed(what) = served.check.state() {
            return Err(Error::Unavailable(format!(
                "index {:?} failed its full check ({what}): rebuild it; the server goes on \
                 serving its other indexes",
                served.name
            )));
        }
        Ok(served)
    }

    /// A catalog of indexes opened already (their names must differ).
    pub fn from_opened(list: Vec<Arc<Served>>) -> Self {
        Indexes { list }
    }

    /// The indexes, in the order they were given.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Served>> {
        self.list.iter()
    }

    /// The first index built with `tok`.
    pub fn with_tokenizer(&self, tok: &dyn Tokenizer) -> Option<Arc<Served>> {
        let fp = tok.fingerprint();
        self.list
            .iter()
            .filter(|s| !matches!(s.check.state(), CheckState::Failed(_)))
            .find(|s| s.tokenizer.fingerprint() == fp)
            .cloned()
    }

    fn names(&self) -> String {
        self.list
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How much lower background work (a generation, a full check) runs than the query threads
/// (a nice value; the model's own threads, started from the generation thread, inherit it).
/// On 2 cores under a query load, a generation at the same priority doubled the queries' p99
/// latency (2.06×); at +10 it was 1.55–1.92×, at +19 0.9–1.1×, and the generation still ran
/// at about 50 tokens/s, since the query threads leave the CPU idle between requests.
pub const BACKGROUND_NICENESS: i32 = 19;

/// Lowers the calling thread's CPU priority by [`BACKGROUND_NICENESS`] (Linux; elsewhere
/// nothing).
pub fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id; a failure leaves the priority as it was.
    unsafe {
        let tid = libc::gettid();
        let now = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        libc::setpriority(
            libc::PRIO_PROCESS,
            tid as libc::id_t,
            (now + BACKGROUND_NICENESS).min(19),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index large enough that opening samples its files' blocks (opened here with every
    /// file counted as large).
    fn sampled_index(dir: &std::path::Path) -> Arc<Index<Mmap>> {
        let mut x = 5u64;
        let text: String = (0..1_500_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (b'a' + (x % 7) as u8) as char
            })
            .collect();
        let corpus = dir.join("c.txt");
        std::fs::write(&corpus, text).unwrap();
        let out = dir.join("idx");
        let opts = crate::index::pipeline::BuildOptions {
            progress: false,
            ..Default::default()
        };
        let tok = crate::tokenizer::ByteTokenizer;
        crate::index::pipeline::build_index(&[corpus], &out, &tok, &opts).unwrap();
        Arc::new(Index::open_checked(&out, 0).unwrap())
    }

    fn settled(check: &FullCheck) -> CheckState {
        for _ in 0..600 {
            match check.state() {
                CheckState::Running => std::thread::sleep(std::time::Duration::from_millis(50)),
                done => return done,
            }
        }
        panic!("the check did not finish within 30 s");
    }

    /// A byte flipped where opening's sampled blocks do not look is found by the background
    /// check, which then refuses the index; a whole index passes and is
    /// recorded as verified.
    #[test]
    fn the_background_check_finds_what_sampling_missed() {
        let t = tempfile::tempdir().unwrap();
        let index = sampled_index(t.path());
        assert!(index.checked_by_sampling());
        let check = FullCheck::start("whole", index.clone());
        assert_eq!(settled(&check), CheckState::Passed);
        assert!(crate::service::indexes::was_verified(&index));
        // Damage after opening (a bit flip on disk, where sampling might never look): the
        // next check reads every byte, fails, and the index's queries are refused.
        let sa = index.dir().unwrap().join("shard-0000/sa.bin");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&sa)
            .unwrap();
        let mid = file.metadata().unwrap().len() / 2;
        use std::io::{Read, Seek, Write};
        let mut byte = [0u8];
        file.seek(std::io::SeekFrom::Start(mid)).unwrap();
        file.read_exact(&mut byte).unwrap();
        file.seek(std::io::SeekFrom::Start(mid)).unwrap();
        file.write_all(&[byte[0] ^ 1]).unwrap();
        drop(file);
        let check = FullCheck::start("damaged", index.clone());
        let CheckState::Failed(what) = settled(&check) else {
            panic!("the damage went unseen");
        };
        assert!(what.contains("sa.bin"), "{what}");
        let served = Served {
            name: "damaged".into(),
            index,
            tokenizer: Arc::new(crate::tokenizer::ByteTokenizer),
            check,
        };
        let indexes = Indexes::from_opened(vec![Arc::new(served)]);
        let refused = indexes.get(None).err().expect("refused");
        assert!(matches!(refused, Error::Unavailable(_)), "{refused:?}");
        assert!(refused.to_string().contains("full check"), "{refused}");
    }
}
