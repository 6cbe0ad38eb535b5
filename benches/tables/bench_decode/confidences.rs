//! Draft tokens by the confidence their drafter gave them, against whether the model accepted
//! them: per drafter and tenth of confidence, the tokens tried (those up to a pass's first
//! rejection: a token after it was never verified) and the share accepted, for all of them
//! and for a draft's first token alone. What the policy's calibration has to correct
//! (`decode::policy`), read off the passes of a greedy run (the same in every run).

use infgram::decode::PassTrace;
use std::collections::BTreeMap;

/// Per drafter, per tenth of confidence: (tokens tried, accepted, first tokens tried, accepted).
#[derive(Default)]
pub struct Confidences {
    bands: BTreeMap<String, [[usize; 4]; 10]>,
}

impl Confidences {
    /// Counts the draft tokens of a generation's passes.
    pub fn add(&mut self, trace: &[PassTrace]) {
        for pass in trace {
            let Some(drafter) = &pass.drafter else {
                continue;
            };
            let bands = self.bands.entry(drafter.clone()).or_default();
            let tried = (pass.accepted + 1).min(pass.confidence.len());
            for (i, &c) in pass.confidence[..tried].iter().enumerate() {
                let band = &mut bands[((c * 10.0) as usize).min(9)];
                let accepted = usize::from(i < pass.accepted);
                band[0] += 1;
                band[1] += accepted;
                if i == 0 {
                    band[2] += 1;
                    band[3] += accepted;
                }
            }
        }
    }

    /// The table's header.
    pub fn print_header() {
        println!(
            "\nDraft tokens by the confidence their drafter gave them (tried: up to a pass's \
             first rejection):\n"
        );
        println!(
            "| set | drafter | confidence | tokens tried | accepted | first tokens tried | accepted |"
        );
        println!("|---|---|---|---:|---:|---:|---:|");
    }

    /// The table's rows of `set`.
    pub fn print_rows(&self, set: &str) {
        let share = |a: usize, n: usize| match n {
            0 => "–".to_string(),
            _ => format!("{:.2}", a as f64 / n as f64),
        };
        for (drafter, bands) in &self.bands {
            for (b, &[tried, accepted, first, first_accepted]) in bands.iter().enumerate() {
                if tried == 0 {
                    continue;
                }
                println!(
                    "| {set} | {drafter} | {:.1}–{:.1} | {tried} | {} | {first} | {} |",
                    b as f64 / 10.0,
                    (b + 1) as f64 / 10.0,
                    share(accepted, tried),
                    share(first_accepted, first)
                );
            }
        }
    }
}
