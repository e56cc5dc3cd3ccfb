//! ski: the Upic "Ski Data API" v2.0 (`../shared/specs/ski-api.yaml`) on spate.
//!
//! A lift ride `POST`ed to `/skiers/{resortID}/seasons/{seasonID}/days/{dayID}/skiers/{skierID}` is
//! validated at the edge, routed by skier to a partition, and answered 201 once it is durable in the
//! journal: the journal is the queue (the case study ran RabbitMQ between server and consumer). The
//! engine feeds the durable rides to [`model::RideProjection`], the consumer, which builds the read
//! model the `GET`s answer from; it may lag, and its lag is reported. Seasons added with `POST
//! /resorts/{resortID}/seasons` live on the resort's partition.

mod command;
mod http;
pub mod model;
mod state;
mod stats;

pub use command::{Command, Outcome, Ride, vertical_of};
pub use state::SkiState;

use model::{RideProjection, RideStore, StoreError};
use spate_engine::AppSpec;
use spate_server::AppModule;
use std::fmt;
use std::path::Path;

pub const APP_ID: spate_engine::AppId = 4;
pub const APP_NAME: &str = "ski";

/// An inclusive range of accepted ids or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
}

impl Bounds {
    pub const fn new(min: u32, max: u32) -> Self {
        Self { min, max }
    }

    pub fn contains(self, value: i64) -> bool {
        (i64::from(self.min)..=i64::from(self.max)).contains(&value)
    }

    /// Parses `MIN-MAX` (or a single value); [`SkiConfig::check`] bounds the values.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (min, max) = text.split_once('-').unwrap_or((text, text));
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("{text:?} is not MIN-MAX with non-negative integers"))
        };
        let bounds = Self::new(number(min)?, number(max)?);
        if bounds.min > bounds.max {
            return Err(format!("{text:?} has MIN above MAX"));
        }
        Ok(bounds)
    }
}

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} to {}", self.min, self.max)
    }
}

/// Accepted ranges; the defaults are the course assignment's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkiConfig {
    pub resorts: Bounds,
    pub seasons: Bounds,
    pub skiers: Bounds,
    pub lifts: Bounds,
    pub times: Bounds,
}

/// dayID's range, fixed by the spec.
pub const DAYS: Bounds = Bounds::new(1, 366);
/// The most resorts `GET /resorts` lists, which bounds the resort range.
pub const RESORTS_MAX: u32 = 10_000;
/// Largest skierID: the spec's int32.
pub const SKIER_ID_MAX: u32 = i32::MAX as u32;
/// Largest season, lift and time: they are stored in 16 bits.
pub const SMALL_VALUE_MAX: u32 = u16::MAX as u32;

impl Default for SkiConfig {
    fn default() -> Self {
        Self {
            resorts: Bounds::new(1, 10),
            seasons: Bounds::new(1900, 2100),
            skiers: Bounds::new(1, 100_000),
            lifts: Bounds::new(1, 40),
            times: Bounds::new(1, 360),
        }
    }
}

impl SkiConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.resorts.max > RESORTS_MAX || self.resorts.max - self.resorts.min >= RESORTS_MAX {
            return Err(format!("ski resorts must lie within 0 to {RESORTS_MAX}"));
        }
        for (name, bounds, max) in [
            ("seasons", self.seasons, SMALL_VALUE_MAX),
            ("skiers", self.skiers, SKIER_ID_MAX),
            ("lifts", self.lifts, SMALL_VALUE_MAX),
            ("times", self.times, SMALL_VALUE_MAX),
        ] {
            if bounds.min > bounds.max || bounds.max > max {
                return Err(format!("ski {name} must be MIN <= MAX <= {max}"));
            }
        }
        Ok(())
    }
}

/// ski with its read model's store under `data_dir`, whose block cache holds `store_cache_bytes`.
pub fn module(
    config: SkiConfig,
    data_dir: &Path,
    store_cache_bytes: u64,
) -> Result<AppModule, StoreError> {
    let store = RideStore::open(&data_dir.join(APP_NAME).join("model"), store_cache_bytes)?;
    let spec = AppSpec {
        id: APP_ID,
        name: APP_NAME,
        new_state: Box::new(|_| Box::new(SkiState::default())),
        restore: Box::new(|_, input| Ok(Box::new(SkiState::restore(input)?))),
        archives: false,
        projection: Some(Box::new(RideProjection::new(store.clone())?)),
    };
    Ok(AppModule {
        spec,
        routes: Box::new(move |engine, _| {
            engine
                .tend_store(APP_NAME, store.database())
                .map_err(|e| format!("spawning the ski store's threads: {e}"))?;
            Ok(http::routes(engine, store, config))
        }),
        access: spate_server::access::RouteAccess::default(),
        message_only_error_paths: http::PATHS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_parse_and_refuse_nonsense() {
        assert_eq!(Bounds::parse("1-10"), Ok(Bounds::new(1, 10)));
        assert_eq!(Bounds::parse("7"), Ok(Bounds::new(7, 7)));
        assert!(Bounds::parse("10-1").is_err());
        assert!(Bounds::parse("a-b").is_err());
        assert!(Bounds::parse("-3").is_err());
        assert!(Bounds::new(1, 10).contains(10) && !Bounds::new(1, 10).contains(11));
        assert!(SkiConfig::default().check().is_ok());
        let too_many = SkiConfig {
            resorts: Bounds::new(1, 20_000),
            ..SkiConfig::default()
        };
        assert!(too_many.check().is_err());
    }
}
