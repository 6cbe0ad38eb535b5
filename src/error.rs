//! The library's one error type. Every I/O or corruption error names the file it
//! concerns and, where there is one, the action that fixes it.

/// `eprintln!` that never panics: a diagnostic that cannot be written (standard error closed,
/// full, or a broken pipe) is dropped, and the command's own output and exit status stay what
/// they would have been. Every note and warning infgram writes goes through it: the library's
/// modules by its textual scope (`#[macro_use]` on this module, declared first), the binary and
/// the Python module as `infgram::diag!`.
#[macro_export]
macro_rules! diag {
    ($($arg:tt)*) => {
        $crate::error::write_diag(format_args!($($arg)*))
    };
}

/// Writes `args` and a newline to standard error, or nothing where it cannot be written
/// ([`diag!`]).
pub fn write_diag(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{args}");
}

use std::path::PathBuf;

/// Errors of the infgram library. The binary wraps them in `anyhow` and prints each with its
/// chain of causes (a cause its message already names is not repeated).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file of an index is damaged or incomplete.
    #[error("{path}: index is corrupt: {what}; rebuild it with `infgram index`")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// The index was written by another format version.
    #[error("{path}: index format version {got}, this infgram reads version {expected}; rebuild it with `infgram index`")]
    Version {
        /// The header file.
        path: PathBuf,
        /// The version this build reads.
        expected: u32,
        /// The version found.
        got: u32,
    },
    /// A query used a different tokenizer from the one the index was built with.
    #[error("index built with tokenizer {index} (fingerprint {index_fp}), query uses {query} (fingerprint {query_fp}): pass --tokenizer matching the index, or rebuild the index")]
    TokenizerMismatch {
        /// Tokenizer named by the index.
        index: String,
        /// Its fingerprint.
        index_fp: String,
        /// Tokenizer of the query.
        query: String,
        /// Its fingerprint.
        query_fp: String,
    },
    /// A tokenizer could not be loaded or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Bad input from the user (a query, a corpus, an option).
    #[error("{0}")]
    Input(String),
    /// A field of a request out of range, named as the request names it
    /// (`sampling.temperature`); front ends rename it to their own flag or parameter
    /// ([`Error::rename_field`]).
    #[error("{field} {message}")]
    Field {
        /// The field (a dotted path in the request, or a front end's own name for it).
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A failure that an option of the request fixes, named as the request names it
    /// (`floor`); front ends rename it to their own flag or parameter
    /// ([`Error::rename_field`]), and the message shows it where it says `{option}`.
    #[error("{}", .message.replace("{option}", option))]
    Option {
        /// The option (a request's name for it, or a front end's own).
        option: &'static str,
        /// What went wrong and how the option helps, with `{option}` where it is named.
        message: String,
    },
    /// A named resource (an index of a catalog) that is not there.
    #[error("{0}")]
    NotFound(String),
    /// A resource that is there but cannot serve (an index that failed its full check).
    #[error("{0}")]
    Unavailable(String),
    /// A neural-model or tensor error.
    #[error("model: {0}")]
    Model(String),
}

/// A number as an error message shows it: as Rust writes it, or in exponent form when that
/// would take more than 12 digits (`1e308`, not 309 digits).
pub fn shown(x: f64) -> String {
    let plain = x.to_string();
    if plain.trim_start_matches('-').len() > 12 {
        format!("{x:e}")
    } else {
        plain
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    /// A corruption error on `path`.
    pub fn corrupt(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            what: what.into(),
        }
    }
    /// A user-input error.
    pub fn input(msg: impl Into<String>) -> Self {
        Error::Input(msg.into())
    }
    /// A field error said with a front end's own name for the field: `names` maps request
    /// fields to it (`("sampling.temperature", "--temperature")`); other errors pass through.
    pub fn rename_field(self, names: &[(&str, &'static str)]) -> Self {
        match self {
            Error::Field { field, message } => Error::Field {
                field: renamed(names, field),
                message,
            },
            Error::Option { option, message } => Error::Option {
                option: renamed(names, option),
                message,
            },
            other => other,
        }
    }
}

/// `name`'s new name in `names` (`(from, to)` pairs), or `name`.
fn renamed(names: &[(&str, &'static str)], name: &'static str) -> &'static str {
    names
        .iter()
        .find(|(from, _)| *from == name)
        .map_or(name, |(_, to)| to)
}

#[cfg(feature = "neural")]
impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Model(e.to_string())
    }
}
