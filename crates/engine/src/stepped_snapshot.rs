//! A partition's snapshot written in steps between batches, so that apply goes on while it is written
//! (see ARCHITECTURE.md, "Snapshots"). The partition thread drives it between its batches; the
//! simulation (`sim.rs`) drives it between its simulated ones.

use crate::AppId;
use crate::core::Core;
use crate::snapshot::SectionWriter;
use std::io::Write;

/// The sections of one snapshot, in the order written: the header and the bookkeeping, the apps that
/// write their state at once, then the apps that write it in steps, the idempotency table, the archive.
pub(crate) struct SteppedSnapshot<W: Write> {
    out: SectionWriter<W>,
    /// Indexes in `Core::apps` of the apps that write their state in steps, in the order written.
    stepped: Vec<usize>,
    /// The one in `stepped` being written; `stepped.len()`: the idempotency table; one more: the
    /// archive.
    next: usize,
    /// The first write error; the apps' steps then go on into nothing, so that they end their snapshot.
    failed: Option<String>,
}

impl<W: Write> SteppedSnapshot<W> {
    /// Begins the snapshot of `core` at its next LSN into `out`, whose file header is written: writes
    /// the header and bookkeeping sections and the apps that write their state at once, and begins the
    /// snapshot of every other part, with no apply in between.
    pub fn begin(core: &mut Core, mut out: SectionWriter<W>) -> Self {
        let mut failed = crate::recovery::write_partition_header(core, &mut out).err();
        let mut stepped = Vec::new();
        for (index, (app, state)) in core.apps.iter_mut().enumerate() {
            // Every app begins, even after a write error: its steps then go into nothing.
            if state.begin_snapshot() {
                stepped.push(index);
            } else if failed.is_none() {
                failed = out
                    .write_all(&[*app])
                    .and_then(|()| state.write_snapshot(&mut out))
                    .and_then(|()| out.end_section())
                    .err();
            }
        }
        let lsn = core.next_lsn;
        core.idempotency().begin_snapshot();
        core.archive.begin_snapshot(lsn);
        if failed.is_none() {
            let first_app = stepped.first().map(|&index| core.apps[index].0);
            failed = write_app_id(first_app, &mut out).err();
        }
        Self {
            out,
            stepped,
            next: 0,
            failed: failed.map(|e| format!("writing a snapshot: {e}")),
        }
    }

    /// Writes the next part, about `budget_bytes`: the stepped apps' sections, then the idempotency
    /// table's, then the archive's. True once the snapshot is whole (or failed, see [`Self::finish`]).
    pub fn step(&mut self, core: &mut Core, budget_bytes: usize) -> bool {
        let app = self.stepped.get(self.next).copied();
        let next_app = (self.stepped.get(self.next + 1)).map(|&i| core.apps[i].0);
        let mut sink = std::io::sink();
        let out: &mut dyn Write = match self.failed {
            None => &mut self.out,
            Some(_) => &mut sink,
        };
        let step = match app {
            Some(index) => core.apps[index].1.write_snapshot_step(out, budget_bytes),
            None if self.next == self.stepped.len() => {
                core.idempotency().snapshot_step(out, budget_bytes)
            }
            // Last, so that it holds as few records as possible: most of those archived before the
            // snapshot's LSN are in the store by now.
            None => core.archive.snapshot_step(out, budget_bytes),
        };
        let step = step.and_then(|done| {
            if done && self.failed.is_none() {
                self.out.end_section()?;
                if app.is_some() {
                    write_app_id(next_app, &mut self.out)?;
                }
            }
            Ok(done)
        });
        let done = step.unwrap_or_else(|error| {
            self.failed = Some(format!("writing a snapshot: {error}"));
            false
        });
        if done {
            self.next += 1;
        }
        self.next > self.stepped.len() + 1
    }

    pub fn writer(&self) -> &W {
        self.out.get_ref()
    }

    /// The writer, and the first error if writing failed (then its bytes are not a snapshot).
    pub fn finish(self) -> (W, Option<String>) {
        (self.out.into_inner(), self.failed)
    }
}

/// Starts an app's section of a snapshot, if there is an app to write.
fn write_app_id(app: Option<AppId>, out: &mut impl Write) -> std::io::Result<()> {
    match app {
        Some(app) => out.write_all(&[app]),
        None => Ok(()),
    }
}
