//! ski's partition state: the seasons added to the resorts this partition owns.
//!
//! Lift rides keep no partition state: apply accepts a decodable ride and emits it, and the read model
//! ([`crate::model`]) is built from those events. A partition is the single writer of its resorts'
//! season lists, so a season added with `POST` is visible to the next `GET` (it is read from the
//! partition, not from the projection).

use crate::command::{Command, Outcome};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{Effects, StateMachine};
use std::collections::{BTreeMap, BTreeSet};
use std::io;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct SkiState {
    seasons: BTreeMap<u16, BTreeSet<u16>>,
}

impl SkiState {
    pub fn seasons(&self, resort: u16) -> Vec<u16> {
        self.seasons
            .get(&resort)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Reads exactly what [`StateMachine::write_snapshot`] wrote: the engine's snapshot stream goes on
    /// with other apps' state after it.
    pub fn restore(input: &mut dyn io::Read) -> io::Result<Self> {
        let mut seasons = BTreeMap::new();
        for _ in 0..input.read_u32_le()? {
            let resort = input.read_u16_le()?;
            let mut set = BTreeSet::new();
            for _ in 0..input.read_u32_le()? {
                set.insert(input.read_u16_le()?);
            }
            seasons.insert(resort, set);
        }
        Ok(Self { seasons })
    }
}

impl StateMachine for SkiState {
    fn apply(&mut self, command: &spate_engine::Command<'_>, effects: &mut Effects<'_>) {
        let outcome = match Command::decode(command.payload) {
            Err(_) => Outcome::Undecodable,
            Ok(Command::Ride(_)) => {
                effects.emit(command.payload);
                Outcome::RideRecorded
            }
            Ok(Command::AddSeason { resort, season }) => {
                if self.seasons.entry(resort).or_default().insert(season) {
                    Outcome::SeasonAdded
                } else {
                    Outcome::SeasonExisted
                }
            }
        };
        effects.reply().push(outcome.encode());
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_u32_le(self.seasons.len() as u32)?;
        for (resort, seasons) in &self.seasons {
            out.write_u16_le(*resort)?;
            out.write_u32_le(seasons.len() as u32)?;
            for season in seasons {
                out.write_u16_le(*season)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_restores_exactly_its_own_bytes() {
        let mut state = SkiState::default();
        state.seasons.entry(3).or_default().extend([2019, 2022]);
        state.seasons.entry(7).or_default().insert(2021);
        let mut bytes = Vec::new();
        state.write_snapshot(&mut bytes).unwrap();
        bytes.extend_from_slice(b"the next app's state");
        let mut input = &bytes[..];
        let restored = SkiState::restore(&mut input).unwrap();
        assert_eq!(restored, state);
        assert_eq!(input, b"the next app's state");
        assert_eq!(restored.seasons(3), vec![2019, 2022]);
        assert!(restored.seasons(4).is_empty());
    }
}
