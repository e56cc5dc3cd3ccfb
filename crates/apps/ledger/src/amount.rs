//! FSPIOP amounts: decimal strings, held exactly as integers of the currency's minor unit.

use crate::domain::Amount;

/// Digits after the decimal point of a currency's minor unit (ISO 4217). Codes not listed have 2.
pub fn minor_digits(currency: &str) -> u32 {
    match currency {
        "BIF" | "CLP" | "DJF" | "GNF" | "ISK" | "JPY" | "KMF" | "KRW" | "PYG" | "RWF" | "UGX"
        | "UYI" | "VND" | "VUV" | "XAF" | "XOF" | "XPF" => 0,
        "BHD" | "IQD" | "JOD" | "KWD" | "LYD" | "OMR" | "TND" => 3,
        _ => 2,
    }
}

/// A currency code: three ASCII capitals.
pub fn valid_currency(currency: &str) -> bool {
    currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase())
}

/// Most integer digits FSPIOP allows in an amount.
const INTEGER_DIGITS_MAX: usize = 18;
/// Most digits FSPIOP allows after the decimal point.
const FRACTION_DIGITS_MAX: usize = 4;

/// What [`parse`] accepts in a currency with 4 decimals, as a regular expression: the API description
/// says it.
pub fn pattern() -> String {
    format!(
        "^(0|[1-9][0-9]{{0,{}}})([.][0-9]{{0,{}}}[1-9])?$",
        INTEGER_DIGITS_MAX - 1,
        FRACTION_DIGITS_MAX - 1
    )
}

/// Parses FSPIOP's `Amount` (`0` or digits without a leading zero, optionally `.` and at most 4 digits
/// not ending in 0) in `currency`'s minor units. More decimals than the currency has is an error, not a
/// rounding.
pub fn parse(text: &str, currency: &str) -> Result<Amount, String> {
    let (integer, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let integer_ok = digits(integer)
        && integer.len() <= INTEGER_DIGITS_MAX
        && (integer == "0" || !integer.starts_with('0'));
    let fraction_ok = !text.contains('.')
        || (digits(fraction) && fraction.len() <= FRACTION_DIGITS_MAX && !fraction.ends_with('0'));
    if !integer_ok || !fraction_ok {
        return Err(format!(
            "amount {text:?} is not a decimal such as \"100\" or \"12.5\" (at most 18 digits, 4 decimals)"
        ));
    }
    let scale = minor_digits(currency);
    if fraction.len() as u32 > scale {
        return Err(format!(
            "amount {text:?} has more decimals than {currency}'s {scale}"
        ));
    }
    let mut minor: Amount = integer.parse().expect("checked digits");
    for position in 0..scale as usize {
        let digit = fraction.as_bytes().get(position).map_or(0, |b| b - b'0');
        minor = minor * 10 + Amount::from(digit);
    }
    Ok(minor)
}

/// Formats minor units as FSPIOP writes amounts: no trailing zeros after the point, no point if whole.
pub fn format(minor: Amount, currency: &str) -> String {
    let scale = minor_digits(currency);
    let sign = if minor < 0 { "-" } else { "" };
    let magnitude = minor.unsigned_abs();
    let unit = 10u128.pow(scale);
    let (integer, fraction) = (magnitude / unit, magnitude % unit);
    if fraction == 0 {
        return format!("{sign}{integer}");
    }
    let fraction = format!("{fraction:0width$}", width = scale as usize);
    format!("{sign}{integer}.{}", fraction.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exactly_and_refuses_what_fspiop_refuses() {
        assert_eq!(parse("100", "USD"), Ok(10_000));
        assert_eq!(parse("0.5", "USD"), Ok(50));
        assert_eq!(parse("12.34", "USD"), Ok(1_234));
        assert_eq!(parse("7", "JPY"), Ok(7));
        assert_eq!(parse("1.234", "KWD"), Ok(1_234));
        assert_eq!(
            parse("999999999999999999.99", "USD"),
            Ok(99_999_999_999_999_999_999)
        );
        for bad in [
            "",
            "01",
            "1.",
            ".5",
            "1.50",
            "-1",
            "1e3",
            "1.23456",
            "1,5",
            " 1",
            "1234567890123456789",
        ] {
            assert!(parse(bad, "USD").is_err(), "{bad:?}");
        }
        assert!(parse("1.5", "JPY").is_err(), "JPY has no minor unit");
        assert!(parse("1.005", "USD").is_err(), "USD has two decimals");
    }

    #[test]
    fn formats_what_it_parses() {
        for (text, currency) in [
            ("100", "USD"),
            ("0.5", "USD"),
            ("12.34", "USD"),
            ("7", "JPY"),
            ("1.234", "KWD"),
            ("0", "USD"),
        ] {
            assert_eq!(format(parse(text, currency).unwrap(), currency), text);
        }
        assert_eq!(format(-1_250, "USD"), "-12.5");
        assert!(valid_currency("USD") && !valid_currency("usd") && !valid_currency("US"));
    }
}
