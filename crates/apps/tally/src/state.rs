//! tally's partition state (accounts) and its projection (totals over all partitions).

use crate::command::{Command, Outcome, decode_entry_event, encode_entry_event};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{
    Effects, EntryCodec, Lsn, Origin, PartitionId, Projection, SegmentedMap, StateMachine,
};
use std::io;
use std::sync::{Arc, RwLock};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    pub balance: i128,
    /// (tag, amount) of every entry, oldest first.
    pub entries: Vec<(u64, i64)>,
}

/// Accounts are snapshotted in steps, a segment at a time, while apply goes on.
type Accounts = SegmentedMap<String, Account, AccountCodec>;

/// Segments of the accounts map: a step's pause is bounded by one segment's accounts.
const ACCOUNT_SEGMENTS: usize = 1024;

#[derive(Debug)]
pub struct TallyState {
    accounts: Accounts,
}

impl Default for TallyState {
    fn default() -> Self {
        Self {
            accounts: Accounts::new(ACCOUNT_SEGMENTS),
        }
    }
}

pub struct AccountCodec;

impl EntryCodec<String, Account> for AccountCodec {
    fn write(name: &String, account: &Account, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_bytes_le(name.as_bytes())?;
        out.write_i128_le(account.balance)?;
        out.write_u64_le(account.entries.len() as u64)?;
        for (tag, amount) in &account.entries {
            out.write_u64_le(*tag)?;
            out.write_u64_le(*amount as u64)?;
        }
        Ok(())
    }

    fn read(input: &mut dyn io::Read) -> io::Result<(String, Account)> {
        let name = String::from_utf8(input.read_bytes_le(crate::command::ACCOUNT_BYTES_MAX)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let balance = input.read_i128_le()?;
        let entry_count = input.read_u64_le()?;
        let mut entries = Vec::new();
        for _ in 0..entry_count {
            entries.push((input.read_u64_le()?, input.read_u64_le()? as i64));
        }
        Ok((name, Account { balance, entries }))
    }
}

impl TallyState {
    pub fn account(&self, name: &str) -> Option<&Account> {
        self.accounts.get(name)
    }

    fn book(&mut self, account: &str, amount: i64, tag: u64, effects: &mut Effects<'_>) -> i128 {
        let entry = self
            .accounts
            .get_or_insert_with(account.to_string(), Account::default);
        entry.balance += i128::from(amount);
        entry.entries.push((tag, amount));
        effects.emit(&encode_entry_event(amount));
        entry.balance
    }

    pub fn restore(input: &mut dyn io::Read) -> io::Result<Self> {
        Ok(Self {
            accounts: Accounts::read(input, ACCOUNT_SEGMENTS)?,
        })
    }
}

impl StateMachine for TallyState {
    fn apply(&mut self, command: &spate_engine::Command<'_>, effects: &mut Effects<'_>) {
        let outcome = match Command::decode(command.payload) {
            Err(error) => Outcome::Rejected {
                reason: format!("undecodable command: {error}"),
            },
            Ok(Command::Add {
                account,
                amount,
                tag,
            }) => Outcome::Applied {
                balance: self.book(&account, amount, tag, effects),
            },
            Ok(Command::Transfer {
                from,
                to,
                amount,
                tag,
            }) => {
                let balance = self.accounts.get(from.as_str()).map_or(0, |a| a.balance);
                if amount <= 0 {
                    // The route refuses it first; a command that did not pass the route (a damaged
                    // record whose checksum still matched) must not move money backwards or
                    // overflow. Found by the fuzz target `app_command`.
                    Outcome::Rejected {
                        reason: "a transfer's amount must be greater than 0".into(),
                    }
                } else if balance < i128::from(amount) {
                    Outcome::InsufficientFunds { balance }
                } else {
                    let balance = self.book(&from, -amount, tag, effects);
                    let credit = Command::Credit {
                        account: to.clone(),
                        amount,
                        tag,
                    };
                    effects.follow_up(to.as_bytes(), credit.encode());
                    Outcome::Applied { balance }
                }
            }
            Ok(Command::Credit {
                account,
                amount,
                tag,
            }) => match command.envelope.origin {
                Origin::FollowUp { .. } => Outcome::Applied {
                    balance: self.book(&account, amount, tag, effects),
                },
                Origin::Client { .. } => Outcome::Rejected {
                    reason: "credit is internal to transfers".into(),
                },
            },
        };
        outcome.encode(effects.reply());
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        self.accounts.write_all(out)
    }

    fn begin_snapshot(&mut self) -> bool {
        self.accounts.begin_snapshot();
        true
    }

    fn write_snapshot_step(
        &mut self,
        out: &mut dyn io::Write,
        bytes_budget: usize,
    ) -> io::Result<bool> {
        self.accounts.snapshot_step(out, bytes_budget)
    }
}

/// The read model: totals over every account of every partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    pub entries: u64,
    #[serde(serialize_with = "as_string")]
    pub balance_sum: i128,
}

fn as_string<S: serde::Serializer>(value: &i128, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

pub struct TotalsProjection {
    totals: Arc<RwLock<Totals>>,
}

impl TotalsProjection {
    pub fn new(totals: Arc<RwLock<Totals>>) -> Self {
        Self { totals }
    }
}

impl Projection for TotalsProjection {
    fn apply(
        &mut self,
        _partition: PartitionId,
        _lsn: Lsn,
        _timestamp_ms: u64,
        event: &[u8],
    ) -> io::Result<()> {
        let amount = decode_entry_event(event).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a tally entry event is 8 bytes, not {}", event.len()),
            )
        })?;
        let mut totals = self
            .totals
            .write()
            .expect("the totals lock is never poisoned");
        totals.entries += 1;
        totals.balance_sum += i128::from(amount);
        Ok(())
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        let totals = *self
            .totals
            .read()
            .expect("the totals lock is never poisoned");
        out.write_u64_le(totals.entries)?;
        out.write_i128_le(totals.balance_sum)
    }

    fn restore(&mut self, input: &mut dyn io::Read, _positions: &[Lsn]) -> io::Result<()> {
        let restored = Totals {
            entries: input.read_u64_le()?,
            balance_sum: input.read_i128_le()?,
        };
        *self
            .totals
            .write()
            .expect("the totals lock is never poisoned") = restored;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Outcome};

    /// See the same test in payments' model: an unreadable event is an error, not a panic.
    #[test]
    fn an_event_it_cannot_read_is_an_error() {
        use spate_engine::Projection;
        let totals = std::sync::Arc::new(std::sync::RwLock::new(super::Totals::default()));
        let mut projection = super::TotalsProjection::new(totals);
        let error = projection.apply(0, 7, 0, &[1, 2, 3]).unwrap_err();
        assert!(error.to_string().contains("8 bytes, not 3"), "{error}");
    }

    /// Found by the fuzz target `app_command`: a transfer of `i64::MIN` overflowed when negated (a
    /// panic in debug builds; in release builds it moved money from the payee to the payer).
    #[test]
    fn a_transfer_that_is_not_positive_is_refused_in_apply() {
        let spec = crate::module().spec;
        for amount in [0, -5, i64::MIN] {
            let transfer = Command::Transfer {
                from: "a".into(),
                to: "b".into(),
                amount,
                tag: 1,
            };
            let replies =
                spate_engine::untrusted::apply_client_commands(&spec, [&transfer.encode()[..]]);
            let outcome = Outcome::decode(&replies[0]).unwrap();
            assert!(
                matches!(&outcome, Outcome::Rejected { reason } if reason.contains("greater than 0")),
                "{amount}: {outcome:?}"
            );
        }
    }
}
