//! Drafting for an engine that verifies elsewhere: the decode loop's drafters and drafting
//! policy ([`super::policy`]) behind a session an outside loop drives. The engine starts a
//! session with its prompt, asks for a draft (a chain, or a token tree where the drafters
//! part ways), verifies it with its own model, and extends the session with the tokens it
//! kept; the session learns from what was accepted as the decode loop does (each drafter's
//! calibration and current run). Planning is the decode loop's own (`DraftPolicy::plan`,
//! the same draft tree), with the cost model's prior table frozen: an outside model's pass
//! costs are not measured here, so the same calls give the same drafts.

use super::policy::{CostModel, DraftPolicy, Planned};
use super::{DecodeConfig, DraftTree, Drafter};
use crate::error::{Error, Result};
use serde::Serialize;

/// Rows a draft tree may have at most (the pending token's included).
pub const MAX_TREE_ROWS: usize = 64;

/// A draft for an engine: token `i` follows node `parents[i]` (`None`: the context's end),
/// with its drafter's probability and the drafter that proposed it. A chain has parents
/// `None, 0, 1, …`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SessionDraft {
    /// The draft's tokens, the main chain first, then each branch.
    pub token_ids: Vec<u32>,
    /// The node each token follows (`None`: the last token of the context).
    pub parents: Vec<Option<usize>>,
    /// The drafter's probability of each token (its confidence, as proposed).
    pub probs: Vec<f64>,
    /// The drafter (or part of one) that proposed each token.
    pub sources: Vec<String>,
}

/// One request's drafting state: its context, the drafters and the policy.
pub struct DraftSession {
    drafters: Vec<Box<dyn Drafter>>,
    policy: DraftPolicy,
    cfg: DecodeConfig,
    context: Vec<u32>,
    prompt_len: usize,
    /// The last draft, until the engine extends the context.
    last: Option<(Planned, DraftTree)>,
}

impl DraftSession {
    /// A session over `drafters` (asked in order, as the decode loop asks them) after
    /// `prompt`.
    pub fn start(drafters: Vec<Box<dyn Drafter>>, prompt: &[u32]) -> Self {
        let cfg = DecodeConfig {
            cost: CostModel::default().frozen(),
            ..Default::default()
        };
        // As in the decode loop, the drafters read the prompt when first asked.
        DraftSession {
            policy: DraftPolicy::new(drafters.len(), cfg.cost.clone()),
            drafters,
            cfg,
            context: prompt.to_vec(),
            prompt_len: prompt.len(),
            last: None,
        }
    }

    /// Bytes the session holds: its context, what its drafters keep of it, and the last
    /// draft (an estimate of the heap it owns, by capacities; shared indexes not counted).
    pub fn bytes(&self) -> usize {
        let last = self.last.as_ref().map_or(0, |(planned, tree)| {
            let rows = tree.tokens.len() + planned.draft.tokens.len();
            rows * 32 + planned.branches.len() * 64
        });
        std::mem::size_of::<Self>()
            + 4 * self.context.capacity()
            + self.drafters.iter().map(|d| d.bytes() + 64).sum::<usize>()
            + last
    }

    /// The drafters read the prompt now rather than when first asked (the same drafts; what
    /// the session holds is then known from its start).
    pub fn observe_prompt(&mut self) {
        for d in self.drafters.iter_mut() {
            d.observe(&self.context);
        }
    }

    /// The context so far: the prompt and every token extended.
    pub fn context(&self) -> &[u32] {
        &self.context
    }

    /// The tokens extended after the prompt (the output, for the past outputs).
    pub fn output(&self) -> &[u32] {
        &self.context[self.prompt_len..]
    }

    /// A draft of at most `max_tokens` tokens to follow the context (empty when no drafter
    /// has one worth verifying); with `tree`, the other drafters' drafts hang off the main
    /// one where they part from it and pay for their rows.
    pub fn draft(&mut self, max_tokens: usize, tree: bool) -> Result<SessionDraft> {
        if self.context.is_empty() {
            return Err(Error::input(
                "a draft follows a context: start the request with at least one token",
            ));
        }
        let cfg = DecodeConfig {
            draft_max: max_tokens,
            ..self.cfg.clone()
        };
        let rows = match tree && self.drafters.len() > 1 {
            true => MAX_TREE_ROWS,
            false => 0,
        };
        let planned = self.policy.plan(
            &mut self.drafters,
            &mut [],
            &self.context,
            &cfg,
            max_tokens + 1,
            rows,
        )?;
        let tree = DraftTree::of(&planned);
        let mut probs = planned.draft.confidence.clone();
        for b in &planned.branches {
            probs.extend_from_slice(&b.draft.confidence);
        }
        let draft = SessionDraft {
            token_ids: tree.tokens[1..].to_vec(),
            parents: tree.parents[1..]
                .iter()
                .map(|p| p.and_then(|p| p.checked_sub(1)))
                .collect(),
            probs,
            sources: tree.source[1..]
                .iter()
                .map(|&(d, part)| {
                    let drafter = &self.drafters[d];
                    match part {
                        Some(part) => drafter.part_name(part).to_string(),
                        None => drafter.name().to_string(),
                    }
                })
                .collect(),
        };
        self.last = Some((planned, tree));
        Ok(draft)
    }

    /// The engine kept `new_ids` after the context (the accepted draft tokens and its own
    /// next token, or any tokens at all): the drafters learn them, and the policy learns how
    /// much of the last draft was accepted.
    pub fn extend(&mut self, new_ids: &[u32]) {
        if let Some((planned, tree)) = self.last.take() {
            let path = tree.follow(new_ids);
            let (on_main, branch) = tree.split_path(&path);
            self.policy.learn(&planned, on_main, branch, None, 0.0);
        }
        if new_ids.is_empty() {
            return;
        }
        self.context.extend_from_slice(new_ids);
        for d in self.drafters.iter_mut() {
            d.observe(&self.context);
        }
    }
}
