//! `RankTree`: an order-statistic B+tree. Every inner node keeps the entry count of each child, so the
//! rank of an entry and the entry at a rank are found in one descent (O(log n)), and a page of a
//! ranking costs one descent per leaf it touches.
//!
//! Nodes live in two arenas (leaves and inner nodes) addressed by `u32`, so the tree is a few large
//! allocations and nothing is reference-counted. A leaf left less than a quarter full merges with a
//! sibling when both fit in one; an inner node is unlinked once empty (inner nodes are 1/48 of the leaves,
//! and a restore rebuilds the tree packed).

/// Entries a leaf holds. 64 entries of 32 bytes: a leaf is 2 KiB, which a descent prefetches at once.
const LEAF_ENTRIES_MAX: usize = 64;
/// A leaf left with fewer entries than this after a remove is merged with a sibling if both fit in one.
const LEAF_MERGE_BELOW: usize = LEAF_ENTRIES_MAX / 4;
/// Children an inner node holds.
const INNER_CHILDREN_MAX: usize = 64;
/// How full a bulk-built node is, so that the first inserts after a restore do not all split.
const BULK_FILL: usize = 48;
/// Levels a tree may have: 64^8 entries is far beyond any board.
const HEIGHT_MAX: usize = 8;

/// A position in a ranking. Entries are unique and ordered by `(key, tie, member)`; the first entry is
/// rank 1. `key` is the score mapped so that better sorts first; `tie` orders equal scores; `member`
/// makes entries unique even if two ties collide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub key: u128,
    pub tie: u64,
    pub member: u32,
}

/// Nodes are fixed-size arrays inside the arena's one allocation: a node is one contiguous block that a
/// descent can prefetch whole, and splitting never calls the allocator. `repr(C)` keeps `len` on a node's
/// first cache line, next to the first entries, instead of wherever the compiler would put it.
#[derive(Clone)]
#[repr(C)]
struct Leaf {
    len: usize,
    entries: [Entry; LEAF_ENTRIES_MAX],
}

#[derive(Clone)]
#[repr(C)]
struct Inner {
    len: usize,
    children: [u32; INNER_CHILDREN_MAX],
    /// Entries below each child.
    counts: [u32; INNER_CHILDREN_MAX],
    /// `separators[i]` is the smallest entry that may live in `children[i + 1]`.
    separators: [Entry; INNER_CHILDREN_MAX - 1],
}

impl Default for Leaf {
    fn default() -> Self {
        Self {
            len: 0,
            entries: [Entry::default(); LEAF_ENTRIES_MAX],
        }
    }
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            len: 0,
            children: [0; INNER_CHILDREN_MAX],
            counts: [0; INNER_CHILDREN_MAX],
            separators: [Entry::default(); INNER_CHILDREN_MAX - 1],
        }
    }
}

impl Leaf {
    fn entries(&self) -> &[Entry] {
        &self.entries[..self.len]
    }

    fn insert(&mut self, at: usize, entry: Entry) {
        debug_assert!(self.len < LEAF_ENTRIES_MAX && at <= self.len);
        self.entries.copy_within(at..self.len, at + 1);
        self.entries[at] = entry;
        self.len += 1;
    }

    fn remove(&mut self, at: usize) {
        debug_assert!(at < self.len);
        self.entries.copy_within(at + 1..self.len, at);
        self.len -= 1;
    }
}

impl Inner {
    fn separators(&self) -> &[Entry] {
        &self.separators[..self.len.saturating_sub(1)]
    }

    fn child_for(&self, entry: &Entry) -> usize {
        self.separators().partition_point(|s| s <= entry)
    }

    /// Links `child` (holding `count` entries, all at or after `separator`) right after child `at`.
    fn insert_child(&mut self, at: usize, separator: Entry, child: u32, count: u32) {
        debug_assert!(self.len < INNER_CHILDREN_MAX && at < self.len);
        self.separators.copy_within(at..self.len - 1, at + 1);
        self.separators[at] = separator;
        self.children.copy_within(at + 1..self.len, at + 2);
        self.children[at + 1] = child;
        self.counts.copy_within(at + 1..self.len, at + 2);
        self.counts[at + 1] = count;
        self.len += 1;
    }

    fn remove_child(&mut self, at: usize) {
        debug_assert!(at < self.len);
        if self.len > 1 {
            let separator = at.saturating_sub(1);
            self.separators
                .copy_within(separator + 1..self.len - 1, separator);
        }
        self.children.copy_within(at + 1..self.len, at);
        self.counts.copy_within(at + 1..self.len, at);
        self.len -= 1;
    }

