//! What the engine reads that nobody vouches for, open to fuzz targets (`fuzz/fuzz_targets/`): an
//! app's commands (its apply decodes its payload and must refuse what it cannot decode, never panic,
//! since a command reaches it from a client through its routes, from another node, or from a journal)
//! and partition snapshot files.

use crate::app::AppSpec;
use crate::archive::Archive;
use crate::core::Core;
use crate::idempotency::IdempotencyTable;
use crate::record::{Envelope, Origin};
use std::path::Path;

/// Applies `payloads` in order, as client commands without a key, to a fresh state of `spec`'s app on
/// partition 0 of 1, as a partition does but without a journal; returns the replies. What the app
/// archives stays in memory; the follow-ups it sends are dropped.
pub fn apply_client_commands<'a>(
    spec: &AppSpec,
    payloads: impl IntoIterator<Item = &'a [u8]>,
) -> Vec<Vec<u8>> {
    let apps = vec![(spec.id, (spec.new_state)(0))];
    let idempotency = IdempotencyTable::new(60_000, 1_024, 1 << 20);
    let mut core = Core::new(0, 1, apps, idempotency, Archive::new(None));
    let (mut events, mut sent, mut archived) = (Vec::new(), Vec::new(), Vec::new());
    let mut replies = Vec::new();
    for (index, payload) in payloads.into_iter().enumerate() {
        let envelope = Envelope {
            app: spec.id,
            origin: Origin::Client { command_id: None },
            timestamp_ms: 1_700_000_000_000 + index as u64,
            random: index as u64,
        };
        events.clear();
        sent.clear();
        archived.clear();
        replies.push(
            core.apply(&envelope, payload, &mut events, &mut sent, &mut archived)
                .to_vec(),
        );
    }
    replies
}

/// Reads the partition snapshot file at `path` as start-up does (partition 0 of 1, with `specs`'
/// apps): the partition it holds, or why not.
pub fn read_partition_snapshot(specs: &[AppSpec], path: &Path) -> std::io::Result<()> {
    let idempotency = IdempotencyTable::new(60_000, 1_024, 1 << 20);
    crate::recovery::load_snapshot(path, 0, 1, specs, &idempotency, &None).1
}
