//! `RankTree`: an order-statistic B+tree. Every inner node keeps the entry count of each child, so the
//! rank of an entry and the entry at a rank are found in one descent (O(log n)), and a page of a
//! ranking costs one descent per leaf it touches.
//!
//! Nodes live in two arenas (leaves and inner nodes) addressed by `u32`, so the tree is a few large
//! allocations and nothing is reference-counted. A node that becomes empty is unlinked and recycled;
//! nodes that merely shrink are not merged (deletes are rare next to updates, and a restore rebuilds the
//! tree packed).

/// Entries per leaf before it splits. 64 entries of 32 bytes: a leaf is 2 KiB, a few cache pages.
const LEAF_ENTRIES_MAX: usize = 64;
/// Children per inner node before it splits.
const INNER_CHILDREN_MAX: usize = 64;
/// How full a bulk-built node is, so that the first inserts after a restore do not all split.
const BULK_FILL: usize = 48;

/// A position in a ranking. Entries are unique and ordered by `(key, tie, member)`; the first entry is
/// rank 1. `key` is the score mapped so that better sorts first; `tie` orders equal scores; `member`
/// makes entries unique even if two ties collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub key: u128,
    pub tie: u64,
    pub member: u32,
}

#[derive(Debug, Default)]
struct Leaf {
    entries: Vec<Entry>,
}

#[derive(Debug, Default)]
struct Inner {
    /// `separators[i]` is the smallest entry that may live in `children[i + 1]`.
    separators: Vec<Entry>,
    children: Vec<u32>,
    /// Entries below each child.
    counts: Vec<u32>,
}

impl Inner {
    fn child_for(&self, entry: &Entry) -> usize {
        self.separators.partition_point(|s| s <= entry)
    }

    fn remove_child(&mut self, index: usize) {
        self.children.remove(index);
        self.counts.remove(index);
        if !self.separators.is_empty() {
            self.separators.remove(index.saturating_sub(1));
        }
    }
}

/// What a node hands its parent after an insert made it split: the right half and its first entry.
struct Split {
    separator: Entry,
    right: u32,
    right_count: u32,
}

#[derive(Debug)]
pub struct RankTree {
    leaves: Vec<Leaf>,
    inners: Vec<Inner>,
    free_leaves: Vec<u32>,
    free_inners: Vec<u32>,
    root: u32,
    /// 0 when the root is a leaf; the children of a node at height 1 are leaves.
    height: u32,
    len: usize,
}

impl Default for RankTree {
    fn default() -> Self {
        Self {
            leaves: vec![Leaf::default()],
            inners: Vec::new(),
            free_leaves: Vec::new(),
            free_inners: Vec::new(),
            root: 0,
            height: 0,
            len: 0,
        }
    }
}

