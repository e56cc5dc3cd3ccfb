//! Rule sets: what decides whether a transaction is fraud, given the card's recent history.
//!
//! [`CaseStudyRules`] is the built-in set: the 49 rules of `specs/fraud.md` §4, first firing rule wins.
//! It evaluates the rules that look only at the current transaction first (most transactions stop there or
//! at rule 36), then computes every history aggregate in a single pass over the history instead of one
//! scan per rule. `tests.rs` checks it, rule by rule, against a literal one-scan-per-rule transcription.

use crate::DAY_MS;
use crate::record::{Digits, Txn};

pub const HOUR_MS: u64 = 3_600_000;

/// A pluggable scoring policy.
pub trait RuleSet: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// How many rules the set has; results are in `0..=rule_count()`. At most [`RULES_MAX`].
    fn rule_count(&self) -> u8;

    /// The first rule that fires for `current`, or 0 when it is not fraud. `history` is the card's stored
    /// transactions with a timestamp after `current`'s minus 90 days, newest first (among equal
    /// timestamps the one stored later first). Must be a pure function of its arguments.
    fn score(&self, current: &Txn, history: &[Txn]) -> u8;
}

/// Results are stored in 6 bits, and one value is reserved for history that was never scored.
pub const RULES_MAX: u8 = 62;

/// The case study's 49 rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaseStudyRules;

impl RuleSet for CaseStudyRules {
    fn name(&self) -> &'static str {
        "case-study-49"
    }

    fn rule_count(&self) -> u8 {
        49
    }

    fn score(&self, current: &Txn, history: &[Txn]) -> u8 {
        let own = current_only_hits(current);
        if own != 0 {
            return first_rule(own);
        }
        // Against a real history nearly every transaction stops at rule 36, so a lighter pass that
        // computes only rules 21-36 goes first.
        let early = history_hits::<false>(current, history);
        if early != 0 {
            return first_rule(early);
        }
        first_rule(history_hits::<true>(current, history))
    }
}

impl CaseStudyRules {
    /// Every rule that fires, as a bit mask (bit r for rule r); for tests and explanations.
    pub fn hits(current: &Txn, history: &[Txn]) -> u64 {
        current_only_hits(current) | history_hits::<true>(current, history)
    }
}

fn first_rule(hits: u64) -> u8 {
    if hits == 0 {
        0
    } else {
        hits.trailing_zeros() as u8
    }
}

/// UTC hour of day.
pub fn hour_of(timestamp_ms: u64) -> u64 {
    (timestamp_ms / HOUR_MS) % 24
}

/// UTC (month, day of month), by the days-to-civil algorithm on the proleptic Gregorian calendar.
pub fn month_day_of(timestamp_ms: u64) -> (u32, u32) {
    let days = (timestamp_ms / DAY_MS) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    (month as u32, day as u32)
}

/// The rules compare field text; a 14-digit card can only equal a 14-digit literal.
fn card_is(card: u64, literal: &str) -> bool {
    Digits {
        value: card,
        len: 14,
    }
    .is(literal)
}

fn fixed_width_is(value: u16, width: u8, literal: &str) -> bool {
    Digits {
        value: u64::from(value),
        len: width,
    }
    .is(literal)
}

const fn bit(rule: u32) -> u64 {
    1 << rule
}

/// Rules 1-20: they read only the current transaction.
fn current_only_hits(c: &Txn) -> u64 {
    let amount = c.amount.value;
    let merchant = c.merchant;
    let country = c.country;
    let code = c.code;
    let hour = hour_of(c.timestamp_ms());
    let night = (1..=3).contains(&hour);
    let (month, day) = month_day_of(c.timestamp_ms());
    let march_25 = month == 3 && day == 25;
    let card_is_100 = card_is(c.card, "00004000222100");
    let card_is_333 = card_is(c.card, "00004000222333");
    let long_literals =
        card_is(c.card, "000112340000444444") || fixed_width_is(country, 3, "003300030044442211");
    let rules = [
        (1, country == 111 && amount > 200_000 && merchant == 22),
        (2, country == 121 && c.response != 0),
        (3, merchant == 11 && amount > 1000 && c.currency == 11),
        (4, amount > 100_000 && code.is("1000")),
        (5, amount > 100_000 && card_is_100),
        (6, card_is(c.card, "000112340000444422") && merchant == 2000),
        (7, (merchant == 1 || merchant == 2222) && country == 221),
        (8, code.is("3333") && amount > 10_000 && merchant == 2222),
        (9, night && amount >= 10_000),
        (10, night && merchant == 101 && amount >= 10_000),
        (
            11,
            (country == 221 || country == 444) && (merchant == 1 || merchant == 2222),
        ),
        (12, card_is_333 && amount > 50_000),
        (13, long_literals && merchant == 2200),
        (14, long_literals && !code.is("2222")),
        (15, night && merchant == 2222 && amount >= 10_000),
        (16, night && code.is("2222") && amount >= 10_000),
        (17, march_25 && code.is("2222") && amount >= 10_000),
        (18, march_25 && merchant == 2222 && amount >= 10_000),
        (19, code.is("3344") && amount >= 1_000_000),
        (20, code.is("1001") && amount >= 500_000),
    ];
    rules
        .iter()
        .filter(|(_, fires)| *fires)
        .fold(0, |hits, (rule, _)| hits | bit(*rule))
}

