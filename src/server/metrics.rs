//! The server's counters, served as Prometheus text at `GET /metrics`: requests and errors,
//! and a latency histogram, per endpoint: each query type of `POST /`, then `completions`,
//! `drafts`, `health`, `metrics`, `models`, and `other` for requests that named no valid query
//! type. Lock-free: one set of atomics per label. And the generations' tokens
//! ([`TokenMeter`]): written and read, and the rate written over the last ten seconds.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// The labels: every query type, then the other endpoints, then `other`.
fn labels() -> impl Iterator<Item = &'static str> {
    crate::service::query::QUERY_TYPES.iter().copied().chain([
        "completions",
        "drafts",
        "health",
        "metrics",
        "models",
        "other",
    ])
}

/// Counters of one label.
#[derive(Default)]
struct Series {
    requests: AtomicU64,
    client_errors: AtomicU64,
    server_errors: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    micros: AtomicU64,
}

/// The server's counters.
pub struct Metrics {
    series: Vec<Series>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            series: labels().map(|_| Series::default()).collect(),
        }
    }
}

impl Metrics {
    /// Counts one request of `label` (a query type, `completions` or anything else: `other`)
    /// answered with `status` after `seconds`.
    pub fn record(&self, label: &str, status: u16, seconds: f64) {
        let i = labels()
            .position(|l| l == label)
            .unwrap_or(self.series.len() - 1);
        let s = &self.series[i];
        s.requests.fetch_add(1, Relaxed);
        match status {
            400..=499 => s.client_errors.fetch_add(1, Relaxed),
            500.. => s.server_errors.fetch_add(1, Relaxed),
            _ => 0,
        };
        if let Some(b) = BUCKETS.iter().position(|&le| seconds <= le) {
            s.buckets[b].fetch_add(1, Relaxed);
        }
        s.micros.fetch_add((seconds * 1e6) as u64, Relaxed);
    }

    /// Requests counted so far, of every label.
    pub fn total_requests(&self) -> u64 {
        self.series.iter().map(|s| s.requests.load(Relaxed)).sum()
    }

    /// The Prometheus text exposition, with `gauges` (name, help, value) appended: counters
    /// where the name ends in `_total`, gauges otherwise.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        let mut out = String::new();
        type Counter = (&'static str, &'static str, fn(&Series) -> u64);
        let counters: [Counter; 3] = [
            ("infgram_requests_total", "Requests answered.", |s| {
                s.requests.load(Relaxed)
            }),
            (
                "infgram_client_errors_total",
                "Requests answered with a 4xx status.",
                |s| s.client_errors.load(Relaxed),
            ),
            (
                "infgram_server_errors_total",
                "Requests answered with a 5xx status.",
                |s| s.server_errors.load(Relaxed),
            ),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (label, s) in labels().zip(&self.series) {
                let _ = writeln!(out, "{name}{{endpoint=\"{label}\"}} {}", get(s));
            }
        }
        let name = "infgram_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from reading a request to its answer.\n# TYPE {name} histogram"
        );
        for (label, s) in labels().zip(&self.series) {
            let mut cumulative = 0;
            for (le, b) in BUCKETS.iter().zip(&s.buckets) {
                cumulative += b.load(Relaxed);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{endpoint=\"{label}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let count = s.requests.load(Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{endpoint=\"{label}\",le=\"+Inf\"}} {count}"
            );
            let sum = s.micros.load(Relaxed) as f64 / 1e6;
            let _ = writeln!(out, "{name}_sum{{endpoint=\"{label}\"}} {sum}");
            let _ = writeln!(out, "{name}_count{{endpoint=\"{label}\"}} {count}");
        }
        for (name, help, value) in gauges {
            // Prometheus's convention: a name ending in `_total` is a counter.
            let kind = match name.ends_with("_total") {
                true => "counter",
                false => "gauge",
            };
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }
}

/// Seconds over which [`TokenMeter::per_second`] averages (ten).
pub const RATE_SECONDS: u64 = 10;

/// The tokens the server's generations wrote and read: totals, and the generated tokens of
/// each of the last whole seconds (for the rate `/metrics` reports beside the totals).
#[derive(Default)]
pub struct TokenMeter {
    generated: AtomicU64,
    read: AtomicU64,
    /// (second since the meter began, tokens generated in it), the newest last.
    recent: std::sync::Mutex<std::collections::VecDeque<(u64, u64)>>,
    began: std::sync::OnceLock<std::time::Instant>,
}

