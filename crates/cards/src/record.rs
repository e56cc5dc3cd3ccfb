//! The case study's 100-byte transaction record: nine comma-separated digit fields, NUL padding, `\n`.
//!
//! Parsing is strict (see `specs/fraud.md` §1): a record that is not exactly the format is an error naming
//! what is wrong, never a guess. Every field keeps its exact text: fixed-width fields by their width,
//! variable-width fields as a value plus a digit count, so leading zeros survive a parse/format round trip.

use std::fmt;
use thiserror::Error;

pub const RECORD_BYTES: usize = 100;

/// A string of 1..=19 decimal digits: its value and how many digits it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digits {
    pub value: u64,
    pub len: u8,
}

impl Digits {
    /// The canonical text of `value` (no leading zeros).
    pub fn of(value: u64) -> Self {
        Self {
            value,
            len: digit_count(value),
        }
    }

    /// `value` zero-padded to `width` digits (or more digits if it needs them), like `%0{width}d`.
    pub fn padded(value: u64, width: u8) -> Self {
        Self {
            value,
            len: digit_count(value).max(width),
        }
    }

    /// Exact text equality with a literal such as `"0001"`.
    pub fn is(self, text: &str) -> bool {
        usize::from(self.len) == text.len()
            && text.bytes().all(|b| b.is_ascii_digit())
            && text.bytes().fold(0u64, |v, b| v * 10 + u64::from(b - b'0')) == self.value
    }

    pub fn leading_zeros(self) -> u8 {
        self.len - digit_count(self.value)
    }

    pub fn write(self, out: &mut Vec<u8>) {
        write_padded(self.value, self.len, out);
    }
}

impl fmt::Display for Digits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:0width$}", self.value, width = usize::from(self.len))
    }
}

pub fn digit_count(mut value: u64) -> u8 {
    let mut count = 1;
    while value >= 10 {
        value /= 10;
        count += 1;
    }
    count
}

fn write_padded(mut value: u64, width: u8, out: &mut Vec<u8>) {
    let mut buffer = [b'0'; 20];
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    let start = buffer.len().saturating_sub(usize::from(width)).min(at);
    out.extend_from_slice(&buffer[start..]);
}

/// One card transaction. Fixed-width fields are stored as values; their width is implied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Txn {
    /// 14 digits.
    pub card: u64,
    /// Epoch milliseconds, 1..=19 digits.
    pub timestamp: Digits,
    /// 3 digits.
    pub country: u16,
    /// 2 digits.
    pub response: u8,
    /// 1..=10 digits, at most `AMOUNT_MAX`.
    pub amount: Digits,
    /// 3 digits.
    pub currency: u16,
    /// 4 digits.
    pub merchant: u16,
    /// 5 digits.
    pub city: u32,
    /// 1..=10 digits; leading zeros are significant.
    pub code: Digits,
}

pub const CARD_DIGITS: u8 = 14;
pub const AMOUNT_MAX: u64 = i32::MAX as u64;

/// The fields in record order, for error messages and JSON names.
pub const FIELD_NAMES: [&str; 9] = [
    "card",
    "timestamp",
    "country",
    "response",
    "amount",
    "currency",
    "merchant",
    "city",
    "code",
];

/// Accepted digit counts per field, in record order.
const FIELD_WIDTHS: [(u8, u8); 9] = [
    (14, 14),
    (1, 19),
    (3, 3),
    (2, 2),
    (1, 10),
    (3, 3),
    (4, 4),
    (5, 5),
    (1, 10),
];

