//! The payments app's commands, replies, events and the payment object, as postcard bytes in the journal.
//!
//! A command carries everything apply needs that is not the partition's own state: the sealed card, its
//! token, the tax and capture window the edge resolved from reference data, the feature switches. So a
//! replay rebuilds the same state whatever the reference data is at the time.

use crate::keys::SealedCard;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bytes of a payment id: 8 route bytes (the card token's first 8, so every payment of a card lives on
/// the card's partition, next to its fraud history) and 12 unique bytes.
pub const PAYMENT_ID_BYTES: usize = 20;
pub const ROUTE_BYTES: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PaymentId(pub [u8; PAYMENT_ID_BYTES]);

impl PaymentId {
    pub fn new(route: [u8; ROUTE_BYTES], unique: [u8; PAYMENT_ID_BYTES - ROUTE_BYTES]) -> Self {
        let mut id = [0; PAYMENT_ID_BYTES];
        id[..ROUTE_BYTES].copy_from_slice(&route);
        id[ROUTE_BYTES..].copy_from_slice(&unique);
        Self(id)
    }

    /// The engine routing key.
    pub fn route_key(&self) -> &[u8] {
        &self.0[..ROUTE_BYTES]
    }

    /// `pay_` and 40 lowercase hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        let digits = text.strip_prefix("pay_")?;
        if digits.len() != PAYMENT_ID_BYTES * 2 {
            return None;
        }
        let mut id = [0; PAYMENT_ID_BYTES];
        for (index, byte) in id.iter_mut().enumerate() {
            let pair = digits.get(index * 2..index * 2 + 2)?;
            if !pair
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return None;
            }
            *byte = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(Self(id))
    }
}

impl fmt::Display for PaymentId {
    /// Formatted on the stack: every answer names its payment.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = [0; PAYMENT_ID_BYTES * 2];
        hex::encode_to_slice(self.0, &mut digits).expect("two digits per byte");
        f.write_str("pay_")?;
        f.write_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
    }
}

impl fmt::Debug for PaymentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Status {
    Authorized,
    Declined,
    /// Nothing more can be captured: a final capture, the full amount, or expiry after a partial capture.
    Captured,
    Canceled,
    /// The authorization lapsed at `capture_before` with nothing captured.
    Expired,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Authorized,
        Status::Declined,
        Status::Captured,
        Status::Canceled,
        Status::Expired,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Authorized => "authorized",
            Self::Declined => "declined",
            Self::Captured => "captured",
            Self::Canceled => "canceled",
            Self::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CaptureStatus {
    /// Durable, waiting for (or inside) a settlement batch.
    Pending,
    Succeeded,
    /// Settlement refused it (the merchant is suspended).
    Failed,
    /// Voided by a cancel before it settled.
    Canceled,
}

impl CaptureStatus {
    pub fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capture {
    /// The partition's capture sequence: the spool's order.
    pub seq: u64,
    pub amount: u64,
    pub status: CaptureStatus,
    /// The settlement batch it went into.
    pub batch: Option<u64>,
    pub created_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    pub amount: u64,
    pub created_ms: u64,
}

/// The card as stored: never the number in clear, never the CVC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCard {
    pub token: [u8; 16],
    pub masked: String,
    pub sealed: SealedCard,
    pub exp_month: u8,
    pub exp_year: u16,
}

impl StoredCard {
    pub fn token_text(&self) -> String {
        format!("tok_{}", hex::encode(self.token))
    }

    /// The fraud history's card key: the token as a 14-digit number (the fraud record's card field).
    pub fn history_card(&self) -> u64 {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&self.token[..8]);
        u64::from_le_bytes(bytes) % 100_000_000_000_000
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tax {
    pub category: String,
    pub jurisdiction: String,
    pub rate_ppm: u64,
    pub amount: u64,
}

/// What the fraud rules see of the merchant, and the switches in force when the request arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scoring {
    pub enabled: bool,
    pub decline: bool,
    pub mcc: u16,
    pub country: u16,
    pub city: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authorize {
    pub payment: PaymentId,
    pub merchant: String,
    pub amount: u64,
    pub currency: String,
    pub currency_numeric: u16,
    pub card: StoredCard,
    pub cvc_matches: bool,
    pub tax: Tax,
    pub capture_window_ms: u64,
    pub scoring: Scoring,
    pub metadata: Vec<(String, String)>,
    /// `capture_method: automatic`: capture the whole amount as part of the authorization.
    pub capture_now: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Authorize(Box<Authorize>),
    /// `amount: None` captures everything capturable.
    Capture {
        payment: PaymentId,
        amount: Option<u64>,
        final_capture: bool,
    },
    Cancel {
        payment: PaymentId,
    },
    /// `amount: None` refunds everything refundable.
    Refund {
        payment: PaymentId,
        amount: Option<u64>,
    },
    /// Expires the authorizations whose `capture_before` has passed (time is the command's).
    Tick,
    /// Moves up to `limit` spooled captures created at or before `batch` (epoch ms, also the batch id)
    /// into that batch; captures of `suspended` merchants fail instead.
    SettleAssign {
        batch: u64,
        suspended: Vec<String>,
        limit: u32,
    },
    /// Marks up to `limit` more captures of the batch succeeded.
    SettleConfirm {
        batch: u64,
        limit: u32,
    },
}

/// The payment object: the partition's state of one payment, also what replies and events carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    pub id: PaymentId,
    pub created_ms: u64,
    pub merchant: String,
    pub amount: u64,
    pub currency: String,
    pub card: StoredCard,
    pub tax: Tax,
    pub status: Status,
    pub decline_reason: Option<String>,
    /// The fraud rule that fired (also in shadow mode, when it did not decline); 0 when none.
    pub fraud_rule: u8,
    pub capture_before_ms: u64,
    pub amount_capturable: u64,
    pub captures: Vec<Capture>,
    pub refunds: Vec<Refund>,
    pub metadata: Vec<(String, String)>,
}

impl Payment {
    fn sum(&self, statuses: &[CaptureStatus]) -> u64 {
        self.captures
            .iter()
            .filter(|c| statuses.contains(&c.status))
            .map(|c| c.amount)
            .sum()
    }

