//! What the engine needs to run as one node of a cluster, without knowing the network.
//!
//! A node applies only the partitions it owns (see `EngineHandle::activate`). For the others it hands
//! work to a [`Remote`], which the server implements over HTTP: client commands are forwarded to the
//! owner in order, and follow-ups and their acknowledgements are delivered to the owner of their
//! destination. Delivery may lose messages (an owner dies, a partition moves): a partition resends its
//! unacknowledged follow-ups while they make no progress, and a destination applies them in sequence and
//! skips what it already applied, so a follow-up still takes effect exactly once.
//!
//! The byte formats of forwarded commands, their outcomes and internal messages live here, next to the
//! types they carry, so that the sending and the receiving node share one codec.

use crate::core::FollowUp;
use crate::partition::Internal;
use crate::wire::{Put, Reader, WireError};
use crate::{AppId, CommandId, EngineError, PartitionId, Reply};
use crossbeam_channel::Sender;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where a forwarded command's outcome goes.
pub type ReplySender = tokio::sync::oneshot::Sender<Result<Reply, EngineError>>;
/// Where the answer to a read on another node goes.
pub type ReadSender = tokio::sync::oneshot::Sender<Result<Vec<u8>, EngineError>>;

/// A client command on its way to its partition's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub app: AppId,
    pub command_id: Option<CommandId>,
    pub payload: Vec<u8>,
}

/// The other nodes of a cluster, as the engine sees them.
pub trait Remote: Send + Sync + 'static {
    /// Hands `command` to the owner of `partition`, after the commands forwarded to it before; the
    /// outcome goes to `reply_to` ([`EngineError::NotOwner`] when no owner could take it).
    fn forward(&self, partition: PartitionId, command: Command, reply_to: ReplySender);
    /// Hands an internal message (see [`encode_message`]) to the owner of `partition`. May drop it.
    fn deliver(&self, partition: PartitionId, message: Vec<u8>);
    /// Asks the owner of `partition` to answer `query` with `app`'s [`crate::StateMachine::read`]; the
    /// answer goes to `reply_to` ([`EngineError::NotOwner`] when no owner answered).
    fn read(&self, partition: PartitionId, app: AppId, query: Vec<u8>, reply_to: ReadSender);
    /// A query for `partition` was refused here because another node applies it: the caller (a read
    /// request) may be retried on the owner.
    fn query_refused(&self, partition: PartitionId);
}

/// What starts and stops partitions on the engine of a node on a shared log, from joining to leaving:
/// a cluster's membership (as the cluster assigns them), or a single node's watch of its logs.
pub trait Membership: Send {
    /// Stops doing so; a cluster member gives up every partition first (stopping them on the engine).
    fn leave(self: Box<Self>);
}

/// Who owns which partition: the cluster's membership, as the server and operators see it.
pub trait Directory: Send + Sync + 'static {
    /// The address (`host:port`) of the node that owns `partition`, if one is known.
    fn owner_address(&self, partition: PartitionId) -> Option<String>;
    /// Every node and the partitions it owns, for `/cluster` and `spate cluster status`.
    fn status(&self) -> ClusterStatus;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The node answering.
    pub node_id: u32,
    pub partitions: u16,
    pub nodes: Vec<NodeStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub node_id: u32,
    pub address: String,
    pub partitions: Vec<PartitionId>,
}

/// How partition threads reach each other: through in-process channels for the partitions this node
/// applies, through the [`Remote`] for the others.
pub(crate) struct Peers {
    internal: Vec<Sender<Internal>>,
    /// Per partition: applied on this node right now.
    here: Vec<AtomicBool>,
    remote: Option<Arc<dyn Remote>>,
}

impl Peers {
    /// Every partition is here until told otherwise; without a remote, all of them always are.
    pub fn new(internal: Vec<Sender<Internal>>, remote: Option<Arc<dyn Remote>>) -> Self {
        let here = internal
            .iter()
            .map(|_| AtomicBool::new(remote.is_none()))
            .collect();
        Self {
            internal,
            here,
            remote,
        }
    }

    pub fn is_here(&self, partition: PartitionId) -> bool {
        self.here[usize::from(partition)].load(Ordering::Acquire)
    }

