//! spate's topics (the journal, its leases, its snapshots): created on first start, checked on every
//! start. A topic that could lose an acknowledged record (fewer than three replicas, fewer than two in
//! sync, limited retention where everything must be kept) or whose partition count differs from the
//! engine's is refused with a message that says which.

use crate::{KafkaConfig, MESSAGE_BYTES_MAX, MIN_INSYNC_REPLICAS, REPLICATION_FACTOR, SetupError};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use std::time::{Duration, Instant};

/// How often start-up asks again while the cluster is still coming up.
const RETRY_INTERVAL: Duration = Duration::from_millis(500);

/// How long a topic keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Every record, forever (the journal: the only complete copy of history).
    Everything,
    /// Records younger than this (snapshots: a newer one supersedes them, and the journal has it all).
    For(Duration),
}

pub(crate) fn ensure(
    config: &KafkaConfig,
    partition_count: u16,
    keep: Keep,
) -> Result<(), SetupError> {
    let deadline = Instant::now() + config.connect_timeout;
    let consumer: BaseConsumer = config.client().create()?;
    let admin: AdminClient<DefaultClientContext> = config.client().create()?;
    let problem = |problem: String| SetupError::Topic {
        topic: config.topic.clone(),
        problem,
    };
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let metadata = match consumer.fetch_metadata(Some(&config.topic), remaining) {
            Ok(metadata) => metadata,
            Err(error) => {
                return Err(SetupError::Unreachable {
                    bootstrap: config.bootstrap_servers.clone(),
                    timeout_s: config.connect_timeout.as_secs(),
                    reason: error.to_string(),
                });
            }
        };
        let brokers = metadata.brokers().len();
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == config.topic)
            .ok_or_else(|| problem("missing from the cluster's metadata".into()))?;
        match topic.error().map(RDKafkaErrorCode::from) {
            None => {}
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                if brokers < REPLICATION_FACTOR as usize {
                    if Instant::now() >= deadline {
                        return Err(problem(format!(
                            "does not exist, and only {brokers} broker(s) are up to create it with replication factor {REPLICATION_FACTOR}"
                        )));
                    }
                    std::thread::sleep(RETRY_INTERVAL);
                    continue;
                }
                create(&admin, config, partition_count, keep, deadline)?;
                continue;
            }
            Some(RDKafkaErrorCode::LeaderNotAvailable) if Instant::now() < deadline => {
                std::thread::sleep(RETRY_INTERVAL);
                continue;
            }
            Some(code) => return Err(problem(format!("metadata error {code}"))),
        }
        let partitions = topic.partitions();
        if partitions.len() != usize::from(partition_count) {
            return Err(problem(format!(
                "has {} partitions, but the engine runs {partition_count}; each engine partition is one \
                 topic partition, so --partitions must match the topic (or name another topic)",
                partitions.len()
            )));
        }
        if let Some(short) = partitions
            .iter()
            .find(|p| p.replicas().len() < REPLICATION_FACTOR as usize)
        {
            return Err(problem(format!(
                "partition {} has {} replica(s); spate needs a replication factor of at least \
                 {REPLICATION_FACTOR} so that losing a broker loses nothing",
                short.id(),
                short.replicas().len()
            )));
        }
        check_configs(&admin, config, keep, deadline)?;
        tracing::info!(
            topic = %config.topic,
            partitions = partitions.len(),
            brokers,
            "Kafka topic ready"
        );
        return Ok(());
    }
}

fn create(
    admin: &AdminClient<DefaultClientContext>,
    config: &KafkaConfig,
    partition_count: u16,
    keep: Keep,
    deadline: Instant,
) -> Result<(), SetupError> {
    let message_bytes_max = MESSAGE_BYTES_MAX.to_string();
    let retention_ms = match keep {
        Keep::Everything => "-1".to_string(),
        Keep::For(age) => age.as_millis().to_string(),
    };
    let min_insync = MIN_INSYNC_REPLICAS.to_string();
    let topic = NewTopic::new(
        &config.topic,
        i32::from(partition_count),
        TopicReplication::Fixed(REPLICATION_FACTOR),
    )
    .set("min.insync.replicas", &min_insync)
    .set("retention.ms", &retention_ms)
    .set("retention.bytes", "-1")
    .set("unclean.leader.election.enable", "false")
    .set("max.message.bytes", &message_bytes_max);
    let options = AdminOptions::new()
        .operation_timeout(Some(deadline.saturating_duration_since(Instant::now())));
    let results = futures_executor::block_on(admin.create_topics([&topic], &options))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(SetupError::Topic {
                    topic: name,
                    problem: format!("cannot be created: {code}"),
                });
            }
        }
    }
    tracing::info!(topic = %config.topic, partition_count, ?keep, "created a Kafka topic");
    Ok(())
}

/// The topic settings `check_configs` reads.
const CHECKED_SETTINGS: [&str; 5] = [
    "min.insync.replicas",
    "retention.ms",
    "retention.bytes",
    "cleanup.policy",
    "unclean.leader.election.enable",
];

/// Refuses a topic whose settings could lose or drop acknowledged records.
fn check_configs(
    admin: &AdminClient<DefaultClientContext>,
    config: &KafkaConfig,
    keep: Keep,
    deadline: Instant,
) -> Result<(), SetupError> {
    let resource = ResourceSpecifier::Topic(&config.topic);
    let problem = |problem: String| SetupError::Topic {
        topic: config.topic.clone(),
        problem,
    };
    // A broker that has just started (or restarted) may answer with an incomplete configuration: ask
    // again until every setting checked here is in the answer, or the deadline passes.
    let described = loop {
        let options = AdminOptions::new()
            .request_timeout(Some(deadline.saturating_duration_since(Instant::now())));
        let results = futures_executor::block_on(admin.describe_configs([&resource], &options))?;
        let described = results
            .into_iter()
            .next()
            .ok_or_else(|| problem("its configuration was not returned".into()))?
            .map_err(|code| problem(format!("cannot read its configuration: {code}")))?;
        let entries = described.entry_map();
        let complete = CHECKED_SETTINGS
            .iter()
            .all(|name| entries.get(name).is_some_and(|entry| entry.value.is_some()));
        if complete || Instant::now() >= deadline {
            break described;
        }
        std::thread::sleep(RETRY_INTERVAL);
    };
    let entries = described.entry_map();
    let value = |name: &str| {
        entries
            .get(name)
            .and_then(|entry| entry.value.clone())
            .ok_or_else(|| problem(format!("its configuration has no {name}")))
    };
    let min_insync: i32 = value("min.insync.replicas")?
        .parse()
        .map_err(|_| problem("min.insync.replicas is not a number".into()))?;
    if min_insync < MIN_INSYNC_REPLICAS {
        return Err(problem(format!(
            "min.insync.replicas is {min_insync}; spate needs at least {MIN_INSYNC_REPLICAS}, so that an \
             acknowledged record is on two brokers"
        )));
    }
    for limited in ["retention.ms", "retention.bytes"] {
        if keep == Keep::Everything && value(limited)? != "-1" {
            return Err(problem(format!(
                "{limited} is {}; the journal must keep every record (set it to -1)",
                value(limited)?
            )));
        }
    }
    if value("cleanup.policy")? != "delete" {
        return Err(problem(format!(
            "cleanup.policy is {}; a compacted journal would lose records",
            value("cleanup.policy")?
        )));
    }
    if value("unclean.leader.election.enable")? != "false" {
        return Err(problem(
            "unclean.leader.election.enable is true; an unclean leader can drop acknowledged records".into(),
        ));
    }
    Ok(())
}
