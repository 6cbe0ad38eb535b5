//! The ceiling of a set of drafters on one output (`policy`, `mix`): what a policy
//! that knew the output would reach with them.

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
