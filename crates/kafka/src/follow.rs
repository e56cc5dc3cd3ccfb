//! Read models on every node: a node follows the journal partitions other nodes apply and hands their
//! committed group commits to its engine's projections (`EngineHandle::follow`).
//!
//! One consumer per node, assigned every partition this node does not apply; the assignment changes as
//! partitions come and go. A partition taken up again starts where the engine says it needs records
//! from (through the offset index when it has one, else from the beginning of the partition: the engine
//! skips what it already has).

use crate::KafkaConfig;
use crate::log::{self, OffsetIndex, RecordKey};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};
use spate_engine::{EngineHandle, PartitionId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the follower compares what it follows with what the node applies.
const RECONCILE_INTERVAL: Duration = Duration::from_millis(200);

pub(crate) fn run(
    config: &KafkaConfig,
    indexes: &[Arc<Mutex<OffsetIndex>>],
    engine: &EngineHandle,
    stop: &AtomicBool,
) {
    let consumer = match log::unassigned_reader(config) {
        Ok(consumer) => consumer,
        Err(error) => {
            tracing::error!(%error, "cannot follow other nodes' partitions; read models cover this node's only");
            return;
        }
    };
    let mut followed = BTreeSet::new();
    // Per followed partition not read to its end: when the newest record read was written (unix ms).
    let mut behind: BTreeMap<PartitionId, i64> = BTreeMap::new();
    let mut reconciled_at = Instant::now() - RECONCILE_INTERVAL;
    while !stop.load(Ordering::Acquire) {
        if reconciled_at.elapsed() >= RECONCILE_INTERVAL {
            reconciled_at = Instant::now();
            let local: BTreeSet<PartitionId> = engine.local_partitions().into_iter().collect();
            let wanted: BTreeSet<PartitionId> = (0..engine.partition_count())
                .filter(|p| !local.contains(p))
                .collect();
            if wanted != followed {
                match assign(&consumer, config, indexes, engine, &followed, &wanted) {
                    Ok(()) => {
                        for &dropped in followed.difference(&wanted) {
                            behind.remove(&dropped);
                            engine.note_follow_lag(dropped, Duration::ZERO);
                        }
                        followed = wanted;
                    }
                    Err(error) => tracing::warn!(%error, "cannot change the partitions followed"),
                }
            }
            for (&partition, &written_ms) in &behind {
                engine.note_follow_lag(partition, age(written_ms));
            }
        }
        match consumer.poll(RECONCILE_INTERVAL) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                if let Ok(partition) = PartitionId::try_from(partition) {
                    behind.remove(&partition);
                    engine.note_follow_lag(partition, Duration::ZERO);
                }
            }
            Some(Err(error)) if log::is_transient(&error) => {
                tracing::debug!(%error, "following interrupted; retrying")
            }
            Some(Err(error)) => tracing::warn!(%error, "following other nodes' partitions"),
            Some(Ok(message)) => {
                let Ok(partition) = PartitionId::try_from(message.partition()) else {
                    continue;
                };
                if let Some(written_ms) = message.timestamp().to_millis() {
                    behind.insert(partition, written_ms);
                }
                match RecordKey::decode(message.key()) {
                    Ok(key) => engine.follow(
                        partition,
                        key.first_lsn,
                        u64::from(key.record_count),
                        message.payload().unwrap_or_default().to_vec(),
                    ),
                    Err(reason) => tracing::error!(
                        partition,
                        offset = message.offset(),
                        %reason,
                        "an unreadable journal record; the read model stops following here"
                    ),
                }
            }
        }
    }
}

/// Assigns `wanted`: partitions followed already go on from where the consumer is, new ones start at
/// the engine's followed LSN.
fn assign(
    consumer: &log::Reader,
    config: &KafkaConfig,
    indexes: &[Arc<Mutex<OffsetIndex>>],
    engine: &EngineHandle,
    followed: &BTreeSet<PartitionId>,
    wanted: &BTreeSet<PartitionId>,
) -> Result<(), KafkaError> {
    let positions = consumer.position()?;
    let mut assignment = TopicPartitionList::new();
    for &partition in wanted {
        let kept = followed
            .contains(&partition)
            .then(|| {
                positions
                    .find_partition(&config.topic, i32::from(partition))
                    .map(|element| element.offset())
            })
            .flatten()
            .filter(|offset| matches!(offset, Offset::Offset(_)));
        let start = kept.unwrap_or_else(|| {
            indexes[usize::from(partition)]
                .lock()
                .expect("no panics while held")
                .start_for(engine.followed_lsn(partition))
        });
        assignment.add_partition_offset(&config.topic, i32::from(partition), start)?;
    }
    consumer.assign(&assignment)
}

/// How long ago `written_ms` (unix ms, the writing node's clock) was.
fn age(written_ms: i64) -> Duration {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Duration::from_millis(u64::try_from(now_ms - written_ms).unwrap_or(0))
}
