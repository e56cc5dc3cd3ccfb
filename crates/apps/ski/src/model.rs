//! The read model: the seed's questions answered from lift-ride events.
//!
//! Built by [`RideProjection`] on the engine's projection thread, which may lag the partitions; the
//! lag is reported by `GET /ski/lag` and the `spate_projection_lag_records` metric. Every ride is kept
//! (the seed's Redis model lost rides that shared skier, day and time; here each acknowledged POST is a
//! ride), so every figure is derived from the rides themselves.

use crate::command::{Ride, vertical_of};
use spate_engine::wire::{ReadLe, WriteLe};
use spate_engine::{Lsn, PartitionId, Projection};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, RwLock};

/// A ride as the read model keeps it under its skier, season and day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayRide {
    pub resort: u16,
    pub time: u16,
    pub lift: u16,
}

/// One day a skier skied, over every resort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaySummary {
    pub day: u16,
    pub rides: u32,
    pub vertical: u64,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct RideModel {
    /// (skier, season, day) -> the day's rides in journal order. Ordered, so one skier's season or
    /// seasons are a range scan.
    days: BTreeMap<(u32, u16, u16), Vec<DayRide>>,
    /// (resort, season, day) -> skiers with at least one ride there that day.
    unique_skiers: HashMap<(u16, u16, u16), u32>,
    /// resort -> seasons with at least one ride.
    ride_seasons: BTreeMap<u16, BTreeSet<u16>>,
    rides: u64,
}

impl RideModel {
    pub fn apply(&mut self, ride: &Ride) {
        let rides = self
            .days
            .entry((ride.skier, ride.season, ride.day))
            .or_default();
        if !rides.iter().any(|r| r.resort == ride.resort) {
            *self
                .unique_skiers
                .entry((ride.resort, ride.season, ride.day))
                .or_default() += 1;
        }
        rides.push(DayRide {
            resort: ride.resort,
            time: ride.time,
            lift: ride.lift,
        });
        if let Some(seasons) = self.ride_seasons.get_mut(&ride.resort) {
            seasons.insert(ride.season);
        } else {
            self.ride_seasons
                .insert(ride.resort, BTreeSet::from([ride.season]));
        }
        self.rides += 1;
    }

    pub fn ride_count(&self) -> u64 {
        self.rides
    }

    /// Vertical of `skier` at `resort` on one day; `None` without a ride there that day.
    pub fn day_vertical(&self, resort: u16, season: u16, day: u16, skier: u32) -> Option<u64> {
        let rides = self.days.get(&(skier, season, day))?;
        let mut at_resort = rides.iter().filter(|r| r.resort == resort).peekable();
        at_resort.peek()?;
        Some(at_resort.map(|r| vertical_of(r.lift)).sum())
    }

    /// The days `skier` skied in `season`, in day order.
    pub fn days_skied(&self, skier: u32, season: u16) -> Vec<DaySummary> {
        self.days
            .range((skier, season, 0)..=(skier, season, u16::MAX))
            .map(|(&(_, _, day), rides)| DaySummary {
                day,
                rides: rides.len() as u32,
                vertical: rides.iter().map(|r| vertical_of(r.lift)).sum(),
            })
            .collect()
    }

    /// The rides of `skier` on one day, over every resort; `None` if there are none.
    pub fn lifts(&self, skier: u32, season: u16, day: u16) -> Option<&[DayRide]> {
        self.days.get(&(skier, season, day)).map(Vec::as_slice)
    }

    pub fn unique_skiers(&self, resort: u16, season: u16, day: u16) -> u32 {
        self.unique_skiers
            .get(&(resort, season, day))
            .copied()
            .unwrap_or(0)
    }

    /// Total vertical of `skier` at `resort` per season with rides there, limited to `seasons` when
    /// given; in season order.
    pub fn season_verticals(
        &self,
        skier: u32,
        resort: u16,
        seasons: Option<&[u16]>,
    ) -> Vec<(u16, u64)> {
        let mut totals: BTreeMap<u16, u64> = BTreeMap::new();
        for (&(_, season, _), rides) in self.days.range((skier, 0, 0)..=(skier, u16::MAX, u16::MAX))
        {
            if seasons.is_some_and(|wanted| !wanted.contains(&season)) {
                continue;
            }
            for ride in rides.iter().filter(|r| r.resort == resort) {
                *totals.entry(season).or_default() += vertical_of(ride.lift);
            }
        }
        totals.into_iter().collect()
    }

    pub fn seasons_with_rides(&self, resort: u16) -> impl Iterator<Item = u16> + '_ {
        self.ride_seasons
            .get(&resort)
            .into_iter()
            .flatten()
            .copied()
    }

    /// Writes the rides; the indexes are rebuilt from them on restore.
    pub fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        out.write_u64_le(self.days.len() as u64)?;
        for (&(skier, season, day), rides) in &self.days {
            out.write_u32_le(skier)?;
            out.write_u16_le(season)?;
            out.write_u16_le(day)?;
            out.write_u32_le(rides.len() as u32)?;
            for ride in rides {
                out.write_u16_le(ride.resort)?;
                out.write_u16_le(ride.time)?;
                out.write_u16_le(ride.lift)?;
            }
        }
        Ok(())
    }

    pub fn restore(input: &mut dyn io::Read) -> io::Result<Self> {
        let mut model = Self::default();
        for _ in 0..input.read_u64_le()? {
            let skier = input.read_u32_le()?;
            let season = input.read_u16_le()?;
            let day = input.read_u16_le()?;
            for _ in 0..input.read_u32_le()? {
                model.apply(&Ride {
                    resort: input.read_u16_le()?,
                    season,
                    day,
                    skier,
                    time: input.read_u16_le()?,
                    lift: input.read_u16_le()?,
                });
            }
        }
        Ok(model)
    }
}