/// Count and sum of amounts of the entries a window admits.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    count: u64,
    sum: u64,
}

impl Tally {
    fn add(&mut self, amount: u64) {
        self.count += 1;
        self.sum += amount;
    }

    /// Rules 36-40: the current amount above the integer average, or the sum above a limit.
    fn above_average_or_sum(self, amount: u64, sum_limit: u64) -> bool {
        self.count > 0 && (amount > self.sum / self.count || self.sum > sum_limit)
    }

    /// Rules 24, 29, 34.
    fn busy_and_large(self) -> bool {
        self.count > 10 && self.sum >= 10_000_000
    }
}

/// True if `ts` lies in a window of `width_ms` reaching back from `t` (i.e. `ts > t - width_ms`),
/// without underflow.
fn within(ts: u64, t: u64, width_ms: u64) -> bool {
    ts.saturating_add(width_ms) > t
}

/// Rules 21 to 36.
const EARLY_RULES: u64 = ((1 << 37) - 1) & !((1 << 21) - 1);

/// Rules 21-49 (`ALL`) or 21-36 only, from one pass over the history.
fn history_hits<const ALL: bool>(c: &Txn, history: &[Txn]) -> u64 {
    let t = c.timestamp_ms();
    let amount = c.amount.value;
    let mut fixed_1h = Tally::default();
    let mut fixed_2h = Tally::default();
    let mut fixed_3h = Tally::default();
    let mut fixed_5h = Tally::default();
    let mut fixed_60d = Tally::default();
    let mut fixed_70d = Tally::default();
    let mut sliding_8h = Tally::default();
    let mut sliding_1d = Tally::default();
    let mut sliding_10d = Tally::default();
    let mut sliding_12d = Tally::default();
    let mut sliding_13d = Tally::default();
    let mut sliding_14d = Tally::default();
    let mut sliding_70d = Tally::default();
    let mut sliding_90d = Tally::default();
    // Amount sums of entries with code 3333 at merchant 2222 (rules 27, 32).
    let mut special_1d = 0u64;
    let mut special_11d = 0u64;
    // Entries at merchant 0022 (rule 45), and those with code 0001 too (rules 48, 49).
    let mut merchant_22_1d = 0u64;
    let mut merchant_22_code_1_1d = 0u64;
    let mut merchant_22_code_1_sum_10d = 0u64;
    let mut big_from_001_10d = false;
    let mut big_not_from_001_10d = false;
    let mut night_count = 0u64;
    let mut rule_46 = false;
    let mut cutoff_47 = i128::from(t);
    let mut sum_47 = 0u64;
    // H' for rules 43 and 44: C sits before the first entry whose timestamp is not greater than T.
    let mut current_index: Option<u64> = None;
    let mut low_country_44 = c.country < 2;

    for (index, h) in history.iter().enumerate() {
        let ts = h.timestamp_ms();
        let a = h.amount.value;
        let i = index as u64 + 1;
        if within(ts, t, HOUR_MS) {
            fixed_1h.add(a);
        }
        if within(ts, t, 2 * HOUR_MS) {
            fixed_2h.add(a);
        }
        if within(ts, t, 3 * HOUR_MS) {
            fixed_3h.add(a);
        }
        if within(ts, t, 5 * HOUR_MS) {
            fixed_5h.add(a);
        }
        if within(ts, t, 60 * DAY_MS) {
            fixed_60d.add(a);
        }
        if ALL && within(ts, t, 70 * DAY_MS) {
            fixed_70d.add(a);
        }
        let special = h.code.is("3333") && h.merchant == 2222;
        let merchant_22 = h.merchant == 22;
        let merchant_22_code_1 = merchant_22 && h.code.is("0001");
        if within(ts, t, i * 8 * HOUR_MS) {
            sliding_8h.add(a);
        }
        if within(ts, t, i * DAY_MS) {
            sliding_1d.add(a);
            special_1d += if special { a } else { 0 };
            if ALL {
                merchant_22_1d += u64::from(merchant_22);
                merchant_22_code_1_1d += u64::from(merchant_22_code_1);
            }
        }
        if within(ts, t, i * 10 * DAY_MS) {
            sliding_10d.add(a);
            if ALL {
                merchant_22_code_1_sum_10d += if merchant_22_code_1 { a } else { 0 };
                big_from_001_10d |= h.country == 1 && a > 10_000;
                big_not_from_001_10d |= h.country != 1 && a > 10_000;
            }
        }
        if special && within(ts, t, i * 11 * DAY_MS) {
            special_11d += a;
        }
        if within(ts, t, i * 12 * DAY_MS) {
            sliding_12d.add(a);
        }
        if within(ts, t, i * 13 * DAY_MS) {
            sliding_13d.add(a);
        }
        if within(ts, t, i * 14 * DAY_MS) {
            sliding_14d.add(a);
        }
        if !ALL {
            continue;
        }
        if within(ts, t, i * 70 * DAY_MS) {
            sliding_70d.add(a);
        }
        if within(ts, t, i * 90 * DAY_MS) {
            sliding_90d.add(a);
        }
        if (1..=3).contains(&hour_of(ts)) {
            night_count += 1;
        }
        rule_46 |= night_count > 50 && h.code.value > 5;
        cutoff_47 -= i128::from(80 * DAY_MS);
        if i128::from(ts) > cutoff_47 && (h.country == 200 || h.country == 201) {
            cutoff_47 += i128::from(80 * DAY_MS + HOUR_MS);
            if i128::from(ts) > cutoff_47 {
                sum_47 += a;
            }
        }
        if current_index.is_none() && ts <= t {
            current_index = Some(index as u64);
        }
        // Position of h in H': one further back once C has been placed before it.
        let position = if current_index.is_some() { i + 1 } else { i };
        low_country_44 |= h.country < 2 && within(ts, t, position * 10 * HOUR_MS);
    }
    let current_index = current_index.unwrap_or(history.len() as u64);
    // The second entry of H' (rule 43).
    let second_amount = match current_index {
        0 => history.first().map(|h| h.amount.value),
        1 => Some(amount),
        _ => Some(history[1].amount.value),
    };

    let merchant = c.merchant;
    let card_is_333 = card_is(c.card, "00004000222333");
    let code_3344 = c.code.is("3344");
    let rule_25_family = |s: Tally| {
        let s1 = if merchant == 11 && c.currency == 11 {
            s.sum
        } else {
            0
        };
        let s2 = if merchant == 11 && c.currency == 22 {
            s.sum
        } else {
            0
        };
        s1 > 10_000 || s2 > 20_000
    };
    let rules = [
        (21, card_is_333 && fixed_1h.sum > 500_000),
        (
            22,
            c.code.is("3333") && merchant == 2222 && fixed_5h.sum > 1_000_000,
        ),
        (23, fixed_2h.count > 100),
        (24, code_3344 && fixed_3h.busy_and_large()),
        (25, rule_25_family(sliding_8h)),
        (26, card_is_333 && sliding_1d.sum >= 500_000),
        (27, special_1d >= 1_000_000),
        (28, sliding_1d.count >= 300),
        (29, code_3344 && sliding_1d.busy_and_large()),
        (30, rule_25_family(sliding_1d)),
        (31, card_is_333 && sliding_10d.sum > 500_000),
        (32, special_11d > 500_000),
        (33, sliding_12d.count >= 400),
        (34, code_3344 && sliding_13d.busy_and_large()),
        (35, rule_25_family(sliding_14d)),
        (36, fixed_60d.above_average_or_sum(amount, 20_000)),
        (37, fixed_70d.above_average_or_sum(amount, 100_000)),
        (38, sliding_70d.above_average_or_sum(amount, 200_000)),
        (39, sliding_90d.above_average_or_sum(amount, 330_000)),
        (40, sliding_90d.above_average_or_sum(amount, 1_110_000)),
        (41, big_from_001_10d && c.country == 2 && amount > 1000),
        (42, big_not_from_001_10d && c.country == 2 && amount > 1000),
        (
            43,
            second_amount.is_some_and(|a| a <= 100) && amount >= 10_000,
        ),
        (44, low_country_44 && amount > 10_000),
        (45, merchant_22_1d > 10 && amount > 1000 && merchant == 33),
        (46, rule_46 && amount > 20_000),
        (47, sum_47 > 10_000 && c.country == 122),
        (
            48,
            merchant_22_code_1_1d > 10 && merchant == 33 && amount > 1000,
        ),
        (
            49,
            merchant_22_code_1_sum_10d > 10_000 && merchant == 33 && amount > 10_000,
        ),
    ];
    let hits = rules
        .iter()
        .filter(|(_, fires)| *fires)
        .fold(0, |hits, (rule, _)| hits | bit(*rule));
    if ALL { hits } else { hits & EARLY_RULES }
}

#[cfg(test)]
mod tests;
