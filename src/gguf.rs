//! GGUF headers read through a checked reader before candle parses them.
//!
//! candle's `gguf_file::Content::read` bounds its counts by the file's size, but trusts the
//! rest: `general.alignment = 0` divides by zero, a huge alignment overflows the data offset,
//! and a tensor's dimensions multiply without a check (a wrapped element count passes the
//! size test and is then read with the wrong shape). [`read`] first walks the whole header
//! itself, allocating nothing the file does not hold (strings are skipped, not read, except
//! the one key it needs), and refuses with the field named:
//! - a magic or version that is not GGUF 1–3, counts and lengths beyond what the rest of the
//!   file can hold, value types and nesting it does not know;
//! - a `general.alignment` that is not a power of two from 1 to 2¹⁶ (llama.cpp's rule);
//! - a tensor with more than 4 dimensions, a zero dimension, an element count that overflows,
//!   a type candle does not know, an element count its block size does not divide, or bytes
//!   past the end of the file.
//!
//! Only then does candle read the header (its `Content` is what the loaders use), and every
//! tensor's extent is checked against the file once more with candle's own type sizes: inside
//! the file, at an offset that is a multiple of the alignment, over no other tensor's bytes.

use crate::error::{Error, Result};
use candle_core::quantized::gguf_file::Content;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Largest alignment accepted (llama.cpp's files use 32).
const MAX_ALIGNMENT: u64 = 1 << 16;
/// Deepest nesting of arrays accepted.
const MAX_DEPTH: usize = 64;
/// The data section's alignment when the file does not give one (GGUF's default).
const DEFAULT_ALIGNMENT: u64 = 32;
/// The key of the data section's alignment.
const ALIGNMENT_KEY: &str = "general.alignment";

/// Reads the GGUF header of `file` (at `path`, for errors), checked as the module docs say.
pub fn read(file: &mut std::fs::File, path: &Path) -> Result<Content> {
    let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let bad = |what: String| {
        Error::input(format!(
            "{}: not a readable GGUF file ({what}); fetch the model again, or pass another",
            path.display()
        ))
    };
    let mut scan = Scan {
        r: std::io::BufReader::new(&mut *file),
        size,
        long_lengths: true,
    };
    scan.header().map_err(|e| bad(e.0))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io(path, e))?;
    let content = Content::read(file).map_err(|e| bad(e.to_string()))?;
    let alignment = match content.metadata.get(ALIGNMENT_KEY) {
        Some(v) => v.to_u64().ok().or_else(|| v.to_u32().ok().map(u64::from)),
        None => Some(DEFAULT_ALIGNMENT),
    }
    .unwrap_or(DEFAULT_ALIGNMENT)
    .max(1);
    // Each tensor at an aligned offset and none overlapping another (llama.cpp lays them out
    // one after another, each padded to the alignment).
    let mut extents: Vec<(u64, u64, &str)> = Vec::with_capacity(content.tensor_infos.len());
    for (name, info) in &content.tensor_infos {
        let elems = info.shape.elem_count() as u64;
        let block = info.ggml_dtype.block_size() as u64;
        let bytes = (elems / block.max(1)).saturating_mul(info.ggml_dtype.type_size() as u64);
        let end = content
            .tensor_data_offset
            .saturating_add(info.offset)
            .saturating_add(bytes);
        if !elems.is_multiple_of(block.max(1)) || end > size {
            return Err(bad(format!(
                "tensor {name} of {elems} {:?} elements does not fit in the file",
                info.ggml_dtype
            )));
        }
        if !info.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "tensor {name} at offset {} of the data, not a multiple of the alignment \
                 {alignment}",
                info.offset
            )));
        }
        extents.push((
            info.offset,
            info.offset.saturating_add(bytes),
            name.as_str(),
        ));
    }
    extents.sort_unstable();
    if let Some(w) = extents.windows(2).find(|w| w[0].1 > w[1].0) {
        return Err(bad(format!(
            "tensors {} and {} overlap in the file",
            w[0].2, w[1].2
        )));
    }
    Ok(content)
}

/// A failure of the scan: what is wrong.
struct Bad(String);

impl From<std::io::Error> for Bad {
    fn from(e: std::io::Error) -> Self {
        Bad(format!("cut short: {e}"))
    }
}

type Scanned<T> = std::result::Result<T, Bad>;

/// The walk over a header.
struct Scan<R> {
    r: R,
    size: u64,
    /// Version 2 and 3 lengths are u64; version 1's are u32.
    long_lengths: bool,
}

