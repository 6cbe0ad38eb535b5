//! Where the rows of a token tree go in one pass of the native model.
//!
//! A tree arrives in preorder (each node after its parent), node 0 the child of the cached
//! context. Node i stands at position `cached + depth(i)` of its branch, and is fed at slot
//! `cached + slot(i)` of the cache; attention lets it see only the cached positions and its
//! ancestors ([`TreeRows`]). For its output to be the same bits as in a chain, its slot must
//! have the parity of its position: the attention sums weighted values over even and odd
//! slots apart. Preorder keeps every node after its ancestors; where a node would land on the
//! wrong parity (an earlier sibling's subtree of odd size lies between it and its parent), a
//! padding row goes first: a copy of the node's token that nobody sees and whose row nobody
//! reads. A chain needs none; a tree needs at most one per branch.
//!
//! After verification, [`TreeLayout::slots_of`] gives the slots of the accepted path, which
//! the decoder moves to consecutive positions (`KvCache::keep_slots`): the cache then holds
//! exactly what feeding the path as a chain would have written.

use crate::error::{Error, Result};
use crate::neural::native::attention::TreeRows;

/// Rows a tree pass holds at most (a row's visible rows are the bits of a `u64`).
pub const MAX_TREE_ROWS: usize = 64;

/// A tree's rows in a pass: slots, depths, what each sees, and the padding rows.
#[derive(Clone, Debug, Default)]
pub struct TreeLayout {
    /// The token fed at each slot (padding rows included).
    pub tokens: Vec<u32>,
    /// Each slot's depth (its position past the cached context).
    pub depth: Vec<usize>,
    /// Each slot's visible slots (ancestors and itself), as bits.
    pub visible: Vec<u64>,
    /// The slot of each node of the tree as given.
    pub slot: Vec<usize>,
    /// Whether each slot is a padding row.
    pub padding: Vec<bool>,
}

impl TreeLayout {
    /// The layout of a tree in preorder: node i holds `tokens[i]` and follows `parents[i]`
    /// (`None`: the cached context; only node 0).
    pub fn new(tokens: &[u32], parents: &[Option<usize>]) -> Result<TreeLayout> {
        crate::lm::check_tree(tokens.len(), parents)?;
        let mut l = TreeLayout::default();
        for (&token, &parent) in tokens.iter().zip(parents) {
            let (depth, above) = match parent {
                None => (0, 0u64),
                Some(p) => {
                    let s = l.slot[p];
                    (l.depth[s] + 1, l.visible[s])
                }
            };
            if l.tokens.len() % 2 != depth % 2 {
                l.push(token, depth, above, true);
            }
            l.slot.push(l.tokens.len());
            l.push(token, depth, above, false);
            if l.tokens.len() > MAX_TREE_ROWS {
                return Err(Error::input(format!(
                    "a token tree needs more than {MAX_TREE_ROWS} rows"
                )));
            }
        }
        Ok(l)
    }

    fn push(&mut self, token: u32, depth: usize, above: u64, padding: bool) {
        let slot = self.tokens.len();
        self.tokens.push(token);
        self.depth.push(depth);
        self.visible.push(above | 1 << slot);
        self.padding.push(padding);
    }

    /// The attention's view of the rows.
    pub fn rows(&self) -> TreeRows<'_> {
        TreeRows {
            depth: &self.depth,
            visible: &self.visible,
        }
    }

    /// The slots of `nodes` (a path from node 0, each the parent of the next), refused when
    /// they are not one.
    pub fn slots_of(&self, nodes: &[usize]) -> Result<Vec<usize>> {
        let mut slots = Vec::with_capacity(nodes.len());
        for (k, &n) in nodes.iter().enumerate() {
            let Some(&s) = self.slot.get(n) else {
                return Err(Error::input(format!("node {n} is not in the tree")));
            };
            let above = slots.last().map_or(0, |&p: &usize| self.visible[p]);
            if self.depth[s] != k || self.visible[s] != above | 1 << s {
                return Err(Error::input(format!(
                    "nodes {nodes:?} are not a path from the tree's first node"
                )));
            }
            slots.push(s);
        }
        Ok(slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_keep_the_parity_of_positions_and_padding_goes_where_needed() {
        // A chain: no padding.
        let chain = TreeLayout::new(&[5, 6, 7], &[None, Some(0), Some(1)]).unwrap();
        assert_eq!(chain.slot, vec![0, 1, 2]);
        assert!(chain.padding.iter().all(|p| !p));
        // 0 → 1 → 2, and 0 → 3: node 3 (depth 1) would land on slot 3, odd: fine. Then
        // 0 → 3 → 4 (depth 2) at slot 4: fine. And a second root child of node 0's parent is
        // refused (one root).
        let t = TreeLayout::new(
            &[5, 6, 7, 8, 9],
            &[None, Some(0), Some(1), Some(0), Some(3)],
        )
        .unwrap();
        assert_eq!(t.slot, vec![0, 1, 2, 3, 4]);
        // 0 → 1 → 2 → 3, and 0 → 4 (depth 1): slot 4 is even, so a padding row goes first.
        let t = TreeLayout::new(
            &[5, 6, 7, 8, 9],
            &[None, Some(0), Some(1), Some(2), Some(0)],
        )
        .unwrap();
        assert_eq!(t.slot, vec![0, 1, 2, 3, 5]);
        assert_eq!(t.padding, vec![false, false, false, false, true, false]);
        for (s, &d) in t.depth.iter().enumerate() {
            assert!(t.padding[s] || s % 2 == d % 2);
        }
        // Node 4 sees node 0 and itself only.
        assert_eq!(t.visible[5], 0b100001);
        assert_eq!(t.slots_of(&[0, 4]).unwrap(), vec![0, 5]);
        assert!(t.slots_of(&[0, 2]).is_err());
        assert!(t.slots_of(&[1]).is_err());
        assert!(TreeLayout::new(&[1, 2], &[None, None]).is_err());
        assert!(TreeLayout::new(&[1, 2], &[None, Some(1)]).is_err());
    }
}