    /// Pending and succeeded captures.
    pub fn amount_captured(&self) -> u64 {
        self.sum(&[CaptureStatus::Pending, CaptureStatus::Succeeded])
    }

    pub fn amount_settled(&self) -> u64 {
        self.sum(&[CaptureStatus::Succeeded])
    }

    pub fn amount_refunded(&self) -> u64 {
        self.refunds.iter().map(|r| r.amount).sum()
    }

    /// Only settled money can be refunded.
    pub fn amount_refundable(&self) -> u64 {
        self.amount_settled() - self.amount_refunded()
    }

    pub fn capture_id(&self, index: usize) -> String {
        format!("cap_{}_{}", hex::encode(self.id.0), index + 1)
    }

    pub fn refund_id(&self, index: usize) -> String {
        format!("re_{}_{}", hex::encode(self.id.0), index + 1)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    NotFound,
    /// A payment id derived from another request's key is taken (a 96-bit collision).
    Exists,
    WrongStatus {
        status: Status,
        action: String,
    },
    ExceedsCapturable {
        capturable: u64,
    },
    ExceedsRefundable {
        refundable: u64,
    },
    /// A capture of the payment has settled: it can be refunded, not canceled.
    AlreadySettled,
    /// A capture of the payment is in a settlement batch being written.
    SettlementInProgress,
    Malformed(String),
    /// The payment has as many captures as a payment may have.
    TooManyCaptures {
        captures_max: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Payment(Box<Payment>),
    Refused(Refusal),
    Assigned {
        assigned: u64,
        failed: u64,
        more: bool,
    },
    Confirmed {
        confirmed: u64,
        more: bool,
    },
    Ticked {
        expired: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    Authorized,
    Declined,
    CaptureRequested,
    Canceled,
    Refunded,
    Expired,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Authorized => "payment.authorized",
            Self::Declined => "payment.declined",
            Self::CaptureRequested => "payment.capture_requested",
            Self::Canceled => "payment.canceled",
            Self::Refunded => "payment.refunded",
            Self::Expired => "payment.expired",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// The payment as it is after the change.
    Changed {
        kind: EventKind,
        payment: Box<Payment>,
    },
    /// Settlement decided a capture (a delta: one settlement can decide a million captures).
    CaptureSettled {
        payment: PaymentId,
        capture: u16,
        status: CaptureStatus,
        batch: u64,
    },
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("payments values always encode")
}

/// Encodes `value` at the end of `out`. Apply and the snapshot's steps encode into buffers they keep:
/// `encode` grows a new vector from empty for each value, and that showed in the partition's profile
/// (a payment's encoding was most of a snapshot step's time, BENCHMARKS.md, issue 18).
pub fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    postcard::to_io(value, out).expect("payments values always encode");
}

/// A kept buffer's capacity past which it is let go rather than emptied: a payment may hold 65,536
/// captures, and one such would otherwise keep megabytes on every thread that encoded it.
const KEPT_BUFFER_BYTES_MAX: usize = 64 << 10;

/// Empties a kept buffer for its next value.
pub fn reuse(buffer: &mut Vec<u8>) {
    if buffer.capacity() > KEPT_BUFFER_BYTES_MAX {
        *buffer = Vec::new();
    }
    buffer.clear();
}

/// `value`'s bytes, encoded in `buffer` in place of what it held.
pub fn encode_in<'b, T: Serialize>(value: &T, buffer: &'b mut Vec<u8>) -> &'b [u8] {
    reuse(buffer);
    encode_into(value, buffer);
    buffer
}

pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payment_ids_round_trip_and_refuse_near_misses() {
        let id = PaymentId::new([1, 2, 3, 4, 5, 6, 7, 8], [0xab; 12]);
        let text = id.to_string();
        assert_eq!(text.len(), 44);
        assert_eq!(PaymentId::parse(&text), Some(id));
        assert_eq!(PaymentId::parse(&text.to_uppercase()), None);
        assert_eq!(PaymentId::parse(&text[..43]), None);
        assert_eq!(PaymentId::parse(&format!("{text}0")), None);
        assert_eq!(PaymentId::parse(&text.replace("pay_", "pi_x")), None);
        assert_eq!(
            PaymentId::parse("pay_+1020304050607080abababababababababababab"),
            None
        );
    }
}
