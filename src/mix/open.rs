//! Opening what mixing needs: a mixer file, an index built with the model's tokenizer, and
//! the mixture of the two as one scorer.

use super::{Interpolated, Mixer};
use crate::error::{Error, Result};
use crate::index::Index;
use crate::lm::LanguageModel;
use crate::tokenizer::{check_fingerprint, Tokenizer};
use memmap2::Mmap;
use std::path::Path;
use std::sync::Arc;

/// Tokens of context the ∞-gram looks at when mixing.
pub const MIX_CONTEXT: usize = 100;

/// The mixer of `path`, or the default one (fitted on Tiny Shakespeare).
pub fn load_mixer(path: Option<&Path>) -> Result<Mixer> {
    match path {
        Some(p) => Mixer::load(p),
        None => Ok(Mixer::default()),
    }
}

/// Opens an index for mixing with a model whose tokenizer is `tok` (refused otherwise).
pub fn open_mixing_index(dir: &Path, tok: &dyn Tokenizer) -> Result<Arc<Index<Mmap>>> {
    let index = Arc::new(Index::open(dir)?);
    check_mixing_index(&index, tok)?;
    Ok(index)
}

/// Refuses an index for mixing unless it was built with the model's tokenizer `tok`.
pub fn check_mixing_index<S: AsRef<[u8]> + Sync>(
    index: &Index<S>,
    tok: &dyn Tokenizer,
) -> Result<()> {
    check_fingerprint(&index.header().tokenizer, tok)
        .map_err(|e| Error::input(format!("{e}; {NEEDS_INDEX}")))
}

/// What mixing needs, said once for every refusal.
const NEEDS_INDEX: &str = "mixing needs an index built with the model's tokenizer \
                           (`infgram index --tokenizer MODEL -o DIR FILES`): give it with \
                           --index DIR";

/// The error of a mixture asked for without an index.
pub fn mixing_needs_an_index() -> Error {
    Error::input(NEEDS_INDEX)
}

/// The mixture of `neural` and the ∞-gram of `corpus` (an index, or shards held elsewhere) as
/// one scorer.
pub fn mixture_model<N: LanguageModel>(
    neural: N,
    corpus: crate::index::shards::SharedShards,
    mixer: Mixer,
) -> Result<Interpolated<N>> {
    Interpolated::new(neural, corpus, mixer, MIX_CONTEXT)
}