impl TokenMeter {
    /// Counts a token generated now.
    pub fn generated(&self) {
        self.generated_in(self.second());
    }

    /// Counts prompt tokens read by the model (those a kept cache held excluded).
    pub fn read(&self, tokens: usize) {
        self.read.fetch_add(tokens as u64, Relaxed);
    }

    /// Tokens generated so far.
    pub fn generated_total(&self) -> u64 {
        self.generated.load(Relaxed)
    }

    /// Prompt tokens read so far.
    pub fn read_total(&self) -> u64 {
        self.read.load(Relaxed)
    }

    /// Tokens generated a second over the last ten whole seconds.
    pub fn per_second(&self) -> f64 {
        self.per_second_at(self.second())
    }

    fn generated_in(&self, second: u64) {
        self.generated.fetch_add(1, Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        match recent.back_mut() {
            Some((s, n)) if *s == second => *n += 1,
            _ => recent.push_back((second, 1)),
        }
        while (recent.front()).is_some_and(|&(s, _)| s + RATE_SECONDS < second) {
            recent.pop_front();
        }
    }

    /// The rate in the [`RATE_SECONDS`] whole seconds before second `now`.
    fn per_second_at(&self, now: u64) -> f64 {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let tokens: u64 = (recent.iter())
            .filter(|&&(s, _)| s < now && s + RATE_SECONDS >= now)
            .map(|&(_, n)| n)
            .sum();
        tokens as f64 / RATE_SECONDS as f64
    }

    fn second(&self) -> u64 {
        let began = self.began.get_or_init(std::time::Instant::now);
        began.elapsed().as_secs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_label_and_bucket() {
        let m = Metrics::default();
        m.record("count", 200, 0.0002);
        m.record("count", 400, 0.003);
        m.record("nonsense", 500, 100.0);
        let text = m.render(&[
            ("infgram_queue", "Jobs waiting.", 2.0),
            ("infgram_jobs_total", "Jobs done.", 7.0),
        ]);
        assert!(text.contains("# TYPE infgram_queue gauge\ninfgram_queue 2"));
        assert!(text.contains("# TYPE infgram_jobs_total counter\ninfgram_jobs_total 7"));
        assert!(
            text.contains("infgram_requests_total{endpoint=\"count\"} 2"),
            "{text}"
        );
        assert!(text.contains("infgram_client_errors_total{endpoint=\"count\"} 1"));
        assert!(text.contains("infgram_server_errors_total{endpoint=\"other\"} 1"));
        assert!(text.contains(
            "infgram_request_duration_seconds_bucket{endpoint=\"count\",le=\"0.00025\"} 1"
        ));
        assert!(text.contains(
            "infgram_request_duration_seconds_bucket{endpoint=\"count\",le=\"0.005\"} 2"
        ));
        // Past the last bucket: only +Inf holds it.
        assert!(text
            .contains("infgram_request_duration_seconds_bucket{endpoint=\"other\",le=\"30\"} 0"));
        assert!(text
            .contains("infgram_request_duration_seconds_bucket{endpoint=\"other\",le=\"+Inf\"} 1"));
        assert!(text.contains("infgram_queue 2"));
        assert_eq!(m.total_requests(), 3);
    }

    /// The totals count every token; the rate averages the last ten whole seconds (not the
    /// one under way), and older seconds go.
    #[test]
    fn the_meter_counts_tokens_and_averages_the_last_whole_seconds() {
        let meter = TokenMeter::default();
        // 50 tokens in second 3, 30 in second 9, 20 in second 15.
        for (second, tokens) in [(3, 50), (9, 30), (15, 20)] {
            (0..tokens).for_each(|_| meter.generated_in(second));
        }
        meter.read(7);
        assert_eq!((meter.generated_total(), meter.read_total()), (100, 7));
        assert_eq!(meter.per_second_at(15), 3.0, "seconds 5-14: 30 tokens");
        assert_eq!(meter.per_second_at(16), 5.0, "seconds 6-15: 50 tokens");
        assert_eq!(meter.per_second_at(30), 0.0);
        // Second 3 went when second 15 came.
        assert_eq!(meter.recent.lock().unwrap().len(), 2);
    }
}
