//! Card fields as a client sends them: the number (Luhn-checked), expiry and CVC. Everything here runs at the
//! HTTP edge; the number leaves it only sealed, as a token and masked, and the CVC never leaves it.

pub const NUMBER_DIGITS_MIN: usize = 12;
pub const NUMBER_DIGITS_MAX: usize = 19;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CardError {
    #[error("card.number must be {NUMBER_DIGITS_MIN} to {NUMBER_DIGITS_MAX} digits")]
    NumberFormat,
    #[error("card.number fails the Luhn check")]
    Luhn,
    #[error("card.exp_month must be 1 to 12")]
    ExpMonth,
    #[error("card.exp_year must be 2000 to 2099")]
    ExpYear,
    #[error("card.cvc must be 3 or 4 digits")]
    CvcFormat,
}

/// A card number that passed the format and Luhn checks.
#[derive(Clone, PartialEq, Eq)]
pub struct CardNumber(String);

impl std::fmt::Debug for CardNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CardNumber({})", self.masked())
    }
}

impl CardNumber {
    pub fn parse(text: &str) -> Result<Self, CardError> {
        let digits = text.as_bytes();
        if !(NUMBER_DIGITS_MIN..=NUMBER_DIGITS_MAX).contains(&digits.len())
            || !digits.iter().all(u8::is_ascii_digit)
        {
            return Err(CardError::NumberFormat);
        }
        if !luhn_valid(digits) {
            return Err(CardError::Luhn);
        }
        Ok(Self(text.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 6 and last 4 digits, the rest as `*`: the most PCI DSS allows to show.
    pub fn masked(&self) -> String {
        let n = self.0.len();
        format!("{}{}{}", &self.0[..6], "*".repeat(n - 10), &self.0[n - 4..])
    }

    /// American Express numbers start with 34 or 37 and have a 4-digit CVC; the others 3.
    fn cvc_digits(&self) -> usize {
        if self.0.starts_with("34") || self.0.starts_with("37") {
            4
        } else {
            3
        }
    }
}

/// The Luhn sum of `digits`, the last one counted as the check digit when `has_check_digit`.
fn luhn_sum(digits: &[u8], has_check_digit: bool) -> u32 {
    let doubled_position = usize::from(has_check_digit);
    digits
        .iter()
        .rev()
        .enumerate()
        .map(|(position, digit)| {
            let d = u32::from(digit - b'0');
            if position % 2 == doubled_position {
                let doubled = d * 2;
                if doubled > 9 { doubled - 9 } else { doubled }
            } else {
                d
            }
        })
        .sum()
}

fn luhn_valid(digits: &[u8]) -> bool {
    luhn_sum(digits, true).is_multiple_of(10)
}

/// A Luhn-valid 16-digit number for `index`, starting with 4: distinct cards for load generators and
/// tests (one card per payment keeps the fraud rules' velocity checks out of runs not about them).
pub fn test_number(index: u64) -> String {
    let body = format!("4{:014}", index % 100_000_000_000_000);
    let check = (10 - luhn_sum(body.as_bytes(), false) % 10) % 10;
    format!("{body}{check}")
}

/// The authorization's verdict on the CVC, the only thing about it that goes further than the edge.
/// Without an issuer to ask, a well-formed CVC of the wrong length for the card's brand is incorrect.
pub fn cvc_matches(number: &CardNumber, cvc: &str) -> Result<bool, CardError> {
    if !(3..=4).contains(&cvc.len()) || !cvc.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CardError::CvcFormat);
    }
    Ok(cvc.len() == number.cvc_digits())
}

pub fn check_expiry(exp_month: u8, exp_year: u16) -> Result<(), CardError> {
    if !(1..=12).contains(&exp_month) {
        return Err(CardError::ExpMonth);
    }
    if !(2000..=2099).contains(&exp_year) {
        return Err(CardError::ExpYear);
    }
    Ok(())
}

/// Whether a card valid through (`exp_month`, `exp_year`) has expired at `now_ms`: it is valid to the end
/// of its expiry month, UTC.
pub fn expired_at(exp_month: u8, exp_year: u16, now_ms: u64) -> bool {
    let now = time::OffsetDateTime::UNIX_EPOCH + time::Duration::milliseconds(now_ms as i64);
    let (year, month) = (now.year(), u8::from(now.month()));
    (i32::from(exp_year), exp_month) < (year, month)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luhn_accepts_test_cards_and_refuses_one_digit_off() {
        for good in [
            "4242424242424242",
            "5555555555554444",
            "378282246310005",
            "6011111111111117",
        ] {
            assert!(CardNumber::parse(good).is_ok(), "{good}");
        }
        assert_eq!(CardNumber::parse("4242424242424241"), Err(CardError::Luhn));
        assert_eq!(
            CardNumber::parse("4242-4242-4242-4242"),
            Err(CardError::NumberFormat)
        );
        assert_eq!(
            CardNumber::parse("42424242424"),
            Err(CardError::NumberFormat)
        );
        assert_eq!(
            CardNumber::parse("42424242424242424242"),
            Err(CardError::NumberFormat)
        );
    }

    #[test]
    fn test_numbers_pass_the_luhn_check() {
        for index in [0, 1, 42, 99_999_999_999_999, 90_000_000_000_123] {
            let number = test_number(index);
            assert!(CardNumber::parse(&number).is_ok(), "{number}");
        }
        assert_eq!(test_number(0), "4000000000000002");
        let mut wrong = test_number(7).into_bytes();
        wrong[15] = b'0' + (wrong[15] - b'0' + 1) % 10;
        assert_eq!(
            CardNumber::parse(std::str::from_utf8(&wrong).unwrap()),
            Err(CardError::Luhn)
        );
    }

    #[test]
    fn masking_shows_six_and_four_and_debug_never_the_number() {
        let card = CardNumber::parse("4242424242424242").unwrap();
        assert_eq!(card.masked(), "424242******4242");
        assert!(!format!("{card:?}").contains("4242424242424242"));
        let amex = CardNumber::parse("378282246310005").unwrap();
        assert_eq!(amex.masked(), "378282*****0005");
    }

    #[test]
    fn cvc_length_follows_the_brand() {
        let visa = CardNumber::parse("4242424242424242").unwrap();
        let amex = CardNumber::parse("378282246310005").unwrap();
        assert_eq!(cvc_matches(&visa, "123"), Ok(true));
        assert_eq!(cvc_matches(&visa, "1234"), Ok(false));
        assert_eq!(cvc_matches(&amex, "1234"), Ok(true));
        assert_eq!(cvc_matches(&visa, "12a"), Err(CardError::CvcFormat));
        assert_eq!(cvc_matches(&visa, "12"), Err(CardError::CvcFormat));
    }

    #[test]
    fn a_card_is_valid_through_its_expiry_month() {
        // 2026-11-22T00:00:00Z
        let now_ms = 1_795_305_600_000;
        assert!(!expired_at(11, 2026, now_ms));
        assert!(expired_at(10, 2026, now_ms));
        assert!(!expired_at(1, 2027, now_ms));
        assert!(expired_at(12, 2025, now_ms));
    }
}
