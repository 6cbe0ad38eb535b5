//! The ceiling of a set of drafters on one output (`policy`, `mix`, `repeated`): what a
//! policy that knew the output would reach with them; and a perfect drafter's bound, what no
//! drafter passes with the pass costs.

use infgram::decode::policy::{plausible_costs, CALIBRATED_SIZES};
use infgram::decode::{CostModel, Drafter};

/// The table cost and passes of writing `output` after `prompt` when each pass drafts exactly
/// the longest prefix of `output` that one of `drafters` proposes (at most 16 tokens).
pub fn ceiling(
    drafters: &mut [Box<dyn Drafter>],
    cost: &CostModel,
    prompt: &[u32],
    output: &[u32],
) -> (f64, usize) {
    let mut context = prompt.to_vec();
    let (mut at, mut modeled, mut passes) = (0, 0.0, 0);
    while at < output.len() {
        let max = 16.min(output.len() - at - 1);
        let mut right = 0;
        for d in drafters.iter_mut() {
            let draft = d.propose(&context, max).unwrap();
            let agree = draft.tokens.iter().zip(&output[at..]);
            right = right.max(agree.take_while(|(x, y)| x == y).count().min(max));
        }
        modeled += cost.cost(right + 1);
        passes += 1;
        context.extend_from_slice(&output[at..at + right + 1]);
        at += right + 1;
        for d in drafters.iter_mut() {
            d.observe(&context);
        }
    }
    (modeled, passes)
}

/// The table cost and passes of writing `len` tokens with a drafter that is always right: 16
/// draft tokens a pass (17 tokens), the rest in one last pass.
pub fn perfect(cost: &CostModel, len: usize) -> (f64, usize) {
    let (full, rest) = (len / 17, len % 17);
    let last = if rest > 0 { cost.cost(rest) } else { 0.0 };
    (
        full as f64 * cost.cost(17) + last,
        full + usize::from(rest > 0),
    )
}

/// A table given on the command line (`--costs`): the milliseconds of passes of
/// [`CALIBRATED_SIZES`] rows, as `(n, milliseconds)`; each must be one a machine could
/// measure ([`plausible_costs`]).
pub fn given_costs(ms: Vec<f64>) -> Vec<(usize, f64)> {
    let ms: Vec<(usize, f64)> = CALIBRATED_SIZES.into_iter().zip(ms).collect();
    assert!(
        plausible_costs(&ms),
        "--costs: the milliseconds of passes of {CALIBRATED_SIZES:?} rows, each one a \
         machine could measure (`plausible_costs`)"
    );
    ms
}

/// Measured pass costs as a line: "1 rows 2.65 ms, 2 rows …".
pub fn describe_costs(ms: &[(usize, f64)]) -> String {
    ms.iter()
        .map(|(n, ms)| format!("{n} rows {ms:.2} ms"))
        .collect::<Vec<_>>()
        .join(", ")
}