/// Shared between the projection thread (the one writer) and the query handlers.
pub type SharedModel = Arc<RwLock<RideModel>>;

pub struct RideProjection {
    model: SharedModel,
}

impl RideProjection {
    pub fn new(model: SharedModel) -> Self {
        Self { model }
    }
}

impl Projection for RideProjection {
    fn apply(&mut self, _partition: PartitionId, _lsn: Lsn, _timestamp_ms: u64, event: &[u8]) {
        let ride = Ride::decode_event(event).expect("ski emits only the ride commands it decoded");
        self.model
            .write()
            .expect("the ride model lock is never poisoned")
            .apply(&ride);
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        self.model
            .read()
            .expect("the ride model lock is never poisoned")
            .write_snapshot(out)
    }

    fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        let restored = RideModel::restore(input)?;
        *self
            .model
            .write()
            .expect("the ride model lock is never poisoned") = restored;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rides() -> impl Strategy<Value = Vec<Ride>> {
        // Small ranges, so skiers, days and resorts repeat.
        let ride = (
            1u16..4,
            2020u16..2023,
            1u16..5,
            1u32..6,
            1u16..361,
            1u16..41,
        )
            .prop_map(|(resort, season, day, skier, time, lift)| Ride {
                resort,
                season,
                day,
                skier,
                time,
                lift,
            });
        proptest::collection::vec(ride, 0..300)
    }

    proptest! {
        #[test]
        fn every_answer_is_what_the_rides_imply(rides in rides()) {
            let mut model = RideModel::default();
            for ride in &rides {
                model.apply(ride);
            }
            prop_assert_eq!(model.ride_count(), rides.len() as u64);
            for resort in 1..4 {
                for season in 2020..2023 {
                    for day in 1..5 {
                        let skiers: BTreeSet<u32> = rides.iter()
                            .filter(|r| (r.resort, r.season, r.day) == (resort, season, day))
                            .map(|r| r.skier).collect();
                        prop_assert_eq!(model.unique_skiers(resort, season, day), skiers.len() as u32);
                        for skier in 1..6 {
                            let there: Vec<&Ride> = rides.iter()
                                .filter(|r| (r.resort, r.season, r.day, r.skier) == (resort, season, day, skier))
                                .collect();
                            let expected = (!there.is_empty())
                                .then(|| there.iter().map(|r| vertical_of(r.lift)).sum());
                            prop_assert_eq!(model.day_vertical(resort, season, day, skier), expected);
                        }
                    }
                    let seen = rides.iter().any(|r| (r.resort, r.season) == (resort, season));
                    prop_assert_eq!(model.seasons_with_rides(resort).any(|s| s == season), seen);
                }
            }
            for skier in 1..6 {
                for season in 2020..2023 {
                    let mine: Vec<&Ride> = rides.iter().filter(|r| (r.skier, r.season) == (skier, season)).collect();
                    let days: BTreeSet<u16> = mine.iter().map(|r| r.day).collect();
                    let summaries = model.days_skied(skier, season);
                    prop_assert_eq!(summaries.iter().map(|s| s.day).collect::<Vec<_>>(), days.iter().copied().collect::<Vec<_>>());
                    for summary in &summaries {
                        let that_day: Vec<&&Ride> = mine.iter().filter(|r| r.day == summary.day).collect();
                        prop_assert_eq!(summary.rides as usize, that_day.len());
                        prop_assert_eq!(summary.vertical, that_day.iter().map(|r| vertical_of(r.lift)).sum::<u64>());
                        let lifts: Vec<(u16, u16, u16)> = that_day.iter().map(|r| (r.resort, r.time, r.lift)).collect();
                        let stored: Vec<(u16, u16, u16)> = model.lifts(skier, season, summary.day).unwrap()
                            .iter().map(|r| (r.resort, r.time, r.lift)).collect();
                        prop_assert_eq!(stored, lifts);
                    }
                }
                for resort in 1..4 {
                    let mut expected: BTreeMap<u16, u64> = BTreeMap::new();
                    for r in rides.iter().filter(|r| (r.skier, r.resort) == (skier, resort)) {
                        *expected.entry(r.season).or_default() += vertical_of(r.lift);
                    }
                    prop_assert_eq!(model.season_verticals(skier, resort, None), expected.clone().into_iter().collect::<Vec<_>>());
                    let only_2021: Vec<(u16, u64)> = expected.into_iter().filter(|(s, _)| *s == 2021).collect();
                    prop_assert_eq!(model.season_verticals(skier, resort, Some(&[2021])), only_2021);
                }
            }
            let mut bytes = Vec::new();
            model.write_snapshot(&mut bytes).unwrap();
            bytes.push(0xAB);
            let mut input = &bytes[..];
            prop_assert_eq!(RideModel::restore(&mut input).unwrap(), model);
            prop_assert_eq!(input, &[0xAB][..]);
        }
    }
}
