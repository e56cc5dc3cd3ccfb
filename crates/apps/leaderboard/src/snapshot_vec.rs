//! `SnapshotVec`: a vector that a snapshot writes in steps while apply goes on changing it.
//!
//! [`SnapshotVec::begin_snapshot`] fixes which elements the snapshot holds: those there at that moment.
//! Until the snapshot has handed an element on, the element's first change keeps its old value aside
//! (copy-on-write per element), so the snapshot hands on every element as it was when it began, while
//! apply pays at most one copy per element it changes. A coarser unit (chunks of elements shared by
//! reference) was tried: under random updates the first batches after the snapshot began copied nearly
//! every chunk, a pause as long as writing the whole state (BENCHMARKS.md, "leaderboard snapshots").

use std::collections::HashMap;
use std::ops::{Index, IndexMut};

#[derive(Debug)]
pub struct SnapshotVec<T> {
    items: Vec<T>,
    /// The snapshot in progress.
    frozen: Option<Frozen<T>>,
}

#[derive(Debug)]
struct Frozen<T> {
    /// The length when the snapshot began: elements from here on are not in it.
    len: usize,
    /// Elements below this index are handed on.
    written: usize,
    /// The old value of every element changed since the snapshot began and not handed on yet.
    old: HashMap<usize, T, foldhash::fast::RandomState>,
}

impl<T> Default for SnapshotVec<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            frozen: None,
        }
    }
}

impl<T: Clone> SnapshotVec<T> {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    pub fn push(&mut self, value: T) {
        // The old value of an index a pop freed was kept by that pop.
        self.items.push(value);
    }

    pub fn pop(&mut self) -> Option<T> {
        let last = self.items.len().checked_sub(1)?;
        self.keep_old(last);
        self.items.pop()
    }

    fn keep_old(&mut self, index: usize) {
        if let Some(frozen) = &mut self.frozen
            && (frozen.written..frozen.len).contains(&index)
        {
            frozen
                .old
                .entry(index)
                .or_insert_with(|| self.items[index].clone());
        }
    }

    /// Starts a snapshot of the elements there now (and ends one in progress, if any).
    pub fn begin_snapshot(&mut self) {
        self.frozen = Some(Frozen {
            len: self.items.len(),
            written: 0,
            old: HashMap::default(),
        });
    }

    /// Hands the next `count` elements of the snapshot in progress (fewer at its end) to `write`, each as
    /// it was when the snapshot began; true once all are handed on, which ends the snapshot.
    pub fn write_frozen(&mut self, count: usize, mut write: impl FnMut(&T)) -> bool {
        let Self { items, frozen } = self;
        let state = frozen.as_mut().expect("a snapshot is in progress");
        let end = state.len.min(state.written + count);
        for index in state.written..end {
            // An element popped since the snapshot began is only in `old`.
            match state.old.remove(&index) {
                Some(old) => write(&old),
                None => write(
                    items
                        .get(index)
                        .expect("an unchanged element is still there"),
                ),
            }
        }
        state.written = end;
        if end < state.len {
            return false;
        }
        debug_assert!(state.old.is_empty(), "every kept value was handed on");
        *frozen = None;
        true
    }
}

impl<T> Index<usize> for SnapshotVec<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        &self.items[index]
    }
}

impl<T: Clone> IndexMut<usize> for SnapshotVec<T> {
    /// Keeps the element's old value first if a snapshot has yet to hand it on.
    fn index_mut(&mut self, index: usize) -> &mut T {
        self.keep_old(index);
        &mut self.items[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Pop,
        Set(usize, u32),
        /// Hands on up to this many elements of the snapshot in progress, if any.
        Write(usize),
        /// Begins a snapshot unless one is in progress.
        Begin,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u32>().prop_map(Op::Push),
            2 => Just(Op::Pop),
            4 => (any::<usize>(), any::<u32>()).prop_map(|(i, v)| Op::Set(i, v)),
            2 => (1usize..50).prop_map(Op::Write),
            1 => Just(Op::Begin),
        ]
    }

    proptest! {
        /// Every snapshot hands on exactly the elements there when it began, however pushes, pops and
        /// changes fall between its steps; the vector itself always equals a plain one.
        #[test]
        fn a_snapshot_hands_on_the_elements_as_they_were_when_it_began(
            ops in proptest::collection::vec(op(), 1..1500)
        ) {
            let mut vec = SnapshotVec::default();
            let mut model: Vec<u32> = Vec::new();
            // What the snapshot in progress must hand on, and what it handed on so far.
            let mut snapshot: Option<(Vec<u32>, Vec<u32>)> = None;
            for op in ops {
                match op {
                    Op::Push(value) => {
                        vec.push(value);
                        model.push(value);
                    }
                    Op::Pop => prop_assert_eq!(vec.pop(), model.pop()),
                    Op::Set(index, value) if !model.is_empty() => {
                        let index = index % model.len();
                        vec[index] = value;
                        model[index] = value;
                    }
                    Op::Set(..) => {}
                    Op::Write(count) => {
                        if let Some((expected, handed)) = &mut snapshot {
                            let done = vec.write_frozen(count, |value| handed.push(*value));
                            prop_assert_eq!(done, handed.len() == expected.len());
                            prop_assert_eq!(&handed[..], &expected[..handed.len()]);
                            if done {
                                snapshot = None;
                            }
                        }
                    }
                    Op::Begin if snapshot.is_none() => {
                        vec.begin_snapshot();
                        snapshot = Some((model.clone(), Vec::new()));
                    }
                    Op::Begin => {}
                }
                prop_assert_eq!(vec.iter().copied().collect::<Vec<_>>(), model.clone());
            }
            if let Some((expected, mut handed)) = snapshot {
                while !vec.write_frozen(7, |value| handed.push(*value)) {}
                prop_assert_eq!(handed, expected);
            }
        }
    }
}