    fn count_before(&self, at: usize) -> usize {
        self.counts[..at].iter().map(|&c| c as usize).sum()
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn prefetch<T>(items: &[T]) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let start = items.as_ptr().cast::<u8>();
    for offset in (0..std::mem::size_of_val(items)).step_by(64) {
        // SAFETY: a prefetch is a hint; it never faults and never dereferences in a way Rust can observe.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset).cast()) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn prefetch<T>(_items: &[T]) {}

/// What a node hands its parent after an insert made it split: the right half and its first entry.
struct Split {
    separator: Entry,
    right: u32,
    right_count: u32,
}

/// The inner nodes a descent passed and the child taken at each, root first.
#[derive(Default)]
struct Path {
    steps: [(u32, usize); HEIGHT_MAX],
    len: usize,
}

pub struct RankTree {
    leaves: Vec<Leaf>,
    inners: Vec<Inner>,
    free_leaves: Vec<u32>,
    free_inners: Vec<u32>,
    root: u32,
    /// 0 when the root is a leaf; the children of a node at height 1 are leaves.
    height: usize,
    len: usize,
}

impl std::fmt::Debug for RankTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankTree")
            .field("len", &self.len)
            .field("height", &self.height)
            .finish_non_exhaustive()
    }
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
                let mut leaf = Leaf::default();
                leaf.entries[..chunk.len()].copy_from_slice(chunk);
                leaf.len = chunk.len();
                tree.leaves.push(leaf);
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
                    let mut inner = Inner {
                        len: chunk.len(),
                        ..Inner::default()
                    };
                    for (i, &(child, first, count)) in chunk.iter().enumerate() {
                        inner.children[i] = child;
                        inner.counts[i] = count;
                        if i > 0 {
                            inner.separators[i - 1] = first;
                        }
                    }
                    tree.inners.push(inner);
                    let count = chunk.iter().map(|c| c.2).sum();
                    (arena_index(tree.inners.len() - 1), chunk[0].1, count)
                })
                .collect();
        }
        assert!(tree.height < HEIGHT_MAX);
        tree.root = level[0].0;
        tree.len = entries.len();
        tree
    }

    /// Adds an entry that is not in the tree.
    pub fn insert(&mut self, entry: Entry) {
        if let Some(split) = self.insert_below(self.root, self.height, entry) {
            let left_count =
                u32::try_from(self.len + 1).expect("at most u32::MAX entries") - split.right_count;
            let mut root = Inner {
                len: 2,
                ..Inner::default()
            };
            root.separators[0] = split.separator;
            root.children[..2].copy_from_slice(&[self.root, split.right]);
            root.counts[..2].copy_from_slice(&[left_count, split.right_count]);
            self.root = self.new_inner(root);
            self.height += 1;
            assert!(self.height < HEIGHT_MAX, "tree too tall");
        }
        self.len += 1;
    }

    fn insert_below(&mut self, node: u32, height: usize, entry: Entry) -> Option<Split> {
        if height == 0 {
            prefetch(std::slice::from_ref(&self.leaves[node as usize]));
            let leaf = &mut self.leaves[node as usize];
            let at = leaf.entries().partition_point(|e| *e < entry);
            debug_assert!(
                leaf.entries().get(at) != Some(&entry),
                "entry already present"
            );
            if leaf.len < LEAF_ENTRIES_MAX {
                leaf.insert(at, entry);
                return None;
            }
            let half = LEAF_ENTRIES_MAX / 2;
            let mut right = Leaf {
                len: LEAF_ENTRIES_MAX - half,
                ..Leaf::default()
            };
            right.entries[..right.len].copy_from_slice(&leaf.entries[half..]);
            leaf.len = half;
            if at <= half {
                leaf.insert(at, entry);
            } else {
                right.insert(at - half, entry);
            }
            let separator = right.entries[0];
            let right_count = right.len as u32;
            let right = self.new_leaf(right);
            return Some(Split {
                separator,
                right,
                right_count,
            });
        }
        let inner = &mut self.inners[node as usize];
        prefetch(inner.separators());
        let at = inner.child_for(&entry);
        inner.counts[at] += 1;
        let child = inner.children[at];
        let split = self.insert_below(child, height - 1, entry)?;
        let inner = &mut self.inners[node as usize];
        inner.counts[at] -= split.right_count;
        if inner.len < INNER_CHILDREN_MAX {
            inner.insert_child(at, split.separator, split.right, split.right_count);
            return None;
        }
        // Full: move the upper half of the children to a new node, then link the new child in its half.
        let half = INNER_CHILDREN_MAX / 2;
        let mut right = Inner {
            len: INNER_CHILDREN_MAX - half,
            ..Inner::default()
        };
        right.children[..right.len].copy_from_slice(&inner.children[half..]);
        right.counts[..right.len].copy_from_slice(&inner.counts[half..]);
        right.separators[..right.len - 1].copy_from_slice(&inner.separators[half..]);
        let separator = inner.separators[half - 1];
        inner.len = half;
        if at < half {
            inner.insert_child(at, split.separator, split.right, split.right_count);
        } else {
            right.insert_child(at - half, split.separator, split.right, split.right_count);
        }
        let right_count = right.counts[..right.len].iter().sum();
        let right = self.new_inner(right);
        Some(Split {
            separator,
            right,
            right_count,
        })
    }

    /// Descends towards `entry`, recording the way; returns the leaf.
    fn descend(&self, entry: &Entry, path: &mut Path) -> u32 {
        let mut node = self.root;
        path.len = 0;
        for _ in 0..self.height {
            let inner = &self.inners[node as usize];
            prefetch(inner.separators());
            let at = inner.child_for(entry);
            path.steps[path.len] = (node, at);
            path.len += 1;
            node = inner.children[at];
        }
        // The whole leaf at once, without reading its length first (that read would itself wait).
        prefetch(std::slice::from_ref(&self.leaves[node as usize]));
        node
    }

    /// Removes an entry; returns whether it was there.
    pub fn remove(&mut self, entry: &Entry) -> bool {
        let mut path = Path::default();
        let leaf = self.descend(entry, &mut path);
        match self.leaves[leaf as usize].entries().binary_search(entry) {
            Ok(at) => {
                self.remove_found(&path, leaf, at);
                true
            }
            Err(_) => false,
        }
    }

    /// Removes the entry at `at` of `leaf`, which `path` leads to.
    fn remove_found(&mut self, path: &Path, leaf: u32, at: usize) {
        self.leaves[leaf as usize].remove(at);
        self.len -= 1;
        for &(node, child) in &path.steps[..path.len] {
            self.inners[node as usize].counts[child] -= 1;
        }
        if path.len == 0 {
            return;
        }
        let (parent, child) = path.steps[path.len - 1];
        match self.leaves[leaf as usize].len {
            0 => self.unlink_empty_leaf(path, leaf),
            len if len < LEAF_MERGE_BELOW => self.merge_with_sibling(parent, child),
            _ => {}
        }
    }

    /// Unlinks an empty leaf, and any inner node that its removal empties.
    fn unlink_empty_leaf(&mut self, path: &Path, leaf: u32) {
        self.free_leaf(leaf);
        for &(node, child) in path.steps[..path.len].iter().rev() {
            let inner = &mut self.inners[node as usize];
            inner.remove_child(child);
            if inner.len > 0 {
                break;
            }
            self.free_inner(node);
            if node == self.root {
                // The root emptied: the tree is empty again.
                debug_assert_eq!(self.len, 0);
                *self = Self::default();
                return;
            }
        }
        self.collapse_root();
    }

    /// Moves a small leaf's entries into a sibling leaf (or the sibling's into it) when they fit in one,
    /// so that leaves stay reasonably full while scores drift (entries leave some leaves for good).
    fn merge_with_sibling(&mut self, parent: u32, child: usize) {
        let inner = &self.inners[parent as usize];
        let left = if child + 1 < inner.len {
            child
        } else if child > 0 {
            child - 1
        } else {
            return;
        };
        let (left_leaf, right_leaf) = (inner.children[left], inner.children[left + 1]);
        let (left_len, right_len) = (
            self.leaves[left_leaf as usize].len,
            self.leaves[right_leaf as usize].len,
        );
        if left_len + right_len > LEAF_ENTRIES_MAX {
            return;
        }
        let right_entries = self.leaves[right_leaf as usize].entries;
        let merged = &mut self.leaves[left_leaf as usize];
        merged.entries[left_len..left_len + right_len].copy_from_slice(&right_entries[..right_len]);
        merged.len += right_len;
        let inner = &mut self.inners[parent as usize];
        inner.counts[left] += inner.counts[left + 1];
        inner.remove_child(left + 1);
        self.free_leaf(right_leaf);
        self.collapse_root();
    }

    /// While the root has one child, that child becomes the root.
    fn collapse_root(&mut self) {
        while self.height > 0 && self.inners[self.root as usize].len == 1 {
            let only = self.inners[self.root as usize].children[0];
            self.free_inner(self.root);
            self.root = only;
            self.height -= 1;
        }
    }

    /// Replaces `old` (present) by `new` (absent). When `new` belongs in the same leaf, which is common for
    /// small score changes, the leaf's entries are shifted in place and no count changes; otherwise the
    /// descent that found `old` also removes it.
    pub fn replace(&mut self, old: &Entry, new: Entry) {
        let mut path = Path::default();
        let leaf = self.descend(old, &mut path);
        let (mut low, mut high) = (None, None);
        for &(node, at) in &path.steps[..path.len] {
            let separators = self.inners[node as usize].separators();
            if at > 0 {
                low = Some(separators[at - 1]);
            }
            if at < separators.len() {
                high = Some(separators[at]);
            }
        }
        let entries = &mut self.leaves[leaf as usize];
        let from = entries
            .entries()
            .binary_search(old)
            .expect("a replaced entry is present");
        let fits = low.is_none_or(|l| l <= new) && high.is_none_or(|h| new < h);
        if !fits {
            self.remove_found(&path, leaf, from);
            self.insert(new);
            return;
        }
        let to = entries.entries().partition_point(|e| *e < new);
        let slice = &mut entries.entries[..entries.len];
        if to > from {
            // `new` goes after entries that now sit after `old`: shift those left by one.
            slice.copy_within(from + 1..to, from);
            slice[to - 1] = new;
        } else {
            slice.copy_within(to..from, to + 1);
            slice[to] = new;
        }
    }

    pub fn contains(&self, entry: &Entry) -> bool {
        let leaf = self.descend(entry, &mut Path::default());
        self.leaves[leaf as usize]
            .entries()
            .binary_search(entry)
            .is_ok()
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
        let mut path = Path::default();
        let leaf = self.descend(entry, &mut path);
        let before: usize = path.steps[..path.len]
            .iter()
            .map(|&(node, at)| self.inners[node as usize].count_before(at))
            .sum();
        let entries = self.leaves[leaf as usize].entries();
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
            let entries = &self.leaves[leaf as usize].entries()[index..];
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
            let entries = &self.leaves[leaf as usize].entries()[index..];
            position += entries.len();
            Some(entries)
        })
        .flatten()
        .copied()
    }

    /// Starts loading the leaf where `entry` lives (or would go) into the cache; the descent reads only
    /// inner nodes, which are few and mostly cached.
    pub fn prefetch_leaf(&self, entry: &Entry) {
        self.descend(entry, &mut Path::default());
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
        self.leaves[index as usize].len = 0;
        self.free_leaves.push(index);
    }

    fn free_inner(&mut self, index: u32) {
        self.inners[index as usize].len = 0;
        self.free_inners.push(index);
    }

    /// Checks every structural invariant; tests call it after each step.
    #[cfg(test)]
    pub fn check(&self) {
        let (count, _, _) = self.check_node(self.root, self.height);
        assert_eq!(count, self.len, "root count");
    }

    #[cfg(test)]
    fn check_node(&self, node: u32, height: usize) -> (usize, Option<Entry>, Option<Entry>) {
        if height == 0 {
            let entries = self.leaves[node as usize].entries();
            assert!(entries.windows(2).all(|w| w[0] < w[1]), "leaf sorted");
            return (
                entries.len(),
                entries.first().copied(),
                entries.last().copied(),
            );
        }
        let inner = &self.inners[node as usize];
        assert!(inner.len > 0);
        let (mut total, mut first, mut last) = (0, None, None);
        for at in 0..inner.len {
            let (below, low, high) = self.check_node(inner.children[at], height - 1);
            assert_eq!(below, inner.counts[at] as usize, "child count");
            assert!(below > 0, "no empty child stays linked");
            if at > 0 {
                assert!(inner.separators[at - 1] <= low.expect("non-empty"));
            }
            if at + 1 < inner.len {
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
    fn leaves_stay_reasonably_full_when_most_entries_leave() {
        // A board that loses 15 of every 16 members, spread evenly: without merging, every leaf would
        // keep its few survivors and memory would stay at the old size.
        let count = 64_000u32;
        let entries: Vec<Entry> = (0..count).map(|m| entry(u128::from(m), m)).collect();
        let mut tree = RankTree::from_sorted(&entries);
        for e in entries.iter().filter(|e| e.member % 16 != 0) {
            assert!(tree.remove(e));
        }
        tree.check();
        let live_leaves = tree.leaves.len() - tree.free_leaves.len();
        let survivors = tree.len();
        assert_eq!(survivors, count as usize / 16);
        assert!(
            live_leaves <= survivors / LEAF_MERGE_BELOW + 2,
            "{live_leaves} leaves for {survivors} entries"
        );
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