impl RankTree {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Builds a packed tree from entries in ascending order (a snapshot's).
    pub fn from_sorted(entries: &[Entry]) -> Self {
        assert!(
            entries.windows(2).all(|w| w[0] < w[1]),
            "bulk-built entries must be strictly ascending"
        );
        let mut tree = Self::default();
        if entries.is_empty() {
            return tree;
        }
        tree.leaves.clear();
        // (node, first entry, entry count) of the level being built.
        let mut level: Vec<(u32, Entry, u32)> = entries
            .chunks(BULK_FILL)
            .map(|chunk| {
                tree.leaves.push(Leaf {
                    entries: chunk.to_vec(),
                });
                (
                    arena_index(tree.leaves.len() - 1),
                    chunk[0],
                    chunk.len() as u32,
                )
            })
            .collect();
        while level.len() > 1 {
            tree.height += 1;
            level = level
                .chunks(BULK_FILL)
                .map(|chunk| {
                    tree.inners.push(Inner {
                        separators: chunk[1..].iter().map(|c| c.1).collect(),
                        children: chunk.iter().map(|c| c.0).collect(),
                        counts: chunk.iter().map(|c| c.2).collect(),
                    });
                    let count = chunk.iter().map(|c| c.2).sum();
                    (arena_index(tree.inners.len() - 1), chunk[0].1, count)
                })
                .collect();
        }
        tree.root = level[0].0;
        tree.len = entries.len();
        tree
    }

    /// Adds an entry that is not in the tree.
    pub fn insert(&mut self, entry: Entry) {
        if let Some(split) = self.insert_below(self.root, self.height, entry) {
            let left_count =
                u32::try_from(self.len + 1).expect("at most u32::MAX entries") - split.right_count;
            let root = self.new_inner(Inner {
                separators: vec![split.separator],
                children: vec![self.root, split.right],
                counts: vec![left_count, split.right_count],
            });
            self.root = root;
            self.height += 1;
        }
        self.len += 1;
    }

    fn insert_below(&mut self, node: u32, height: u32, entry: Entry) -> Option<Split> {
        if height == 0 {
            let leaf = &mut self.leaves[node as usize];
            let at = leaf.entries.partition_point(|e| *e < entry);
            debug_assert!(
                leaf.entries.get(at) != Some(&entry),
                "entry already present"
            );
            leaf.entries.insert(at, entry);
            if leaf.entries.len() <= LEAF_ENTRIES_MAX {
                return None;
            }
            let right_entries = leaf.entries.split_off(leaf.entries.len() / 2);
            let separator = right_entries[0];
            let right_count = right_entries.len() as u32;
            let right = self.new_leaf(Leaf {
                entries: right_entries,
            });
            return Some(Split {
                separator,
                right,
                right_count,
            });
        }
        let inner = &mut self.inners[node as usize];
        let at = inner.child_for(&entry);
        inner.counts[at] += 1;
        let child = inner.children[at];
        let split = self.insert_below(child, height - 1, entry)?;
        let inner = &mut self.inners[node as usize];
        inner.counts[at] -= split.right_count;
        inner.separators.insert(at, split.separator);
        inner.children.insert(at + 1, split.right);
        inner.counts.insert(at + 1, split.right_count);
        if inner.children.len() <= INNER_CHILDREN_MAX {
            return None;
        }
        let middle = inner.children.len() / 2;
        let children = inner.children.split_off(middle);
        let counts = inner.counts.split_off(middle);
        let mut separators = inner.separators.split_off(middle - 1);
        let separator = separators.remove(0);
        let right_count = counts.iter().sum();
        let right = self.new_inner(Inner {
            separators,
            children,
            counts,
        });
        Some(Split {
            separator,
            right,
            right_count,
        })
    }

    /// Removes an entry; returns whether it was there.
    pub fn remove(&mut self, entry: &Entry) -> bool {
        if !self.contains(entry) {
            return false;
        }
        let emptied = self.remove_below(self.root, self.height, entry);
        self.len -= 1;
        if emptied {
            // Only the root can be left empty: the tree is empty again.
            debug_assert_eq!(self.len, 0);
            *self = Self::default();
            return true;
        }
        while self.height > 0 && self.inners[self.root as usize].children.len() == 1 {
            let only = self.inners[self.root as usize].children[0];
            self.free_inner(self.root);
            self.root = only;
            self.height -= 1;
        }
        true
    }

    /// Removes a present entry below `node`; returns whether `node` is now empty.
    fn remove_below(&mut self, node: u32, height: u32, entry: &Entry) -> bool {
        if height == 0 {
            let leaf = &mut self.leaves[node as usize];
            let at = leaf.entries.partition_point(|e| e < entry);
            debug_assert_eq!(leaf.entries.get(at), Some(entry));
            leaf.entries.remove(at);
            return leaf.entries.is_empty();
        }
        let inner = &mut self.inners[node as usize];
        let at = inner.child_for(entry);
        inner.counts[at] -= 1;
        let child = inner.children[at];
        if self.remove_below(child, height - 1, entry) {
            if height == 1 {
                self.free_leaf(child);
            } else {
                self.free_inner(child);
            }
            let inner = &mut self.inners[node as usize];
            inner.remove_child(at);
            return inner.children.is_empty();
        }
        false
    }

    /// Replaces `old` (present) by `new` (absent). When `new` belongs in the same leaf, which is common for
    /// small score changes, the leaf's entries are rotated in place and no count changes.
    pub fn replace(&mut self, old: &Entry, new: Entry) {
        let (mut node, mut low, mut high) = (self.root, None, None);
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            let at = inner.child_for(old);
            if at > 0 {
                low = Some(inner.separators[at - 1]);
            }
            if at < inner.separators.len() {
                high = Some(inner.separators[at]);
            }
            node = inner.children[at];
        }
        let fits = low.is_none_or(|l| l <= new) && high.is_none_or(|h| new < h);
        if !fits {
            let removed = self.remove(old);
            debug_assert!(removed, "replaced entry must be present");
            self.insert(new);
            return;
        }
        let entries = &mut self.leaves[node as usize].entries;
        let from = entries.partition_point(|e| e < old);
        debug_assert_eq!(
            entries.get(from),
            Some(old),
            "replaced entry must be present"
        );
        let to = entries.partition_point(|e| *e < new);
        if to > from {
            // `new` goes after entries that currently sit after `old`: shift them left by one.
            entries[from..to].rotate_left(1);
            entries[to - 1] = new;
        } else {
            entries[to..=from].rotate_right(1);
            entries[to] = new;
        }
    }