    pub fn set_here(&self, partition: PartitionId, here: bool) {
        self.here[usize::from(partition)].store(here, Ordering::Release);
    }

    pub fn remote(&self) -> Option<&Arc<dyn Remote>> {
        self.remote.as_ref()
    }

    /// The channel of `partition`'s thread on this node (it may not be running).
    pub fn internal(&self, partition: PartitionId) -> &Sender<Internal> {
        &self.internal[usize::from(partition)]
    }

    /// Sends a follow-up or an acknowledgement to `destination`, wherever it is applied. A message to a
    /// partition that is moving may be lost; the sender's resends make up for it.
    pub fn send(&self, destination: PartitionId, message: Internal) {
        match &self.remote {
            Some(remote) if !self.is_here(destination) => {
                if let Some(bytes) = encode_message(&message) {
                    remote.deliver(destination, bytes);
                }
            }
            // The channel is bounded by the follow-up window and never full in practice; a stopped
            // partition's channel keeps the message for its next start.
            _ => {
                let _ = self.internal(destination).send(message);
            }
        }
    }
}

pub fn encode_commands(commands: &[Command]) -> Vec<u8> {
    let bytes: usize = commands.iter().map(|c| c.payload.len() + 24).sum();
    let mut out = Vec::with_capacity(4 + bytes);
    out.put_u32(commands.len() as u32);
    for command in commands {
        out.put_u8(command.app);
        match command.command_id {
            Some(id) => {
                out.put_u8(1);
                out.put_u128(id);
            }
            None => out.put_u8(0),
        }
        out.put_bytes(&command.payload);
    }
    out
}

pub fn decode_commands(bytes: &[u8]) -> Result<Vec<Command>, WireError> {
    let mut reader = Reader::new(bytes);
    let count = reader.u32()? as usize;
    // Each command takes at least 6 bytes: a count larger than that is a lie, not an allocation to make.
    if count > reader.remaining() / 6 {
        return Err(reader.invalid("command count larger than the message"));
    }
    let mut commands = Vec::with_capacity(count);
    for _ in 0..count {
        let app = reader.u8()?;
        let command_id = match reader.u8()? {
            0 => None,
            1 => Some(reader.u128()?),
            _ => return Err(reader.invalid("command id flag")),
        };
        let payload = reader.bytes()?.to_vec();
        commands.push(Command {
            app,
            command_id,
            payload,
        });
    }
    reader.finish()?;
    Ok(commands)
}

pub fn encode_outcomes(outcomes: &[Result<Reply, EngineError>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_u32(outcomes.len() as u32);
    for outcome in outcomes {
        match outcome {
            Ok(Reply::Applied(bytes)) => {
                out.put_u8(0);
                out.put_bytes(bytes);
            }
            Ok(Reply::Duplicate(bytes)) => {
                out.put_u8(1);
                out.put_bytes(bytes);
            }
            Ok(Reply::InFlight) => out.put_u8(2),
            Ok(Reply::Conflict) => out.put_u8(3),
            Err(EngineError::Overloaded) => out.put_u8(4),
            Err(EngineError::JournalFailed) => out.put_u8(5),
            Err(EngineError::ShuttingDown) => out.put_u8(6),
            Err(EngineError::UnknownApp(app)) => {
                out.put_u8(7);
                out.put_u8(*app);
            }
            Err(EngineError::NotOwner(partition)) => {
                out.put_u8(8);
                out.put_u16(*partition);
            }
            Err(EngineError::DiskFull {
                free_bytes,
                reserve_bytes,
            }) => {
                out.put_u8(9);
                out.put_u64(*free_bytes);
                out.put_u64(*reserve_bytes);
            }
        }
    }
    out
}

pub fn decode_outcomes(bytes: &[u8]) -> Result<Vec<Result<Reply, EngineError>>, WireError> {
    let mut reader = Reader::new(bytes);
    let count = reader.u32()? as usize;
    if count > reader.remaining() {
        return Err(reader.invalid("outcome count larger than the message"));
    }
    let mut outcomes = Vec::with_capacity(count);
    for _ in 0..count {
        outcomes.push(match reader.u8()? {
            0 => Ok(Reply::Applied(reader.bytes()?.to_vec())),
            1 => Ok(Reply::Duplicate(reader.bytes()?.to_vec())),
            2 => Ok(Reply::InFlight),
            3 => Ok(Reply::Conflict),
            4 => Err(EngineError::Overloaded),
            5 => Err(EngineError::JournalFailed),
            6 => Err(EngineError::ShuttingDown),
            7 => Err(EngineError::UnknownApp(reader.u8()?)),
            8 => Err(EngineError::NotOwner(reader.u16()?)),
            9 => Err(EngineError::DiskFull {
                free_bytes: reader.u64()?,
                reserve_bytes: reader.u64()?,
            }),
            _ => return Err(reader.invalid("outcome tag")),
        });
    }
    reader.finish()?;
    Ok(outcomes)
}

/// Encodes a follow-up or an acknowledgement for another node; `None` for messages that never leave a
/// node (snapshot and shutdown requests).
pub(crate) fn encode_message(message: &Internal) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match message {
        Internal::FollowUp(follow_up) => {
            out.put_u8(0);
            out.put_u16(follow_up.source);
            out.put_u64(follow_up.seq);
            out.put_u8(follow_up.app);
            out.put_bytes(&follow_up.payload);
        }
        Internal::Ack { destination, seq } => {
            out.put_u8(1);
            out.put_u16(*destination);
            out.put_u64(*seq);
        }
        Internal::Snapshot(_) | Internal::Shutdown(..) => return None,
    }
    Some(out)
}

