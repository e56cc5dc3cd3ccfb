//! Reference data held in memory and swapped whole on reload: the tax table (CSV), merchant settings and
//! feature switches (TOML). Nothing here is read inside apply: the HTTP edge resolves what a request needs
//! and the command carries the result, so a replay after a reload rebuilds the same state.

use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

const BUILT_IN_TAX_RATES: &str = include_str!("../reference/tax_rates.csv");
const BUILT_IN_MERCHANTS: &str = include_str!("../reference/merchants.toml");

/// Tax rates are parts per million: 7.25 % is 72,500.
pub const RATE_PPM_MAX: u64 = 1_000_000;

/// ISO 4217 currencies accepted, with their numeric codes (the fraud rules compare numeric currencies).
pub const CURRENCIES: &[(&str, u16)] = &[
    ("aud", 36),
    ("cad", 124),
    ("chf", 756),
    ("eur", 978),
    ("gbp", 826),
    ("jpy", 392),
    ("sek", 752),
    ("usd", 840),
];

/// The ISO 4217 numeric code of `code`, written in any case (`usd`, `USD`, `Usd`).
pub fn currency_numeric(code: &str) -> Option<u16> {
    CURRENCIES
        .iter()
        .find(|(c, _)| c.eq_ignore_ascii_case(code))
        .map(|(_, numeric)| *numeric)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Features {
    pub fraud_scoring: bool,
    pub decline_on_fraud: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Category {
    pub capture_window_hours: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Merchant {
    pub category: String,
    pub mcc: u16,
    pub country: u16,
    pub city: u32,
    #[serde(default)]
    pub suspended: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MerchantsFile {
    features: Features,
    categories: HashMap<String, Category>,
    merchants: HashMap<String, Merchant>,
}

/// One consistent version of the reference data.
#[derive(Debug)]
pub struct ReferenceData {
    pub features: Features,
    pub categories: HashMap<String, Category>,
    pub merchants: HashMap<String, Merchant>,
    /// (category, jurisdiction) -> rate in ppm.
    pub tax_rates: HashMap<(String, String), u64>,
    pub version: u64,
}

impl ReferenceData {
    pub fn parse(merchants_toml: &str, tax_csv: &str, version: u64) -> Result<Self, String> {
        let file: MerchantsFile =
            toml::from_str(merchants_toml).map_err(|e| format!("merchants: {e}"))?;
        for (name, merchant) in &file.merchants {
            if !file.categories.contains_key(&merchant.category) {
                return Err(format!(
                    "merchants: {name} has category {:?}, which is not under [categories]",
                    merchant.category
                ));
            }
            if merchant.mcc > 9999 || merchant.country > 999 || merchant.city > 99_999 {
                return Err(format!(
                    "merchants: {name}: mcc has at most 4 digits, country 3, city 5"
                ));
            }
        }
        for (name, category) in &file.categories {
            if category.capture_window_hours == 0 || category.capture_window_hours > 24 * 366 {
                return Err(format!(
                    "merchants: category {name}: capture_window_hours must be 1 to {}",
                    24 * 366
                ));
            }
        }
        Ok(Self {
            features: file.features,
            categories: file.categories,
            merchants: file.merchants,
            tax_rates: parse_tax_rates(tax_csv)?,
            version,
        })
    }

    pub fn capture_window_ms(&self, merchant: &Merchant) -> u64 {
        u64::from(self.categories[&merchant.category].capture_window_hours) * 3_600_000
    }

    pub fn tax_rate_ppm(&self, category: &str, jurisdiction: &str) -> Option<u64> {
        self.tax_rates
            .get(&(category.to_string(), jurisdiction.to_string()))
            .copied()
    }
}

/// The tax included in a tax-inclusive `amount` at `rate_ppm`, rounded half up to the minor unit.
pub fn included_tax(amount: u64, rate_ppm: u64) -> u64 {
    let (amount, rate) = (u128::from(amount), u128::from(rate_ppm));
    let denominator = 1_000_000 + rate;
    ((amount * rate * 2 + denominator) / (2 * denominator)) as u64
}

fn parse_rate_ppm(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || whole.len() > 3
        || fraction.len() > 4
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let fraction_ppm: u64 = format!("{fraction:0<4}").parse().ok()?;
    let ppm = whole.parse::<u64>().ok()? * 10_000 + fraction_ppm;
    (ppm <= RATE_PPM_MAX).then_some(ppm)
}

fn parse_tax_rates(csv: &str) -> Result<HashMap<(String, String), u64>, String> {
    let mut rates = HashMap::new();
    let mut header_seen = false;
    for (index, line) in csv.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if !header_seen {
            if fields != ["category", "jurisdiction", "rate_percent"] {
                return Err(format!(
                    "tax rates line {}: the header must be category,jurisdiction,rate_percent",
                    index + 1
                ));
            }
            header_seen = true;
            continue;
        }
        let [category, jurisdiction, rate] = fields[..] else {
            return Err(format!("tax rates line {}: expected 3 fields", index + 1));
        };
        let ppm = parse_rate_ppm(rate).ok_or_else(|| {
            format!(
                "tax rates line {}: rate_percent {rate:?} is not a percentage 0 to 100 with at most 4 decimals",
                index + 1
            )
        })?;
        if rates
            .insert((category.to_string(), jurisdiction.to_string()), ppm)
            .is_some()
        {
            return Err(format!(
                "tax rates line {}: {category},{jurisdiction} appears twice",
                index + 1
            ));
        }
    }
    if !header_seen {
        return Err("tax rates: the file has no header".to_string());
    }
    Ok(rates)
}

/// Where the reference data comes from: files, or the copies built into the binary.
#[derive(Debug, Clone, Default)]
pub struct ReferenceSources {
    pub merchants_file: Option<PathBuf>,
    pub tax_rates_file: Option<PathBuf>,
}

/// The current reference data; readers take an `Arc` and keep a consistent version for a whole request.
pub struct Reference {
    sources: ReferenceSources,
    current: RwLock<Arc<ReferenceData>>,
}

impl Reference {
    pub fn load(sources: ReferenceSources) -> Result<Self, String> {
        let data = Self::read(&sources, 1)?;
        Ok(Self {
            sources,
            current: RwLock::new(Arc::new(data)),
        })
    }

    fn read(sources: &ReferenceSources, version: u64) -> Result<ReferenceData, String> {
        let read = |path: &Option<PathBuf>, built_in: &str| match path {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display())),
            None => Ok(built_in.to_string()),
        };
        ReferenceData::parse(
            &read(&sources.merchants_file, BUILT_IN_MERCHANTS)?,
            &read(&sources.tax_rates_file, BUILT_IN_TAX_RATES)?,
            version,
        )
    }

    pub fn current(&self) -> Arc<ReferenceData> {
        self.current
            .read()
            .expect("the reference lock is never poisoned")
            .clone()
    }

    /// Reads the sources again and swaps the new version in whole; on error the current one stays.
    pub fn reload(&self) -> Result<Arc<ReferenceData>, String> {
        let mut current = self
            .current
            .write()
            .expect("the reference lock is never poisoned");
        let next = Arc::new(Self::read(&self.sources, current.version + 1)?);
        *current = next.clone();
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_reference_data_parses() {
        let data = ReferenceData::parse(BUILT_IN_MERCHANTS, BUILT_IN_TAX_RATES, 1).unwrap();
        assert_eq!(data.tax_rate_ppm("general", "US-CA"), Some(72_500));
        assert_eq!(data.tax_rate_ppm("food", "FR"), Some(55_000));
        assert!(data.features.fraud_scoring);
        let hotel = &data.merchants["harbor_hotel"];
        assert_eq!(data.capture_window_ms(hotel), 720 * 3_600_000);
    }

    #[test]
    fn included_tax_rounds_half_up() {
        // 10.75 at 7.25 % includes 0.7268... -> 0.73
        assert_eq!(included_tax(1075, 72_500), 73);
        assert_eq!(included_tax(12_000, 200_000), 2_000);
        assert_eq!(included_tax(5, 0), 0);
        // 0.42 at 5 % includes exactly 0.02; 0.21 includes 0.01; 0.63 at 50 % includes 0.21
        assert_eq!(included_tax(42, 50_000), 2);
        assert_eq!(included_tax(63, 500_000), 21);
        // 0.03 at 100 % includes 0.015: half up to 0.02
        assert_eq!(included_tax(3, 1_000_000), 2);
    }

    #[test]
    fn bad_tables_are_refused_with_the_line() {
        let bad = "category,jurisdiction,rate_percent\ngeneral,US-CA,7.255555\n";
        assert!(parse_tax_rates(bad).unwrap_err().contains("line 2"));
        let twice = "category,jurisdiction,rate_percent\na,b,1\na,b,2\n";
        assert!(parse_tax_rates(twice).unwrap_err().contains("twice"));
        assert!(parse_tax_rates("a,b,1\n").is_err());
        assert!(parse_tax_rates("category,jurisdiction,rate_percent\na,b,101\n").is_err());
        let unknown_category = "[features]\nfraud_scoring = true\ndecline_on_fraud = true\n[categories]\n[merchants.m]\ncategory = \"x\"\nmcc = 1\ncountry = 1\ncity = 1\n";
        assert!(ReferenceData::parse(unknown_category, BUILT_IN_TAX_RATES, 1).is_err());
    }
}
