//! Which node applies which engine partition, decided by Kafka's own consumer-group protocol.
//!
//! Every node is a member of the group `spate.<topic>` and subscribes to an empty *lease topic*,
//! `<topic>-owners`, with one partition per engine partition: the group coordinator spreads the lease
//! topic's partitions over the live members (cooperative-sticky, so a rebalance moves only what it must),
//! and a node applies exactly the engine partitions whose leases it holds. A member that stops
//! heartbeating for `SESSION_TIMEOUT` is dropped and its leases go to the others.
//!
//! The lease is not what keeps two nodes from writing one partition: the journal's transactional
//! producer is (opening the log fences the previous writer). The lease only decides who should be
//! writing; a node that lost its lease without noticing (paused, cut off) is fenced by the new owner's
//! first `init_transactions`, and stops its partitions as soon as its consumer learns it left the group.
//!
//! Each member's `client.id` is `spate-node-<id>@<address>`, so the group's description (members and
//! their assignments) is also the directory: who owns each partition and where to forward to.

use crate::log::OffsetIndex;
use crate::{KafkaConfig, KafkaLogStore, SetupError, TakeoversStop};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};
use spate_engine::cluster::{ClusterStatus, Directory, Membership, NodeStatus};
use spate_engine::{EngineHandle, PartitionId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A member silent for this long is dropped from the group and its partitions move (the broker's
/// default lower bound, `group.min.session.timeout.ms`).
const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// How often the directory reads the group's description.
const DIRECTORY_REFRESH: Duration = Duration::from_millis(500);
/// How often a node compares its leases with the partitions it applies (and retries a failed start).
const RECONCILE_INTERVAL: Duration = Duration::from_millis(100);
/// How long a node waits before it stops a partition whose log failed again, to take it over again.
const FAILED_LOG_RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// How long after asking for the group's description a node may answer reads, from its own state, of
/// the partitions the description shows it holding. Another node gets one of them only once this node
/// gives it up (which stops it here first) or its session times out: `SESSION_TIMEOUT` after the last
/// heartbeat the coordinator had from it, sent at most a `HEARTBEAT_INTERVAL` before the node asked.
/// A node paused or cut off after asking thus loses the partition 5 s after asking at the soonest;
/// the lease ends 2 s before that, a margin for late heartbeats and clocks that run at other rates.
const READ_LEASE: Duration = Duration::from_secs(3);
const _: () = assert!(
    READ_LEASE.as_millis() + 2 * HEARTBEAT_INTERVAL.as_millis() < SESSION_TIMEOUT.as_millis()
);
/// A member that has not polled its consumer for this long leaves the group by itself
/// (`max.poll.interval.ms`), without running its revocations first: another node may then take its
/// partitions at once. The membership thread polls between partition starts, which can take minutes,
/// so read leases end this margin before that can happen (`GroupView::lease_end`).
const MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);
const MAX_POLL_MARGIN: Duration = Duration::from_secs(10);
const _: () =
    assert!(MAX_POLL_INTERVAL.as_secs() > MAX_POLL_MARGIN.as_secs() + READ_LEASE.as_secs());

/// This node, as other nodes and operators see it.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub node_id: u32,
    /// `host:port` other nodes reach this node's HTTP listener at.
    pub address: String,
}

impl NodeIdentity {
    fn client_id(&self) -> String {
        format!("{CLIENT_ID_PREFIX}{}@{}", self.node_id, self.address)
    }
}

const CLIENT_ID_PREFIX: &str = "spate-node-";

/// Parses a member's `client.id` back into its identity; `None` for clients that are not spate nodes.
fn parse_client_id(client_id: &str) -> Option<NodeIdentity> {
    let (node_id, address) = client_id.strip_prefix(CLIENT_ID_PREFIX)?.split_once('@')?;
    Some(NodeIdentity {
        node_id: node_id.parse().ok()?,
        address: address.to_string(),
    })
}

/// A node's view of the group: the directory before it joins, the membership after.
pub struct KafkaMembership {
    view: Arc<GroupView>,
}