pub(crate) fn decode_message(bytes: &[u8], partition_count: u16) -> Result<Internal, WireError> {
    let mut reader = Reader::new(bytes);
    let message = match reader.u8()? {
        0 => {
            let source = reader.u16()?;
            let seq = reader.u64()?;
            let app = reader.u8()?;
            let payload: Arc<[u8]> = reader.bytes()?.into();
            if source >= partition_count {
                return Err(reader.invalid("source partition out of range"));
            }
            Internal::FollowUp(FollowUp {
                source,
                seq,
                app,
                payload,
            })
        }
        1 => {
            let destination = reader.u16()?;
            let seq = reader.u64()?;
            if destination >= partition_count {
                return Err(reader.invalid("destination partition out of range"));
            }
            Internal::Ack { destination, seq }
        }
        _ => return Err(reader.invalid("message tag")),
    };
    reader.finish()?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_outcomes_survive_the_trip() {
        let commands = vec![
            Command {
                app: 3,
                command_id: Some(u128::MAX - 7),
                payload: b"first".to_vec(),
            },
            Command {
                app: 0,
                command_id: None,
                payload: Vec::new(),
            },
        ];
        assert_eq!(
            decode_commands(&encode_commands(&commands)).unwrap(),
            commands
        );
        let outcomes = vec![
            Ok(Reply::Applied(b"ok".to_vec())),
            Ok(Reply::Duplicate(Vec::new())),
            Ok(Reply::InFlight),
            Ok(Reply::Conflict),
            Err(EngineError::Overloaded),
            Err(EngineError::JournalFailed),
            Err(EngineError::ShuttingDown),
            Err(EngineError::UnknownApp(9)),
            Err(EngineError::NotOwner(41)),
            Err(EngineError::DiskFull {
                free_bytes: 5 << 20,
                reserve_bytes: 128 << 20,
            }),
        ];
        assert_eq!(
            decode_outcomes(&encode_outcomes(&outcomes)).unwrap(),
            outcomes
        );
    }

    #[test]
    fn hostile_bytes_are_errors_not_panics() {
        let encoded = encode_commands(&[Command {
            app: 1,
            command_id: Some(5),
            payload: vec![7; 40],
        }]);
        for cut in 0..encoded.len() {
            assert!(decode_commands(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_commands(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_outcomes(&[1, 0, 0, 0, 99]).is_err());
        assert!(decode_message(&[0, 9, 0], 4).is_err());
        let ack = encode_message(&Internal::Ack {
            destination: 4,
            seq: 1,
        })
        .unwrap();
        assert!(
            decode_message(&ack, 4).is_err(),
            "partition 4 of 4 is out of range"
        );
        assert!(decode_message(&ack, 5).is_ok());
    }
}
