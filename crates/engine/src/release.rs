//! Letting go of what a store on disk replaced, off the lock its reads take.
//!
//! In lsm-tree 3.1 (fjall's engine) every read of a keyspace takes its version lock for a moment,
//! and a flush, a compaction or a memtable rotation installs its result under that lock held for
//! writing, dropping the versions it replaced there too. When the version list held the last
//! reference to a flushed memtable, its hundreds of thousands of entries are freed under the lock;
//! when it held the last reference to a compacted table, the table's file is closed and deleted
//! (a discard on a disk mounted with `discard`) under the lock. Reads wait meanwhile: 50-250 ms
//! at 3 M archived transfers (BENCHMARKS.md, "Reads of old transfers: letting go off the lock").
//!
//! A release thread per store holds a reference of its own to each memtable and table of every
//! keyspace, taken every [`TICK`], and lets go of it only once the store no longer holds it: a
//! memtable when its reference is the only one left, a table once the oldest version the store's
//! version list keeps is newer than the last version that had it. The store's last drop then
//! only counts down, and the freeing and the deleting happen on this thread, outside the lock.
//! Nothing else changes: what is held is released at most one tick after the store released it.

use crate::store::{BackgroundThreads, StopSignal};
use fjall::AbstractTree;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How often a release thread takes its references and lets go of those the store no longer holds.
/// A memtable active for less than a tick, or a table that lives less than one, is missed: both are
/// small, so freeing them under the lock costs little.
const TICK: Duration = Duration::from_millis(20);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReleaseLabel {
    pub store: String,
    /// `memtable` or `table`.
    pub what: &'static str,
}

/// Memtables and tables let go of by release threads, by store.
pub(crate) type ReleaseMetrics = Family<ReleaseLabel, Counter>;

/// Every store's release thread; stops and joins them when dropped.
pub(crate) struct Releases {
    metrics: ReleaseMetrics,
    threads: BackgroundThreads,
}

impl Releases {
    pub fn new(metrics: ReleaseMetrics) -> Self {
        Self {
            metrics,
            threads: BackgroundThreads::default(),
        }
    }

    /// Starts holding what `db`'s keyspaces replace, until [`Self::stop_all`]. `store` names it in
    /// `/metrics`.
    pub fn start(&self, store: &str, db: fjall::Database) -> std::io::Result<()> {
        let label = |what| ReleaseLabel {
            store: store.to_owned(),
            what,
        };
        // One at a time: a family's guard must be gone before it is asked again.
        let memtables = self.metrics.get_or_create(&label("memtable")).clone();
        let tables = self.metrics.get_or_create(&label("table")).clone();
        let released = Released { memtables, tables };
        (self.threads).spawn(format!("release-{store}"), move |stop| {
            run(&db, &released, &stop)
        })
    }

    pub fn stop_all(&self) {
        self.threads.stop_all();
    }
}

struct Released {
    memtables: Counter,
    tables: Counter,
}

fn run(db: &fjall::Database, released: &Released, stop: &StopSignal) {
    let mut held: HashMap<String, Held> = HashMap::new();
    loop {
        for name in db.list_keyspace_names() {
            let Ok(keyspace) = db.keyspace(&name, Default::default) else {
                continue;
            };
            let held = held.entry(name.to_string()).or_default();
            let (memtables, tables) = held.tick(&keyspace.tree);
            released.memtables.inc_by(memtables);
            released.tables.inc_by(tables);
        }
        if stop.sleep(TICK) {
            return;
        }
    }
}

/// One keyspace's memtables and tables, held by the release thread.
#[derive(Default)]
struct Held {
    /// Each is an `Arc<Memtable>`, erased: only its count of references matters here.
    memtables: Vec<Arc<dyn Any + Send + Sync>>,
    /// By table id: a `Table`, erased, and the id of the first version seen without it.
    tables: HashMap<u64, (Box<dyn Any + Send>, Option<u64>)>,
    /// The id of the newest version whose tables are in `tables`.
    seen_version: Option<u64>,
}