impl<R: Read + Seek> Scan<R> {
    fn u32(&mut self) -> Scanned<u32> {
        let mut b = [0; 4];
        self.r.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Scanned<u64> {
        let mut b = [0; 8];
        self.r.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn length(&mut self) -> Scanned<u64> {
        if self.long_lengths {
            self.u64()
        } else {
            self.u32().map(u64::from)
        }
    }

    fn remaining(&mut self) -> Scanned<u64> {
        Ok(self.size.saturating_sub(self.r.stream_position()?))
    }

    /// Skips `n` bytes that must lie inside the file.
    fn skip(&mut self, n: u64, what: &str) -> Scanned<()> {
        if n > self.remaining()? {
            return Err(Bad(format!("{what} runs past the end of the file")));
        }
        self.r.seek_relative(n as i64)?;
        Ok(())
    }

    /// A string: its bytes when it is `want` long (to compare with a key), else skipped.
    fn string(&mut self, want: usize) -> Scanned<Option<Vec<u8>>> {
        let len = self.length()?;
        if len == want as u64 {
            let mut b = vec![0; want];
            self.r.read_exact(&mut b)?;
            return Ok(Some(b));
        }
        self.skip(len, "a string")?;
        Ok(None)
    }

    /// The bytes one value of `kind` takes at least (for an array's length check).
    fn min_size(&self, kind: u32) -> Scanned<u64> {
        let prefix = if self.long_lengths { 8 } else { 4 };
        Ok(match kind {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => prefix,
            9 => 4 + prefix,
            k => return Err(Bad(format!("an unknown value type {k}"))),
        })
    }

    /// Skips a value of `kind`; returns it when it is an unsigned or signed integer.
    fn value(&mut self, kind: u32, depth: usize) -> Scanned<Option<i128>> {
        if depth > MAX_DEPTH {
            return Err(Bad(format!("values nested deeper than {MAX_DEPTH}")));
        }
        let int = |b: &[u8], signed: bool| -> i128 {
            let mut v = [0u8; 16];
            v[..b.len()].copy_from_slice(b);
            if signed && b[b.len() - 1] & 0x80 != 0 {
                v[b.len()..].fill(0xff);
            }
            i128::from_le_bytes(v)
        };
        match kind {
            0..=5 | 10 | 11 => {
                let n = self.min_size(kind)? as usize;
                let mut b = [0u8; 8];
                self.r.read_exact(&mut b[..n])?;
                Ok(Some(int(&b[..n], matches!(kind, 1 | 3 | 5 | 11))))
            }
            6 | 7 | 12 => {
                let n = self.min_size(kind)?;
                self.skip(n, "a value")?;
                Ok(None)
            }
            8 => {
                self.string(0)?;
                Ok(None)
            }
            9 => {
                let inner = self.u32()?;
                let len = self.length()?;
                let need = len.saturating_mul(self.min_size(inner)?);
                if need > self.remaining()? {
                    return Err(Bad(format!(
                        "an array of {len} values runs past the end of the file"
                    )));
                }
                match inner {
                    8 | 9 => {
                        for _ in 0..len {
                            self.value(inner, depth + 1)?;
                        }
                    }
                    _ => self.skip(need, "an array")?,
                }
                Ok(None)
            }
            k => Err(Bad(format!("an unknown value type {k}"))),
        }
    }

    /// The whole header: magic, version, counts, metadata, tensor infos.
    fn header(&mut self) -> Scanned<()> {
        if self.u32()? != 0x4655_4747 {
            return Err(Bad("no GGUF magic".into()));
        }
        let version = self.u32()?;
        if !(1..=3).contains(&version) {
            return Err(Bad(format!("GGUF version {version}")));
        }
        self.long_lengths = version >= 2;
        let tensors = self.length()?;
        let entries = self.length()?;
        let prefix = if self.long_lengths { 8 } else { 4 };
        let need = entries
            .saturating_mul(prefix + 5)
            .saturating_add(tensors.saturating_mul(prefix + 16));
        if need > self.remaining()? {
            return Err(Bad(format!(
                "{tensors} tensors and {entries} metadata entries do not fit in the file"
            )));
        }
        for _ in 0..entries {
            let key = self.string(ALIGNMENT_KEY.len())?;
            let kind = self.u32()?;
            let value = self.value(kind, 0)?;
            if key.as_deref() == Some(ALIGNMENT_KEY.as_bytes()) {
                check_alignment(kind, value)?;
            }
        }
        for _ in 0..tensors {
            self.tensor_info()?;
        }
        Ok(())
    }

    /// One tensor's name, dimensions, type and offset.
    fn tensor_info(&mut self) -> Scanned<()> {
        self.string(0)?;
        let dims = self.u32()?;
        if dims > 4 {
            return Err(Bad(format!("a tensor of {dims} dimensions (at most 4)")));
        }
        let mut elems: u64 = 1;
        for _ in 0..dims {
            let d = if self.long_lengths {
                self.u64()?
            } else {
                u64::from(self.u32()?)
            };
            // No dtype packs more than 8 elements a byte: more elements than 8 × the file's
            // bytes cannot be there.
            elems = elems
                .checked_mul(d)
                .filter(|&e| d > 0 && e <= self.size.saturating_mul(8))
                .ok_or_else(|| Bad(format!("a tensor dimension of {d} does not fit the file")))?;
        }
        let _dtype = self.u32()?;
        let _offset = self.u64()?;
        Ok(())
    }
}

/// Refuses a `general.alignment` that is not an integer power of two in 1..=2¹⁶.
fn check_alignment(kind: u32, value: Option<i128>) -> Scanned<()> {
    match value {
        Some(a) if a >= 1 && a <= MAX_ALIGNMENT as i128 && (a as u64).is_power_of_two() => Ok(()),
        Some(a) => Err(Bad(format!(
            "{ALIGNMENT_KEY} is {a}: it must be a power of two from 1 to {MAX_ALIGNMENT}"
        ))),
        None => Err(Bad(format!(
            "{ALIGNMENT_KEY} has value type {kind}, not an integer"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// A GGUF file of `metadata` and one 2 × 32 f32 tensor.
    fn file(dir: &Path, metadata: &[(&str, Value)]) -> std::path::PathBuf {
        let path = dir.join("m.gguf");
        let t = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, GgmlDType::F32).unwrap();
        let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let mut f = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut f, &md, &[("w", &q)]).unwrap();
        path
    }

    fn read_path(path: &Path) -> Result<Content> {
        read(&mut std::fs::File::open(path).unwrap(), path)
    }

    #[test]
    fn a_sound_file_reads_as_candle_reads_it() {
        let t = tempfile::tempdir().unwrap();
        let md = [
            ("general.architecture", Value::String("llama".into())),
            ("a", Value::Array(vec![Value::U32(1), Value::U32(2)])),
            (
                "s",
                Value::Array(vec![Value::String("x".into()), Value::String("yz".into())]),
            ),
            // candle's writer aligns to 32 whatever the metadata says.
            (ALIGNMENT_KEY, Value::U32(32)),
        ];
        let path = file(t.path(), &md);
        let c = read_path(&path).unwrap();
        assert_eq!(c.tensor_infos["w"].shape.dims(), &[2, 32]);
        assert_eq!(c.tensor_data_offset % 32, 0);
    }

    /// candle divides by a zero alignment (a panic in `gen --model`, `index --tokenizer` and
    /// `serve`): refused by name.
    #[test]
    fn bad_alignments_are_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        for bad in [
            Value::U32(0),
            Value::U32(3),
            Value::I32(-32),
            Value::U64(1 << 40),
            Value::String("32".into()),
        ] {
            let path = file(t.path(), &[(ALIGNMENT_KEY, bad.clone())]);
            let e = read_path(&path).unwrap_err().to_string();
            assert!(e.contains(ALIGNMENT_KEY), "{bad:?}: {e}");
        }
    }

    /// A tensor at an offset that is not a multiple of the alignment, or over another
    /// tensor's bytes, is refused (candle would read it and give garbage).
    #[test]
    fn misplaced_tensor_offsets_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("two.gguf");
        let x = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
        let q = QTensor::quantize(&x, GgmlDType::F32).unwrap();
        let mut f = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut f, &[], &[("a", &q), ("b", &q)]).unwrap();
        drop(f);
        let sound = std::fs::read(&path).unwrap();
        assert!(read_path(&path).is_ok());
        // Each tensor info: name (8 + 1 bytes), 2 dimensions (4 + 16), type (4), offset (8).
        let info = 8 + 1 + 4 + 16 + 4 + 8;
        let offset_of = |i: usize| 24 + i * info + info - 8;
        let at = |b: &[u8], i: usize| {
            u64::from_le_bytes(b[offset_of(i)..offset_of(i) + 8].try_into().unwrap())
        };
        assert_eq!((at(&sound, 0), at(&sound, 1)), (0, 256));
        for (i, bad, says) in [
            (1, 0, "overlap"),
            (1, 128, "overlap"),
            (0, 1, "alignment"),
            (1, 100, "alignment"),
        ] {
            let mut bytes = sound.clone();
            bytes[offset_of(i)..offset_of(i) + 8].copy_from_slice(&(bad as u64).to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let e = read_path(&path).unwrap_err().to_string();
            assert!(e.contains(says), "tensor {i} at {bad}: {e}");
        }
    }

    /// Dimensions that multiply past the file (or wrap) are refused before candle reads them.
    #[test]
    fn tensor_dimensions_beyond_the_file_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let path = file(t.path(), &[]);
        let mut bytes = std::fs::read(&path).unwrap();
        // The tensor info's first dimension (after magic, version, counts, "w" and n_dims).
        let at = 4 + 4 + 8 + 8 + 8 + 1 + 4;
        assert_eq!(
            u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()),
            32
        );
        for d in [u64::MAX, 1 << 33, 0] {
            bytes[at..at + 8].copy_from_slice(&d.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let e = read_path(&path).unwrap_err().to_string();
            assert!(e.contains("not a readable GGUF"), "{d}: {e}");
        }
    }
}
