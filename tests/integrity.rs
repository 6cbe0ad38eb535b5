//! Damaged large files: opening checks sampled blocks of files too large to read whole (the
//! first and last always), `verify` reads everything, and queries over a damaged suffix array
//! that no check caught answer without panicking.

use infgram::index::format::{Header, BLOCK_BYTES};
use infgram::index::pipeline::{build_index, BuildOptions};
use infgram::tokenizer::ByteTokenizer;
use infgram::Index;
use std::path::{Path, PathBuf};

/// A byte-level index of `bytes` pseudo-random text at `dir/idx`.
fn index_of(dir: &Path, bytes: usize) -> PathBuf {
    let mut x = 3u64;
    let text: Vec<u8> = (0..bytes)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            b"abcdefgh ijklmnop\n"[(x >> 59) as usize % 18]
        })
        .collect();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, text).unwrap();
    let out = dir.join("idx");
    build_index(&[corpus], &out, &ByteTokenizer, &BuildOptions::default()).unwrap();
    out
}

/// Flips the byte at `at` of `file`.
fn flip(file: &Path, at: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[at] ^= 0x5a;
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn sampled_blocks_catch_damage_that_whole_file_checks_would() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = index_of(tmp.path(), 1_200_000);
    let sa = idx.join("shard-0000/sa.bin");
    let header = Header::read(&idx).unwrap();
    let info = &header.shards[0].files["sa.bin"];
    let blocks = info.block_crc32.len();
    assert!(blocks >= 3, "{blocks} blocks");
    assert_eq!(blocks, (info.bytes as usize).div_ceil(BLOCK_BYTES));
    // Intact: both ways of opening accept it.
    Index::open(&idx).unwrap();
    Index::open_checked(&idx, 0).unwrap();
    // Damage in the first or the last block is found by every sampled check.
    for at in [10, info.bytes as usize - 20] {
        flip(&sa, at);
        let e = Index::open_checked(&idx, 0).expect_err("damage found");
        assert!(e.to_string().contains("checksum mismatch in block"), "{e}");
        let e = Index::open(&idx).expect_err("damage found");
        assert!(e.to_string().contains("checksum mismatch"), "{e}");
        flip(&sa, at);
    }
    // Damage in a middle block: `verify` always finds it; sampled opens find it in some of 40
    // tries (each picks 6 blocks at random).
    flip(&sa, BLOCK_BYTES + 5);
    let found = (0..40)
        .filter(|_| Index::open_checked(&idx, 0).is_err())
        .count();
    assert!(found > 0);
    let opened = Index::open_checked(&idx, u64::MAX).err();
    assert!(opened.is_some(), "the whole-file check finds it");
    let index = (0..1000)
        .find_map(|_| Index::open_checked(&idx, 0).ok())
        .expect("some sampled open misses a middle block");
    let e = index.verify().unwrap_err();
    assert!(e.to_string().contains("sa.bin"), "{e}");
}

#[test]
fn queries_over_an_unchecked_damaged_suffix_array_do_not_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let idx = index_of(tmp.path(), 200_000);
    // Pointers far past the end, and zeroed ones, in both suffix arrays and the tokens.
    for (file, fill) in [("sa.bin", 0xff), ("rsa.bin", 0xee), ("sa.bin", 0x00)] {
        let path = idx.join("shard-0000").join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        for b in bytes.iter_mut().skip(1000).step_by(7).take(20_000) {
            *b = fill;
        }
        std::fs::write(&path, bytes).unwrap();
        // One-block files carry no block checksums: with whole-file checks off, nothing is
        // checked, as for a large file whose damage the sampled blocks missed.
        let index = Index::open_checked(&idx, 0).unwrap();
        for q in [&b"abc"[..], b"h i", b"ponm", b"a", b""] {
            let q: Vec<u32> = q.iter().map(|&b| b as u32).collect();
            infgram::fuzz_targets::every_query(&index, &q, &[0, 1, 5000, 199_999]);
        }
        assert!(index.verify().is_err());
    }
}