struct GroupView {
    config: KafkaConfig,
    /// The journal's offset indexes, for following partitions from the right place.
    indexes: Vec<Arc<Mutex<OffsetIndex>>>,
    node: NodeIdentity,
    partitions: u16,
    group: String,
    lease_topic: String,
    /// The last description of the group: every member and the lease partitions it holds.
    members: RwLock<Vec<NodeStatus>>,
    /// When the last description of the group was asked for (it shows the group as it was then or
    /// later); none before the first. Set after `members`.
    described_at: Mutex<Option<Instant>>,
    /// When the membership thread last polled its consumer (which runs revocations); none before it
    /// joined.
    polled_at: Mutex<Option<Instant>>,
    /// The log store's: leaving gives up takeovers under way.
    takeovers: TakeoversStop,
}

impl KafkaMembership {
    /// Makes sure the lease topic exists and that no live member already uses `node.node_id`.
    pub fn prepare(store: &KafkaLogStore, node: NodeIdentity) -> Result<Self, SetupError> {
        let config = store.config.clone();
        let partitions = store.indexes.len() as u16;
        let lease_topic = format!("{}-owners", config.topic);
        let lease = KafkaConfig {
            topic: lease_topic.clone(),
            ..config.clone()
        };
        crate::topic::ensure(&lease, partitions, crate::topic::Keep::Everything)?;
        let view = Arc::new(GroupView {
            group: format!("spate.{}", config.topic),
            lease_topic,
            config,
            indexes: store.indexes.clone(),
            node,
            partitions,
            members: RwLock::new(Vec::new()),
            described_at: Mutex::new(None),
            polled_at: Mutex::new(None),
            takeovers: store.takeovers.clone(),
        });
        view.refuse_duplicate_id()?;
        Ok(Self { view })
    }

    /// The directory other parts of the node use for forwarding; valid before and after joining.
    pub fn directory(&self) -> Arc<dyn Directory> {
        self.view.clone()
    }

    /// Joins the group and from then on starts and stops partitions on `engine` as leases come and go.
    pub fn join(self, engine: EngineHandle) -> Result<Box<dyn Membership>, SetupError> {
        let context = LeaseContext {
            engine: engine.clone(),
            lease_topic: self.view.lease_topic.clone(),
        };
        let consumer: BaseConsumer<LeaseContext> = self
            .view
            .config
            .client()
            .set("group.id", &self.view.group)
            .set("client.id", self.view.node.client_id())
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set(
                "session.timeout.ms",
                SESSION_TIMEOUT.as_millis().to_string(),
            )
            .set(
                "heartbeat.interval.ms",
                HEARTBEAT_INTERVAL.as_millis().to_string(),
            )
            .set(
                "max.poll.interval.ms",
                MAX_POLL_INTERVAL.as_millis().to_string(),
            )
            .set("enable.auto.commit", "false")
            .create_with_context(context)?;
        consumer.subscribe(&[self.view.lease_topic.as_str()])?;
        let stop = Arc::new(AtomicBool::new(false));
        let spawn = |name: &str, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(body)
                .map_err(|e| SetupError::Membership(format!("cannot start thread {name}: {e}")))
        };
        let mut threads = Vec::new();
        if engine.has_projections() {
            let (view, stop, engine) = (self.view.clone(), stop.clone(), engine.clone());
            threads.push(spawn(
                "cluster-follower",
                Box::new(move || crate::follow::run(&view.config, &view.indexes, &engine, &stop)),
            )?);
        }
        let describer: BaseConsumer = self.view.config.client().create()?;
        let (view, stopping, leases_for) = (self.view.clone(), stop.clone(), engine.clone());
        threads.push(spawn(
            "cluster-directory",
            Box::new(move || view.refresh(&describer, &leases_for, &stopping)),
        )?);
        let (view, stopping) = (self.view.clone(), stop.clone());
        threads.push(spawn(
            "cluster-membership",
            Box::new(move || view.run(consumer, engine, &stopping)),
        )?);
        tracing::info!(node_id = self.view.node.node_id, address = %self.view.node.address, group = %self.view.group, "joined the cluster");
        Ok(Box::new(Joined {
            stop,
            takeovers: self.view.takeovers.clone(),
            threads,
        }))
    }
}