    pub fn contains(&self, entry: &Entry) -> bool {
        let leaf = self.leaf_for(entry);
        self.leaves[leaf as usize]
            .entries
            .binary_search(entry)
            .is_ok()
    }

    fn leaf_for(&self, entry: &Entry) -> u32 {
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            node = inner.children[inner.child_for(entry)];
        }
        node
    }

    /// How many entries sort before `entry` (its 0-based position when present).
    pub fn count_before(&self, entry: &Entry) -> usize {
        self.count_until(entry, false)
    }

    /// How many entries sort before or equal `entry`.
    pub fn count_through(&self, entry: &Entry) -> usize {
        self.count_until(entry, true)
    }

    fn count_until(&self, entry: &Entry, inclusive: bool) -> usize {
        let mut node = self.root;
        let mut before = 0usize;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            let at = inner.child_for(entry);
            before += inner.counts[..at]
                .iter()
                .map(|&c| c as usize)
                .sum::<usize>();
            node = inner.children[at];
        }
        let entries = &self.leaves[node as usize].entries;
        before
            + if inclusive {
                entries.partition_point(|e| e <= entry)
            } else {
                entries.partition_point(|e| e < entry)
            }
    }

    /// The leaf holding the entry at 0-based `position` (< len) and its index in that leaf.
    fn locate(&self, mut position: usize) -> (u32, usize) {
        debug_assert!(position < self.len);
        let mut node = self.root;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            let mut at = 0;
            while position >= inner.counts[at] as usize {
                position -= inner.counts[at] as usize;
                at += 1;
            }
            node = inner.children[at];
        }
        (node, position)
    }

    /// The entry at 0-based `position`.
    pub fn get(&self, position: usize) -> Option<Entry> {
        if position >= self.len {
            return None;
        }
        let (leaf, index) = self.locate(position);
        Some(self.leaves[leaf as usize].entries[index])
    }

    /// Up to `limit` entries from 0-based `start`, in order; one descent per leaf touched.
    pub fn range(&self, start: usize, limit: usize) -> Vec<Entry> {
        let end = start.saturating_add(limit).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        while start + out.len() < end {
            let (leaf, index) = self.locate(start + out.len());
            let entries = &self.leaves[leaf as usize].entries[index..];
            let wanted = end - start - out.len();
            out.extend_from_slice(&entries[..wanted.min(entries.len())]);
        }
        out
    }

    /// Every entry in order (snapshots); one descent per leaf.
    pub fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        let mut position = 0;
        std::iter::from_fn(move || {
            if position >= self.len {
                return None;
            }
            let (leaf, index) = self.locate(position);
            let entries = &self.leaves[leaf as usize].entries[index..];
            position += entries.len();
            Some(entries)
        })
        .flatten()
        .copied()
    }

    fn new_leaf(&mut self, leaf: Leaf) -> u32 {
        if let Some(index) = self.free_leaves.pop() {
            self.leaves[index as usize] = leaf;
            return index;
        }
        self.leaves.push(leaf);
        arena_index(self.leaves.len() - 1)
    }

    fn new_inner(&mut self, inner: Inner) -> u32 {
        if let Some(index) = self.free_inners.pop() {
            self.inners[index as usize] = inner;
            return index;
        }
        self.inners.push(inner);
        arena_index(self.inners.len() - 1)
    }

    fn free_leaf(&mut self, index: u32) {
        self.leaves[index as usize] = Leaf::default();
        self.free_leaves.push(index);
    }

    fn free_inner(&mut self, index: u32) {
        self.inners[index as usize] = Inner::default();
        self.free_inners.push(index);
    }

    /// Checks every structural invariant; tests call it after each step.
    #[cfg(test)]
    pub fn check(&self) {
        let (count, _, _) = self.check_node(self.root, self.height);
        assert_eq!(count, self.len, "root count");
    }

    #[cfg(test)]
    fn check_node(&self, node: u32, height: u32) -> (usize, Option<Entry>, Option<Entry>) {
        if height == 0 {
            let entries = &self.leaves[node as usize].entries;
            assert!(entries.windows(2).all(|w| w[0] < w[1]), "leaf sorted");
            assert!(entries.len() <= LEAF_ENTRIES_MAX);
            return (
                entries.len(),
                entries.first().copied(),
                entries.last().copied(),
            );
        }
        let inner = &self.inners[node as usize];
        assert!(!inner.children.is_empty() && inner.children.len() <= INNER_CHILDREN_MAX);
        assert_eq!(inner.separators.len() + 1, inner.children.len());
        let (mut total, mut first, mut last) = (0, None, None);
        for (at, (&child, &count)) in inner.children.iter().zip(&inner.counts).enumerate() {
            let (below, low, high) = self.check_node(child, height - 1);
            assert_eq!(below, count as usize, "child count");
            assert!(below > 0, "no empty child stays linked");
            if at > 0 {
                assert!(inner.separators[at - 1] <= low.expect("non-empty"));
            }
            if at < inner.separators.len() {
                assert!(high.expect("non-empty") < inner.separators[at]);
            }
            total += below;
            first = first.or(low);
            last = high.or(last);
        }
        (total, first, last)
    }
}

