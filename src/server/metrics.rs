//! The server's counters, served as Prometheus text at `GET /metrics`: requests and errors,
//! and a latency histogram, per endpoint: each query type of `POST /`, then `completions`,
//! `drafts`, `health`, `metrics`, `models`, and `other` for requests that named no valid query
//! type.
//! Lock-free: one set of atomics per label.

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
}