struct Joined {
    stop: Arc<AtomicBool>,
    takeovers: TakeoversStop,
    threads: Vec<JoinHandle<()>>,
}

impl Membership for Joined {
    /// Stops the membership's threads, after the partition starts they are waiting for: those still
    /// reading from Kafka give up.
    fn leave(self: Box<Self>) {
        self.stop.store(true, Ordering::Release);
        self.takeovers.stop();
        for thread in self.threads {
            if thread.join().is_err() {
                tracing::error!("a cluster thread panicked");
            }
        }
    }
}

impl GroupView {
    fn describe(&self, consumer: &BaseConsumer) -> Result<(), String> {
        let asked_at = Instant::now();
        let groups = consumer
            .fetch_group_list(Some(&self.group), Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        let mut members = Vec::new();
        for group in groups.groups() {
            for member in group.members() {
                let Some(node) = parse_client_id(member.client_id()) else {
                    continue;
                };
                let partitions = member
                    .assignment()
                    .map(|bytes| assigned_partitions(bytes, &self.lease_topic))
                    .unwrap_or_default();
                members.push(NodeStatus {
                    node_id: node.node_id,
                    address: node.address,
                    partitions,
                });
            }
        }
        members.sort_by_key(|m| m.node_id);
        *self
            .members
            .write()
            .expect("no thread panics holding members") = members;
        *self.described_at.lock().expect("no panics while held") = Some(asked_at);
        Ok(())
    }

    /// True when a description of the group asked for after `since` shows this node holding
    /// `partition`'s lease.
    fn shows_holding_since(&self, partition: PartitionId, since: Instant) -> bool {
        let described_at = *self.described_at.lock().expect("no panics while held");
        described_at.is_some_and(|at| at >= since)
            && self
                .members
                .read()
                .expect("no thread panics holding members")
                .iter()
                .any(|m| m.node_id == self.node.node_id && m.partitions.contains(&partition))
    }

    /// A node killed a moment ago stays a member until its session times out: wait that long for a
    /// member with this node's id to go before calling it a duplicate.
    fn refuse_duplicate_id(&self) -> Result<(), SetupError> {
        let consumer: BaseConsumer = self.config.client().create()?;
        let connected_by = Instant::now() + self.config.connect_timeout;
        let mut deadline = None;
        loop {
            // A fresh cluster answers "coordinator load in progress" for a few seconds.
            if let Err(reason) = self.describe(&consumer) {
                if Instant::now() >= connected_by {
                    return Err(SetupError::Membership(format!(
                        "cannot read the group {}: {reason}",
                        self.group
                    )));
                }
                std::thread::sleep(DIRECTORY_REFRESH);
                continue;
            }
            let deadline = *deadline
                .get_or_insert_with(|| Instant::now() + SESSION_TIMEOUT + Duration::from_secs(2));
            let same = self
                .members
                .read()
                .expect("no thread panics holding members")
                .iter()
                .find(|m| m.node_id == self.node.node_id)
                .cloned();
            match same {
                None => return Ok(()),
                Some(other) if Instant::now() >= deadline => {
                    return Err(SetupError::Membership(format!(
                        "node id {} is already used by the live member at {}; give every node its own --node-id",
                        self.node.node_id, other.address
                    )));
                }
                Some(_) => std::thread::sleep(DIRECTORY_REFRESH),
            }
        }
    }

    fn run(&self, consumer: BaseConsumer<LeaseContext>, engine: EngineHandle, stop: &AtomicBool) {
        let mut failed_logs = FailedLogs::default();
        while !stop.load(Ordering::Acquire) {
            // Revocations run inside poll (`LeaseContext::pre_rebalance`), before the lease moves on.
            *self.polled_at.lock().expect("no panics while held") = Some(Instant::now());
            if let Some(Err(error)) = consumer.poll(RECONCILE_INTERVAL) {
                tracing::warn!(%error, "cluster membership");
            }
            failed_logs.stop_to_start_again(&engine, |partition, _fenced, seen_at| {
                self.shows_holding_since(partition, seen_at) && engine.holds_read_lease(partition)
            });
            self.start_leased(&consumer, &engine);
        }
        // Stop applying before leaving, so that the next owner's start does not have to fence us.
        stop_partitions(&engine, &engine.local_partitions());
        drop(consumer);
        tracing::info!(node_id = self.node.node_id, "left the cluster");
    }

    /// Reads the group's description every [`DIRECTORY_REFRESH`] and extends the read leases of the
    /// partitions it shows this node holding. A thread of its own: taking a partition over (reading its
    /// log, recovering its state) can take seconds, and holds up neither the directory nor the read
    /// leases of the partitions this node already applies.
    fn refresh(&self, consumer: &BaseConsumer, engine: &EngineHandle, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let asked_at = Instant::now();
            match self.describe(consumer) {
                Ok(()) => self.extend_read_leases(engine, asked_at),
                Err(error) => tracing::debug!(%error, "describing the cluster"),
            }
            std::thread::sleep(DIRECTORY_REFRESH.saturating_sub(asked_at.elapsed()));
        }
    }