fn arena_index(index: usize) -> u32 {
    u32::try_from(index).expect("at most u32::MAX nodes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(key: u128, member: u32) -> Entry {
        Entry {
            key,
            tie: 0,
            member,
        }
    }

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u16, u32),
        Remove(usize),
        Replace(usize, u16),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (any::<u16>(), any::<u32>()).prop_map(|(k, m)| Step::Insert(k, m)),
            2 => any::<usize>().prop_map(Step::Remove),
            3 => (any::<usize>(), any::<u16>()).prop_map(|(i, k)| Step::Replace(i, k)),
        ]
    }

    /// The reference: a sorted, deduplicated Vec.
    fn check_against(tree: &RankTree, model: &[Entry]) {
        tree.check();
        assert_eq!(tree.len(), model.len());
        assert_eq!(tree.iter().collect::<Vec<_>>(), model);
        for (position, e) in model.iter().enumerate().step_by(7) {
            assert_eq!(tree.count_before(e), position);
            assert_eq!(tree.count_through(e), position + 1);
            assert_eq!(tree.get(position), Some(*e));
            assert!(tree.contains(e));
            assert_eq!(
                tree.range(position, 5),
                model[position..]
                    .iter()
                    .take(5)
                    .copied()
                    .collect::<Vec<_>>()
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_a_sorted_vec(start in proptest::collection::vec((any::<u16>(), any::<u32>()), 0..600), steps in proptest::collection::vec(step(), 0..1500)) {
            let mut model: Vec<Entry> = start.iter().map(|&(k, m)| entry(u128::from(k), m)).collect();
            model.sort();
            model.dedup();
            let mut tree = RankTree::from_sorted(&model);
            check_against(&tree, &model);
            for step in steps {
                match step {
                    Step::Insert(k, m) => {
                        let e = entry(u128::from(k), m);
                        if let Err(at) = model.binary_search(&e) {
                            model.insert(at, e);
                            tree.insert(e);
                        } else {
                            prop_assert!(tree.contains(&e));
                        }
                    }
                    Step::Remove(i) if !model.is_empty() => {
                        let e = model.remove(i % model.len());
                        prop_assert!(tree.remove(&e));
                        prop_assert!(!tree.remove(&e));
                    }
                    Step::Replace(i, k) if !model.is_empty() => {
                        let old = model.remove(i % model.len());
                        let new = Entry { key: u128::from(k), ..old };
                        let at = model.binary_search(&new).expect_err("member makes entries unique");
                        model.insert(at, new);
                        tree.replace(&old, new);
                    }
                    _ => {}
                }
                tree.check();
            }
            check_against(&tree, &model);
        }
    }

    #[test]
    fn grows_and_shrinks_through_several_levels() {
        let mut tree = RankTree::default();
        let count = 200_000u32;
        for member in 0..count {
            tree.insert(entry(
                u128::from(member.wrapping_mul(2_654_435_761) % 1_000_003),
                member,
            ));
        }
        tree.check();
        assert!(tree.height >= 2, "height {}", tree.height);
        let all: Vec<Entry> = tree.iter().collect();
        for e in &all {
            assert!(tree.remove(e));
        }
        tree.check();
        assert!(tree.is_empty());
        assert_eq!(tree.height, 0);
        assert_eq!(tree.get(0), None);
        assert!(tree.range(0, 10).is_empty());
    }
}