impl Txn {
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp.value
    }

    pub fn amount(&self) -> u64 {
        self.amount.value
    }

    /// The body text (no padding, no newline).
    pub fn write_body(&self, out: &mut Vec<u8>) {
        write_padded(self.card, CARD_DIGITS, out);
        out.push(b',');
        self.timestamp.write(out);
        out.push(b',');
        write_padded(u64::from(self.country), 3, out);
        out.push(b',');
        write_padded(u64::from(self.response), 2, out);
        out.push(b',');
        self.amount.write(out);
        out.push(b',');
        write_padded(u64::from(self.currency), 3, out);
        out.push(b',');
        write_padded(u64::from(self.merchant), 4, out);
        out.push(b',');
        write_padded(u64::from(self.city), 5, out);
        out.push(b',');
        self.code.write(out);
    }

    /// Appends the full 100-byte record.
    pub fn write_record(&self, out: &mut Vec<u8>) {
        let start = out.len();
        self.write_body(out);
        debug_assert!(
            out.len() - start < RECORD_BYTES,
            "a body is at most 78 bytes"
        );
        out.resize(start + RECORD_BYTES - 1, 0);
        out.push(b'\n');
    }

    pub fn to_record(&self) -> [u8; RECORD_BYTES] {
        let mut out = Vec::with_capacity(RECORD_BYTES);
        self.write_record(&mut out);
        out.try_into()
            .expect("write_record writes exactly RECORD_BYTES")
    }

    /// Checks the widths and ranges a parsed record guarantees, for values built some other way (JSON).
    pub fn validate(&self) -> Result<(), RecordError> {
        let fixed = [
            (0, self.card, 14),
            (2, u64::from(self.country), 3),
            (3, u64::from(self.response), 2),
            (5, u64::from(self.currency), 3),
            (6, u64::from(self.merchant), 4),
            (7, u64::from(self.city), 5),
        ];
        for (field, value, width) in fixed {
            if digit_count(value) > width {
                return Err(RecordError::Width {
                    field: FIELD_NAMES[field],
                    len: usize::from(digit_count(value)),
                });
            }
        }
        for (field, digits) in [(1, self.timestamp), (4, self.amount), (8, self.code)] {
            let (min, max) = FIELD_WIDTHS[field];
            if digits.len < min || digits.len > max || digit_count(digits.value) > digits.len {
                return Err(RecordError::Width {
                    field: FIELD_NAMES[field],
                    len: usize::from(digits.len),
                });
            }
        }
        if self.amount.value > AMOUNT_MAX {
            return Err(RecordError::AmountTooLarge);
        }
        Ok(())
    }

    /// The card as it may appear in logs: all but the last four digits hidden.
    pub fn masked_card(&self) -> String {
        mask_card(self.card)
    }
}