    /// Lets the partitions the group's description, asked for at `asked_at`, shows this node holding
    /// answer reads for [`READ_LEASE`] from then.
    fn extend_read_leases(&self, engine: &EngineHandle, asked_at: Instant) {
        let members = self
            .members
            .read()
            .expect("no thread panics holding members");
        if let Some(this_node) = members.iter().find(|m| m.node_id == self.node.node_id)
            && let Some(until) = self.lease_end(asked_at)
        {
            engine.extend_read_leases(&this_node.partitions, until);
        }
    }

    /// Until when a description asked for at `asked_at` lets this node answer reads: [`READ_LEASE`]
    /// after it, but never past [`MAX_POLL_MARGIN`] before the consumer would leave the group for not
    /// polling (a partition start that takes minutes); none before the membership thread first polls.
    fn lease_end(&self, asked_at: Instant) -> Option<Instant> {
        let polled_at = (*self.polled_at.lock().expect("no panics while held"))?;
        let leaves_at = polled_at + MAX_POLL_INTERVAL - MAX_POLL_MARGIN;
        Some((asked_at + READ_LEASE).min(leaves_at))
    }

    /// Starts every leased partition not applied yet, together (each start fences the old owner and
    /// reads the partition's log). A start that fails is tried again on the next round.
    fn start_leased(&self, consumer: &BaseConsumer<LeaseContext>, engine: &EngineHandle) {
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let local: BTreeSet<PartitionId> = engine.local_partitions().into_iter().collect();
        let missing: Vec<PartitionId> = lease_partitions(&assignment, &self.lease_topic)
            .into_iter()
            .filter(|p| !local.contains(p))
            .collect();
        start_partitions(engine, &missing, &self.takeovers);
    }
}

/// Starts `partitions` on `engine`, together (each start fences the old writer and reads the
/// partition's log). A start that fails is logged; the caller tries again on its next round, unless
/// the node is stopping (`takeovers`).
fn start_partitions(engine: &EngineHandle, missing: &[PartitionId], takeovers: &TakeoversStop) {
    std::thread::scope(|scope| {
        for &partition in missing {
            scope.spawn(move || {
                let started = Instant::now();
                match engine.activate(partition) {
                    Ok(()) => tracing::info!(
                        partition,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "took partition over"
                    ),
                    Err(error) if takeovers.is_set() => {
                        tracing::info!(partition, %error, "gave the takeover up: the node stops")
                    }
                    Err(error) => {
                        tracing::error!(partition, %error, "cannot take partition over; retrying")
                    }
                }
            });
        }
    });
}

