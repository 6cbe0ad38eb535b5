//! Query latency on any index on disk, through the memory map: warm (pages cached) and cold
//! (after dropping the page cache, which needs root; skipped otherwise). Queries are cut from
//! the index's own documents at pseudo-random positions, so they occur.
//!
//! `cargo run --release --example bench_index -- INDEX_DIR [QUERIES]`

use infgram::index::shards::Shards;
use infgram::Index;
use std::hint::black_box;
use std::time::Instant;

fn drop_page_cache() -> bool {
    // Asks the kernel to forget clean cached pages (root only).
    std::process::Command::new("sync").status().is_ok()
        && std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Query latency on an index on disk.
#[derive(clap::Parser)]
struct Args {
    /// The index directory.
    index_dir: std::path::PathBuf,
    /// Queries per type.
    #[arg(default_value_t = 2000)]
    queries: usize,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let (dir, n) = (args.index_dir.display().to_string(), args.queries);
    let index = Index::open(&args.index_dir).expect("open index");
    let shards = index.shards();
    println!(
        "{dir}: {} tokens, {} shards, reverse: {}",
        index.total_tokens(),
        shards.len(),
        index.has_reverse()
    );
    // Pseudo-random windows of 110 tokens inside documents (no separator inside).
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut windows: Vec<Vec<u32>> = Vec::with_capacity(n);
    while windows.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let sh = &shards[(x % shards.len() as u64) as usize];
        let p = ((x >> 8) % (sh.len().saturating_sub(120).max(1)) as u64) as usize;
        let w = sh.slice(p, (p + 110).min(sh.len()));
        if w.len() == 110 && !w.contains(&index.separator()) {
            windows.push(w);
        }
    }
    type Query = (&'static str, fn(&Index<memmap2::Mmap>, &[u32]));
    let queries: [Query; 4] = [
        ("count(10)", |i, w| {
            black_box(i.count(&w[..10]).unwrap());
        }),
        ("prob(5)", |i, w| {
            black_box(i.prob(&w[..4], w[4]).unwrap());
        }),
        ("ntd(5)", |i, w| {
            black_box(i.ntd(&w[..5], None).unwrap());
        }),
        ("infgram_ntd(ctx 100)", |i, w| {
            black_box(i.infgram_ntd(&w[..100], None).unwrap());
        }),
    ];
    println!("| query | warm µs | cold µs |");
    println!("|---|---:|---:|");
    drop(index);
    for (name, q) in queries {
        let index = Index::open(std::path::Path::new(&dir)).expect("open index");
        // Warm: touch the same queries once, then time them.
        for w in &windows {
            q(&index, w);
        }
        let t = Instant::now();
        for w in &windows {
            q(&index, w);
        }
        let warm = t.elapsed().as_secs_f64() / windows.len() as f64 * 1e6;
        // Cold: only unmapped pages leave the cache, so unmap, drop, and reopen.
        drop(index);
        let cold = if drop_page_cache() {
            let fresh = Index::open(std::path::Path::new(&dir)).expect("open index");
            let k = windows.len().min(200);
            let t = Instant::now();
            for w in &windows[..k] {
                q(&fresh, w);
            }
            format!("{:.0}", t.elapsed().as_secs_f64() / k as f64 * 1e6)
        } else {
            "(needs root)".into()
        };
        println!("| {name} | {warm:.2} | {cold} |");
    }
}