impl Held {
    /// Takes references to the tree's active memtable and current tables, and lets go of those the
    /// tree no longer holds. How many memtables and tables it let go of.
    fn tick(&mut self, tree: &fjall::AnyTree) -> (u64, u64) {
        let active: Arc<dyn Any + Send + Sync> = tree.active_memtable();
        if !self.memtables.iter().any(|held| Arc::ptr_eq(held, &active)) {
            self.memtables.push(active);
        } else {
            drop(active);
        }
        let memtables_before = self.memtables.len();
        // A count of one is this thread's own reference: the tree, its flushes and its readers all
        // let go, and the entries are freed here.
        self.memtables.retain(|held| Arc::strong_count(held) > 1);
        let memtables = memtables_before - self.memtables.len();

        let version = tree.current_version();
        // A version's tables never change: only a new version needs looking at.
        if self.seen_version != Some(version.id()) {
            let live: HashSet<u64> = version.iter_tables().map(|table| table.id()).collect();
            for table in version.iter_tables() {
                (self.tables)
                    .entry(table.id())
                    .or_insert_with(|| (Box::new(table.clone()), None));
            }
            for (id, (_, left_at)) in &mut self.tables {
                if left_at.is_none() && !live.contains(id) {
                    *left_at = Some(version.id());
                }
            }
            self.seen_version = Some(version.id());
        }
        // Read after the version, so that a version installed in between makes `oldest_kept` too
        // low (held one tick longer), never too high.
        let free_versions = tree.version_free_list_len() as u64;
        // Each install adds a version whose id is one more than the last; the list keeps the newest
        // ones, so the oldest it keeps has this id. A table is in no version from the one it left
        // at on.
        let oldest_kept = version.id().saturating_sub(free_versions);
        let tables_before = self.tables.len();
        (self.tables).retain(|_, (_, left_at)| left_at.is_none_or(|left_at| left_at > oldest_kept));
        (memtables as u64, (tables_before - self.tables.len()) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(keyspace: &fjall::Keyspace, from: u32) {
        for n in from..from + 5_000 {
            keyspace.insert(n.to_be_bytes(), [n as u8; 64]).unwrap();
        }
    }

    /// A store with one keyspace, and the directory it lives in.
    fn store() -> (tempfile::TempDir, fjall::Database, fjall::Keyspace) {
        let dir = tempfile::tempdir().unwrap();
        let db = fjall::Database::builder(dir.path()).open().unwrap();
        let keyspace = db.keyspace("p000", Default::default).unwrap();
        (dir, db, keyspace)
    }

    fn table_files(keyspace: &fjall::Keyspace) -> usize {
        std::fs::read_dir(keyspace.path().join("tables"))
            .unwrap()
            .count()
    }

    #[test]
    fn flushed_memtables_and_compacted_tables_are_freed_by_the_holder_not_the_store() {
        let (_dir, _db, keyspace) = store();
        let mut held = Held::default();
        let mut released = (0, 0);
        for round in 0..3 {
            fill(&keyspace, round * 5_000);
            let counts = held.tick(&keyspace.tree);
            released = (released.0 + counts.0, released.1 + counts.1);
            keyspace.rotate_memtable_and_wait().unwrap();
        }
        assert_eq!(keyspace.table_count(), 3);
        // The store let go of the flushed memtables (of the newest, perhaps only at its next
        // rotation); this holder had the last reference.
        let counts = held.tick(&keyspace.tree);
        released = (released.0 + counts.0, released.1 + counts.1);
        assert!(
            (2..=3).contains(&released.0),
            "memtables freed by the holder: {released:?}"
        );

        keyspace.major_compact().unwrap();
        assert_eq!(keyspace.table_count(), 1);
        assert_eq!(
            held.tick(&keyspace.tree).1,
            0,
            "the store still holds the replaced tables"
        );
        // The store drops the versions it replaced at its next maintenances (here, rotations').
        let mut tables_released = 0;
        for round in 3..8 {
            fill(&keyspace, round * 5_000);
            keyspace.rotate_memtable_and_wait().unwrap();
            let files_before = table_files(&keyspace);
            tables_released += held.tick(&keyspace.tree).1;
            if tables_released == 3 {
                // The store had let go of them by now, and only this holder kept their files.
                assert_eq!(files_before, keyspace.table_count() + 3);
                break;
            }
        }
        assert_eq!(tables_released, 3, "tables freed by the holder");
        assert_eq!(table_files(&keyspace), keyspace.table_count());
        for value in [0u32, 7_777, 19_999] {
            assert!(keyspace.get(value.to_be_bytes()).unwrap().is_some());
        }
    }

    #[test]
    fn tables_an_older_version_still_holds_are_kept() {
        let (_dir, db, keyspace) = store();
        let mut held = Held::default();
        for round in 0..2 {
            fill(&keyspace, round * 5_000);
            keyspace.rotate_memtable_and_wait().unwrap();
        }
        held.tick(&keyspace.tree);
        // An open snapshot keeps the version it reads in the store's list.
        let snapshot = db.snapshot();
        fill(&keyspace, 10_000);
        keyspace.rotate_memtable_and_wait().unwrap();
        keyspace.major_compact().unwrap();
        assert!(keyspace.tree.version_free_list_len() > 0);
        assert_eq!(
            held.tick(&keyspace.tree).1,
            0,
            "let go of tables the store still holds"
        );
        use fjall::Readable;
        assert!(
            snapshot
                .get(&keyspace, 4_999u32.to_be_bytes())
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn a_release_thread_counts_what_it_let_go_of() {
        let (_dir, db, keyspace) = store();
        let metrics = ReleaseMetrics::default();
        let releases = Releases::new(metrics.clone());
        releases.start("archive", db.clone()).unwrap();
        let memtables = (metrics)
            .get_or_create(&ReleaseLabel {
                store: "archive".into(),
                what: "memtable",
            })
            .clone();
        for round in 0..20 {
            fill(&keyspace, round * 5_000);
            std::thread::sleep(TICK * 3);
            keyspace.rotate_memtable_and_wait().unwrap();
            if memtables.get() > 0 {
                break;
            }
        }
        std::thread::sleep(TICK * 3);
        releases.stop_all();
        assert!(memtables.get() > 0, "no memtable was let go by the thread");
    }
}