/// Without `--node-id`, one node applies every partition of the topic; it has no leases, but its
/// partitions' logs can fail as a cluster node's do. Watches them: a partition whose log failed (not
/// fenced) is stopped and started again, as [`FailedLogs`] says.
pub fn watch_sole_owner(
    store: &KafkaLogStore,
    engine: EngineHandle,
) -> Result<Box<dyn Membership>, SetupError> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let takeovers = store.takeovers.clone();
    let thread = std::thread::Builder::new()
        .name("log-watch".into())
        .spawn(move || {
            let mut failed_logs = FailedLogs::default();
            let all: Vec<PartitionId> = (0..engine.partition_count()).collect();
            while !stopping.load(Ordering::Acquire) {
                failed_logs.stop_to_start_again(&engine, |_, fenced, _| !fenced);
                let local = engine.local_partitions();
                let missing: Vec<PartitionId> =
                    all.iter().copied().filter(|p| !local.contains(p)).collect();
                start_partitions(&engine, &missing, &takeovers);
                std::thread::sleep(RECONCILE_INTERVAL);
            }
        })
        .map_err(|e| SetupError::Membership(format!("cannot start thread log-watch: {e}")))?;
    Ok(Box::new(Joined {
        stop,
        takeovers: store.takeovers.clone(),
        threads: vec![thread],
    }))
}

/// The partitions applied here whose log failed: when this node first saw each fail, and when it last
/// stopped each to take it over again.
#[derive(Default)]
struct FailedLogs {
    seen_at: BTreeMap<PartitionId, Instant>,
    stopped_at: BTreeMap<PartitionId, Instant>,
}

impl FailedLogs {
    /// Stops every partition applied here whose log failed, at most once per
    /// [`FAILED_LOG_RETRY_INTERVAL`] each, so that it is started again: a new producer fences the failed
    /// one, and the state is recovered from the log, without what the failed commits applied. Without
    /// this, the partition would answer 503 until the node restarts, long after Kafka came back.
    ///
    /// Only where `may_take_back(partition, fenced, seen_at)` says so: `fenced` when the log failed
    /// because another writer took it over ([`EngineHandle::is_fenced`]), `seen_at` when this node first
    /// saw the failure. A node without `--node-id` takes back only a log that merely failed (a commit
    /// refused or timed out: Kafka unreachable, `min.insync.replicas` unmet); a fenced one would be taken
    /// back from the node that fenced it. A cluster node takes back either once a description of the
    /// group asked for after the failure shows it holding the lease (and its read lease holds): the
    /// group, not the last writer, says who should write. That heals an owner fenced by a node acting on
    /// an assignment the group had already moved (a start begun before a pause); a node fenced because
    /// its lease moved finds the new owner in the description, and stops for good once its consumer
    /// hears of the move.
    fn stop_to_start_again(
        &mut self,
        engine: &EngineHandle,
        may_take_back: impl Fn(PartitionId, bool, Instant) -> bool,
    ) {
        let failed = engine.failed_partitions();
        self.seen_at
            .retain(|partition, _| failed.contains(partition));
        for partition in failed {
            let seen_at = *self.seen_at.entry(partition).or_insert_with(Instant::now);
            let tried_lately = self
                .stopped_at
                .get(&partition)
                .is_some_and(|at| at.elapsed() < FAILED_LOG_RETRY_INTERVAL);
            let fenced = engine.is_fenced(partition);
            if tried_lately || !may_take_back(partition, fenced, seen_at) {
                continue;
            }
            self.stopped_at.insert(partition, Instant::now());
            // A failure after the start is a new one, seen anew.
            self.seen_at.remove(&partition);
            tracing::warn!(
                partition,
                fenced,
                "the partition's log failed; stopping it to take it over again"
            );
            stop_partitions(engine, &[partition]);
        }
    }
}

fn stop_partitions(engine: &EngineHandle, partitions: &[PartitionId]) {
    std::thread::scope(|scope| {
        for &partition in partitions {
            scope.spawn(move || {
                if let Err(error) = engine.deactivate(partition) {
                    // Expected when another node took the log over first: the last snapshot fails.
                    tracing::info!(partition, %error, "stopped partition");
                } else {
                    tracing::info!(partition, "handed partition over");
                }
            });
        }
    });
}

impl Directory for GroupView {
    fn owner_address(&self, partition: PartitionId) -> Option<String> {
        self.members
            .read()
            .expect("no thread panics holding members")
            .iter()
            .find(|m| m.partitions.contains(&partition))
            .map(|m| m.address.clone())
    }