pub fn mask_card(card: u64) -> String {
    format!("**********{:04}", card % 10_000)
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("a record is {RECORD_BYTES} bytes, got {0}")]
    WrongLength(usize),
    #[error("byte {RECORD_BYTES} of a record must be a newline")]
    MissingNewline,
    #[error("only NUL bytes may follow the body (found byte {0:#04x} at offset {1})")]
    BadPadding(u8, usize),
    #[error("a record has 9 comma-separated fields, got {0}")]
    FieldCount(usize),
    #[error("field {field} must be digits only")]
    NonDigit { field: &'static str },
    #[error("field {field} has {len} digits, which is not an accepted width")]
    Width { field: &'static str, len: usize },
    #[error("field amount is above {AMOUNT_MAX}")]
    AmountTooLarge,
}

/// Parses one 100-byte record.
pub fn parse_record(record: &[u8]) -> Result<Txn, RecordError> {
    if record.len() != RECORD_BYTES {
        return Err(RecordError::WrongLength(record.len()));
    }
    if record[RECORD_BYTES - 1] != b'\n' {
        return Err(RecordError::MissingNewline);
    }
    let padded = &record[..RECORD_BYTES - 1];
    let body_len = padded.iter().position(|&b| b == 0).unwrap_or(padded.len());
    if let Some(offset) = padded[body_len..].iter().position(|&b| b != 0) {
        return Err(RecordError::BadPadding(
            padded[body_len + offset],
            body_len + offset,
        ));
    }
    parse_body(&padded[..body_len])
}

/// Parses the comma-separated body of a record.
pub fn parse_body(body: &[u8]) -> Result<Txn, RecordError> {
    let count = body.split(|&b| b == b',').count();
    if count != FIELD_NAMES.len() {
        return Err(RecordError::FieldCount(count));
    }
    let mut fields = [Digits::default(); 9];
    for (index, text) in body.split(|&b| b == b',').enumerate() {
        fields[index] = parse_field(index, text)?;
    }
    Txn::from_fields(fields)
}

impl Txn {
    /// A transaction from its nine fields in record order, each already checked by [`parse_field`].
    pub fn from_fields(fields: [Digits; 9]) -> Result<Self, RecordError> {
        let [
            card,
            timestamp,
            country,
            response,
            amount,
            currency,
            merchant,
            city,
            code,
        ] = fields;
        if amount.value > AMOUNT_MAX {
            return Err(RecordError::AmountTooLarge);
        }
        // Widths were checked, so the narrowing casts below cannot truncate.
        Ok(Self {
            card: card.value,
            timestamp,
            country: country.value as u16,
            response: response.value as u8,
            amount,
            currency: currency.value as u16,
            merchant: merchant.value as u16,
            city: city.value as u32,
            code,
        })
    }
}

/// Parses a field's text given its position; also used for JSON input.
pub fn parse_field(index: usize, text: &[u8]) -> Result<Digits, RecordError> {
    let field = FIELD_NAMES[index];
    let (min, max) = FIELD_WIDTHS[index];
    if !text.iter().all(u8::is_ascii_digit) {
        return Err(RecordError::NonDigit { field });
    }
    if text.len() < usize::from(min) || text.len() > usize::from(max) {
        return Err(RecordError::Width {
            field,
            len: text.len(),
        });
    }
    let value = text
        .iter()
        .fold(0u64, |value, &digit| value * 10 + u64::from(digit - b'0'));
    Ok(Digits {
        value,
        len: text.len() as u8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE_BODY: &[u8] = b"00000000548985,1795294622406,185,00,3915,185,0485,08985,548985";

    fn record_of(body: &[u8]) -> Vec<u8> {
        let mut record = body.to_vec();
        record.resize(RECORD_BYTES - 1, 0);
        record.push(b'\n');
        record
    }

    #[test]
    fn parses_and_formats_the_spec_example_exactly() {
        let record = record_of(EXAMPLE_BODY);
        let txn = parse_record(&record).unwrap();
        assert_eq!(txn.card, 548_985);
        assert_eq!(txn.timestamp_ms(), 1_795_294_622_406);
        assert_eq!(
            (txn.country, txn.response, txn.amount(), txn.currency),
            (185, 0, 3915, 185)
        );
        assert_eq!((txn.merchant, txn.city), (485, 8985));
        assert!(txn.code.is("548985"));
        assert_eq!(txn.to_record().as_slice(), record.as_slice());
    }

    #[test]
    fn leading_zeros_of_variable_fields_survive_a_round_trip() {
        let body = b"00000000000001,0001795294622406,001,07,0000003915,002,0022,00000,0001";
        let txn = parse_record(&record_of(body)).unwrap();
        assert!(txn.code.is("0001") && !txn.code.is("00001") && !txn.code.is("1"));
        assert_eq!(txn.timestamp.leading_zeros(), 3);
        let mut out = Vec::new();
        txn.write_body(&mut out);
        assert_eq!(out, body);
    }

    #[test]
    fn rejects_each_kind_of_malformed_record() {
        let good = record_of(EXAMPLE_BODY);
        assert_eq!(parse_record(&good[..99]), Err(RecordError::WrongLength(99)));
        let mut no_newline = good.clone();
        no_newline[99] = 0;
        assert_eq!(parse_record(&no_newline), Err(RecordError::MissingNewline));
        let mut garbage = good.clone();
        garbage[80] = b'x';
        assert!(matches!(
            parse_record(&garbage),
            Err(RecordError::BadPadding(b'x', 80))
        ));
        let cases: [(&[u8], RecordError); 7] = [
            (b"1,2,3", RecordError::FieldCount(3)),
            (
                b"00000000548985,1795294622406,185,00,3915,185,0485,08985,548985,1",
                RecordError::FieldCount(10),
            ),
            (
                b"0000000054898,1795294622406,185,00,3915,185,0485,08985,548985",
                RecordError::Width {
                    field: "card",
                    len: 13,
                },
            ),
            (
                b"00000000548985,1795294622406,18a,00,3915,185,0485,08985,548985",
                RecordError::NonDigit { field: "country" },
            ),
            (
                b"00000000548985,1795294622406,185,00,,185,0485,08985,548985",
                RecordError::Width {
                    field: "amount",
                    len: 0,
                },
            ),
            (
                b"00000000548985,1795294622406,185,00,2147483648,185,0485,08985,548985",
                RecordError::AmountTooLarge,
            ),
            (
                b"00000000548985,-1795294622406,185,00,3915,185,0485,08985,548985",
                RecordError::NonDigit { field: "timestamp" },
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(
                parse_record(&record_of(body)),
                Err(expected),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let too_long = [b'1'; 99];
        assert!(parse_record(&record_of(&too_long)).is_err());
    }

    #[test]
    fn masking_shows_only_the_last_four_digits() {
        assert_eq!(mask_card(4_000_222_100), "**********2100");
    }
}
