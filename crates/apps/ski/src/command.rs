//! ski's commands and events, and their binary encoding in the journal.
//!
//! A lift ride is both the command and the event: the partition accepts it as it is and emits it for the
//! read model, so the journal is the queue the case study ran RabbitMQ for.

use spate_engine::wire::{Put, Reader, WireError};

/// One lift ride, as validated at the edge. Ranges are configuration ([`crate::SkiConfig`]); apply never
/// re-checks them, so changing the configuration never changes what a replay rebuilds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ride {
    pub resort: u16,
    pub season: u16,
    pub day: u16,
    pub skier: u32,
    pub time: u16,
    pub lift: u16,
}

/// Vertical metres of one ride: the assignment's rule, liftID x 10.
pub fn vertical_of(lift: u16) -> u64 {
    u64::from(lift) * 10
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Ride(Ride),
    /// Adds a season to a resort's list; routed to the resort's partition.
    AddSeason {
        resort: u16,
        season: u16,
    },
}

const RIDE: u8 = 0;
const ADD_SEASON: u8 = 1;
pub(crate) const RIDE_BYTES: usize = 15;

impl Ride {
    pub fn encode_into(&self, buf: &mut Vec<u8>) {
        buf.put_u8(RIDE);
        buf.put_u16(self.resort);
        buf.put_u16(self.season);
        buf.put_u16(self.day);
        buf.put_u32(self.skier);
        buf.put_u16(self.time);
        buf.put_u16(self.lift);
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            resort: r.u16()?,
            season: r.u16()?,
            day: r.u16()?,
            skier: r.u32()?,
            time: r.u16()?,
            lift: r.u16()?,
        })
    }

    /// Decodes a ride event (the encoding of `Command::Ride`).
    pub fn decode_event(bytes: &[u8]) -> Result<Self, WireError> {
        match Command::decode(bytes)? {
            Command::Ride(ride) => Ok(ride),
            Command::AddSeason { .. } => Err(Reader::new(bytes).invalid("not a ride event")),
        }
    }
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(RIDE_BYTES);
        match self {
            Self::Ride(ride) => ride.encode_into(&mut buf),
            Self::AddSeason { resort, season } => {
                buf.put_u8(ADD_SEASON);
                buf.put_u16(*resort);
                buf.put_u16(*season);
            }
        }
        buf
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let command = match r.u8()? {
            RIDE => Self::Ride(Ride::read(&mut r)?),
            ADD_SEASON => Self::AddSeason {
                resort: r.u16()?,
                season: r.u16()?,
            },
            _ => return Err(r.invalid("unknown ski command")),
        };
        r.finish()?;
        Ok(command)
    }
}

/// What apply answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    RideRecorded,
    SeasonAdded,
    SeasonExisted,
    Undecodable,
}

impl Outcome {
    pub fn encode(self) -> u8 {
        match self {
            Self::RideRecorded => 0,
            Self::SeasonAdded => 1,
            Self::SeasonExisted => 2,
            Self::Undecodable => 3,
        }
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [0] => Some(Self::RideRecorded),
            [1] => Some(Self::SeasonAdded),
            [2] => Some(Self::SeasonExisted),
            [3] => Some(Self::Undecodable),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_bad_bytes_are_errors() {
        let ride = Ride {
            resort: 10,
            season: 2022,
            day: 366,
            skier: 100_000,
            time: 360,
            lift: 40,
        };
        let encoded = Command::Ride(ride).encode();
        assert_eq!(encoded.len(), RIDE_BYTES);
        assert_eq!(Command::decode(&encoded).unwrap(), Command::Ride(ride));
        assert_eq!(Ride::decode_event(&encoded).unwrap(), ride);
        let season = Command::AddSeason {
            resort: 3,
            season: 2019,
        };
        assert_eq!(Command::decode(&season.encode()).unwrap(), season);
        assert!(Ride::decode_event(&season.encode()).is_err());
        assert!(Command::decode(&encoded[..RIDE_BYTES - 1]).is_err());
        assert!(Command::decode(&[9]).is_err());
        assert!(Command::decode(&[]).is_err());
        for outcome in [
            Outcome::RideRecorded,
            Outcome::SeasonAdded,
            Outcome::SeasonExisted,
            Outcome::Undecodable,
        ] {
            assert_eq!(Outcome::decode(&[outcome.encode()]), Some(outcome));
        }
        assert_eq!(Outcome::decode(&[]), None);
    }
}