    fn status(&self) -> ClusterStatus {
        ClusterStatus {
            node_id: self.node.node_id,
            partitions: self.partitions,
            nodes: self
                .members
                .read()
                .expect("no thread panics holding members")
                .clone(),
        }
    }
}

/// Stops partitions whose leases are taken away, inside the rebalance, before they move on.
struct LeaseContext {
    engine: EngineHandle,
    lease_topic: String,
}

impl ClientContext for LeaseContext {}

impl ConsumerContext for LeaseContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(revoked) => {
                let partitions = lease_partitions(revoked, &self.lease_topic);
                tracing::info!(?partitions, "leases revoked");
                stop_partitions(&self.engine, &partitions);
            }
            Rebalance::Assign(assigned) => {
                tracing::info!(partitions = ?lease_partitions(assigned, &self.lease_topic), "leases assigned");
            }
            Rebalance::Error(error) => tracing::warn!(%error, "cluster rebalance failed"),
        }
    }
}

fn lease_partitions(list: &TopicPartitionList, lease_topic: &str) -> Vec<PartitionId> {
    list.elements_for_topic(lease_topic)
        .iter()
        .filter_map(|e| PartitionId::try_from(e.partition()).ok())
        .collect()
}

/// Reads the lease partitions out of a member's assignment as the group coordinator stores it (Kafka's
/// `ConsumerProtocolAssignment`: `version i16`, then `[topic string, [partition i32]]`, big-endian).
/// Anything it cannot read counts as no partitions.
fn assigned_partitions(bytes: &[u8], lease_topic: &str) -> Vec<PartitionId> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (bytes.get(..n)?, bytes.get(n..)?);
        *bytes = tail;
        Some(head)
    }
    fn i16(bytes: &mut &[u8]) -> Option<i16> {
        Some(i16::from_be_bytes(take(bytes, 2)?.try_into().ok()?))
    }
    fn i32(bytes: &mut &[u8]) -> Option<i32> {
        Some(i32::from_be_bytes(take(bytes, 4)?.try_into().ok()?))
    }
    let parse = |mut bytes: &[u8]| -> Option<Vec<PartitionId>> {
        let _version = i16(&mut bytes)?;
        let mut found = Vec::new();
        for _ in 0..i32(&mut bytes)?.max(0) {
            let topic_len = usize::try_from(i16(&mut bytes)?).ok()?;
            let topic = take(&mut bytes, topic_len)?;
            for _ in 0..i32(&mut bytes)?.max(0) {
                let partition = i32(&mut bytes)?;
                if topic == lease_topic.as_bytes() {
                    found.push(PartitionId::try_from(partition).ok()?);
                }
            }
        }
        Some(found)
    };
    let mut partitions = parse(bytes).unwrap_or_default();
    partitions.sort_unstable();
    partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_carry_the_node_identity() {
        let node = NodeIdentity {
            node_id: 7,
            address: "127.0.0.1:8087".into(),
        };
        let parsed = parse_client_id(&node.client_id()).unwrap();
        assert_eq!(
            (parsed.node_id, parsed.address.as_str()),
            (7, "127.0.0.1:8087")
        );
        assert!(parse_client_id("rdkafka").is_none());
        assert!(parse_client_id("spate-node-x@host:1").is_none());
    }

    #[test]
    fn assignments_are_read_for_the_lease_topic_only() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1i16.to_be_bytes());
        bytes.extend_from_slice(&2i32.to_be_bytes());
        for (topic, partitions) in [("other", vec![0i32, 1]), ("t-owners", vec![5, 2])] {
            bytes.extend_from_slice(&(topic.len() as i16).to_be_bytes());
            bytes.extend_from_slice(topic.as_bytes());
            bytes.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
            for p in partitions {
                bytes.extend_from_slice(&p.to_be_bytes());
            }
        }
        bytes.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(assigned_partitions(&bytes, "t-owners"), vec![2, 5]);
        for cut in 0..bytes.len() - 4 {
            let partial = assigned_partitions(&bytes[..cut], "t-owners");
            assert!(partial.is_empty(), "cut at {cut}: {partial:?}");
        }
    }
}
