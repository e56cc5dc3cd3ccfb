//! The built-in rules, checked two ways: a firing and a non-firing hand-made case for every rule, and a
//! property test against a literal transcription of `specs/fraud.md` §4 (one scan per rule, 128-bit
//! arithmetic, H' built explicitly).

use super::*;
use crate::DAY_MS;
use proptest::prelude::*;

/// 2024-10-04 12:00:00 UTC: not night, not March 25.
const T: u64 = 20_000 * DAY_MS + 12 * HOUR_MS;
const MARCH_25_2026_MS: u64 = 1_774_396_800_000;

fn digits(text: &str) -> Digits {
    Digits {
        value: text.parse().unwrap(),
        len: text.len() as u8,
    }
}

fn current(t: u64) -> Txn {
    Txn {
        card: 1,
        timestamp: Digits::of(t),
        country: 5,
        response: 0,
        amount: Digits::of(500),
        currency: 5,
        merchant: 400,
        city: 1,
        code: digits("00007"),
    }
}

fn with(mut txn: Txn, change: impl FnOnce(&mut Txn)) -> Txn {
    change(&mut txn);
    txn
}

/// A history entry `age_ms` before T (negative ages are after T).
fn aged(age_ms: i64, change: impl FnOnce(&mut Txn)) -> Txn {
    with(current((T as i64 - age_ms) as u64), change)
}

fn amount(value: u64) -> Digits {
    Digits::of(value)
}

fn fires(rule: u32, c: &Txn, history: &[Txn]) -> bool {
    let hits = CaseStudyRules::hits(c, history);
    assert_eq!(
        hits,
        reference_hits(c, history),
        "fast and reference rules disagree"
    );
    hits & (1 << rule) != 0
}

fn check(rule: u32, firing: (Txn, Vec<Txn>), quiet: (Txn, Vec<Txn>)) {
    assert!(fires(rule, &firing.0, &firing.1), "rule {rule} should fire");
    assert!(
        !fires(rule, &quiet.0, &quiet.1),
        "rule {rule} should not fire"
    );
}

fn at_hour(hour: u64) -> Txn {
    current(20_000 * DAY_MS + hour * HOUR_MS)
}

const H: i64 = HOUR_MS as i64;
const D: i64 = DAY_MS as i64;

fn many(n: usize, entry: Txn) -> Vec<Txn> {
    vec![entry; n]
}

#[test]
fn rules_1_to_20_read_only_the_current_transaction() {
    let c = current(T);
    check(
        1,
        (
            with(c, |t| {
                t.country = 111;
                t.amount = amount(200_001);
                t.merchant = 22
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.country = 111;
                t.amount = amount(200_000);
                t.merchant = 22
            }),
            vec![],
        ),
    );
    check(
        2,
        (
            with(c, |t| {
                t.country = 121;
                t.response = 5
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.country = 121;
                t.response = 0
            }),
            vec![],
        ),
    );
    check(
        3,
        (
            with(c, |t| {
                t.merchant = 11;
                t.amount = amount(1001);
                t.currency = 11
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.merchant = 11;
                t.amount = amount(1001);
                t.currency = 12
            }),
            vec![],
        ),
    );
    check(
        4,
        (
            with(c, |t| {
                t.amount = amount(100_001);
                t.code = digits("1000")
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.amount = amount(100_001);
                t.code = digits("01000")
            }),
            vec![],
        ),
    );
    check(
        5,
        (
            with(c, |t| {
                t.amount = amount(100_001);
                t.card = 4_000_222_100
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.amount = amount(100_001);
                t.card = 4_000_222_101
            }),
            vec![],
        ),
    );
    // Rules 6, 13 and 14 compare with 18-digit literals, which no 14-digit card or 3-digit country equals;
    // not even the literal's last 14 digits do.
    for (rule, merchant) in [(6, 2000), (13, 2200), (14, 1)] {
        let c = with(c, |t| {
            t.card = 12_340_000_444_422;
            t.merchant = merchant
        });
        assert!(!fires(rule, &c, &[]));
        let c = with(c, |t| t.card = 12_340_000_444_444);
        assert!(!fires(rule, &c, &[]));
    }
    check(
        7,
        (
            with(c, |t| {
                t.merchant = 2222;
                t.country = 221
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.merchant = 2222;
                t.country = 222
            }),
            vec![],
        ),
    );
    check(
        8,
        (
            with(c, |t| {
                t.code = digits("3333");
                t.amount = amount(10_001);
                t.merchant = 2222
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.code = digits("3333");
                t.amount = amount(10_000);
                t.merchant = 2222
            }),
            vec![],
        ),
    );
    check(
        9,
        (with(at_hour(2), |t| t.amount = amount(10_000)), vec![]),
        (with(at_hour(4), |t| t.amount = amount(10_000)), vec![]),
    );
    assert!(!fires(
        9,
        &with(at_hour(0), |t| t.amount = amount(10_000)),
        &[]
    ));
    check(
        10,
        (
            with(at_hour(1), |t| {
                t.merchant = 101;
                t.amount = amount(10_000)
            }),
            vec![],
        ),
        (
            with(at_hour(1), |t| {
                t.merchant = 102;
                t.amount = amount(10_000)
            }),
            vec![],
        ),
    );
    check(
        11,
        (
            with(c, |t| {
                t.country = 444;
                t.merchant = 1
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.country = 444;
                t.merchant = 2
            }),
            vec![],
        ),
    );
    check(
        12,
        (
            with(c, |t| {
                t.card = 4_000_222_333;
                t.amount = amount(50_001)
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.card = 4_000_222_333;
                t.amount = amount(50_000)
            }),
            vec![],
        ),
    );
    check(
        15,
        (
            with(at_hour(3), |t| {
                t.merchant = 2222;
                t.amount = amount(10_000)
            }),
            vec![],
        ),
        (
            with(at_hour(0), |t| {
                t.merchant = 2222;
                t.amount = amount(10_000)
            }),
            vec![],
        ),
    );
    check(
        16,
        (
            with(at_hour(1), |t| {
                t.code = digits("2222");
                t.amount = amount(10_000)
            }),
            vec![],
        ),
        (
            with(at_hour(1), |t| {
                t.code = digits("02222");
                t.amount = amount(10_000)
            }),
            vec![],
        ),
    );
    let march_25 = current(MARCH_25_2026_MS + 12 * HOUR_MS);
    let march_24 = current(MARCH_25_2026_MS - 1);
    check(
        17,
        (
            with(march_25, |t| {
                t.code = digits("2222");
                t.amount = amount(10_000)
            }),
            vec![],
        ),
        (
            with(march_24, |t| {
                t.code = digits("2222");
                t.amount = amount(10_000)
            }),
            vec![],
        ),
    );
    check(
        18,
        (
            with(march_25, |t| {
                t.merchant = 2222;
                t.amount = amount(10_000)
            }),
            vec![],
        ),
        (
            with(march_25, |t| {
                t.merchant = 2222;
                t.amount = amount(9_999)
            }),
            vec![],
        ),
    );
    check(
        19,
        (
            with(c, |t| {
                t.code = digits("3344");
                t.amount = amount(1_000_000)
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.code = digits("3344");
                t.amount = amount(999_999)
            }),
            vec![],
        ),
    );
    check(
        20,
        (
            with(c, |t| {
                t.code = digits("1001");
                t.amount = amount(500_000)
            }),
            vec![],
        ),
        (
            with(c, |t| {
                t.code = digits("1002");
                t.amount = amount(500_000)
            }),
            vec![],
        ),
    );
}

#[test]
fn rules_21_to_35_count_and_sum_over_fixed_and_sliding_windows() {
    let c = current(T);
    let card_333 = with(c, |t| t.card = 4_000_222_333);
    check(
        21,
        (
            card_333,
            vec![aged(59 * 60_000, |h| h.amount = amount(500_001))],
        ),
        (card_333, vec![aged(H, |h| h.amount = amount(500_001))]),
    );
    let c22 = with(c, |t| {
        t.code = digits("3333");
        t.merchant = 2222
    });
    check(
        22,
        (c22, vec![aged(5 * H - 1, |h| h.amount = amount(1_000_001))]),
        (c22, vec![aged(5 * H, |h| h.amount = amount(1_000_001))]),
    );
    check(
        23,
        (c, many(101, aged(2 * H - 1, |_| {}))),
        (c, many(100, aged(H, |_| {}))),
    );
    let c3344 = with(c, |t| t.code = digits("3344"));
    let million = |age| aged(age, |h| h.amount = amount(1_000_000));
    check(
        24,
        (c3344, many(11, million(3 * H - 1))),
        (c3344, many(10, million(H))),
    );
    // Sliding: the second entry counts within 2 x 8 h.
    let c25 = with(c, |t| {
        t.merchant = 11;
        t.currency = 11;
        t.amount = amount(1000)
    });
    let pair = |second_age| {
        vec![
            aged(H, |h| h.amount = amount(5000)),
            aged(second_age, |h| h.amount = amount(5001)),
        ]
    };
    check(25, (c25, pair(16 * H - 1)), (c25, pair(16 * H)));
    let c25_022 = with(c25, |t| t.currency = 22);
    check(
        25,
        (c25_022, vec![aged(H, |h| h.amount = amount(20_001))]),
        (c25_022, vec![aged(H, |h| h.amount = amount(20_000))]),
    );
    let quarter = |age| aged(age, |h| h.amount = amount(250_000));
    check(
        26,
        (card_333, vec![quarter(20 * H), quarter(48 * H - 1)]),
        (card_333, vec![quarter(20 * H), quarter(48 * H)]),
    );
    let special = |merchant| {
        aged(23 * H, move |h| {
            h.code = digits("3333");
            h.merchant = merchant;
            h.amount = amount(1_000_000)
        })
    };
    check(27, (c, vec![special(2222)]), (c, vec![special(2221)]));
    check(
        28,
        (c, many(300, aged(H, |_| {}))),
        (c, many(299, aged(H, |_| {}))),
    );
    check(
        29,
        (c3344, many(11, million(4 * H))),
        (c3344, many(10, million(4 * H))),
    );
    let c30 = with(c, |t| {
        t.merchant = 11;
        t.currency = 22
    });
    check(
        30,
        (c30, vec![aged(20 * H, |h| h.amount = amount(20_001))]),
        (c30, vec![aged(20 * H, |h| h.amount = amount(20_000))]),
    );
    check(
        31,
        (
            card_333,
            vec![aged(10 * D - 1, |h| h.amount = amount(500_001))],
        ),
        (card_333, vec![aged(10 * D, |h| h.amount = amount(500_001))]),
    );
    let special_11 = |value| {
        aged(10 * D, move |h| {
            h.code = digits("3333");
            h.merchant = 2222;
            h.amount = amount(value)
        })
    };
    check(
        32,
        (c, vec![special_11(500_001)]),
        (c, vec![special_11(500_000)]),
    );
    check(
        33,
        (c, many(400, aged(H, |_| {}))),
        (c, many(399, aged(H, |_| {}))),
    );
    check(
        34,
        (c3344, many(11, million(12 * D))),
        (c3344, many(10, million(12 * D))),
    );
    check(
        35,
        (c25, vec![aged(14 * D - 1, |h| h.amount = amount(10_001))]),
        (c25, vec![aged(14 * D, |h| h.amount = amount(10_001))]),
    );
}

#[test]
fn rules_36_to_40_compare_with_the_integer_average() {
    let c = current(T);
    let spend = |value| with(c, |t| t.amount = amount(value));
    // Average of 100 and 101 is 100 (integer division): 101 is above it, 100 is not.
    let two = |age| {
        vec![
            aged(age, |h| h.amount = amount(100)),
            aged(age, |h| h.amount = amount(101)),
        ]
    };
    check(36, (spend(101), two(59 * D)), (spend(100), two(59 * D)));
    check(
        36,
        (spend(0), vec![aged(D, |h| h.amount = amount(20_001))]),
        (spend(0), vec![aged(D, |h| h.amount = amount(20_000))]),
    );
    check(37, (spend(101), two(65 * D)), (spend(101), two(70 * D)));
    check(38, (spend(101), two(69 * D)), (spend(101), two(71 * D)));
    check(39, (spend(101), two(80 * D)), (spend(100), two(80 * D)));
    check(
        40,
        (
            spend(0),
            vec![aged(80 * D, |h| h.amount = amount(1_110_001))],
        ),
        (
            spend(0),
            vec![aged(80 * D, |h| h.amount = amount(1_110_000))],
        ),
    );
    assert!(!fires(36, &spend(1_000_000), &[]), "no history, no average");
}

#[test]
fn rules_41_to_49_look_for_patterns_in_the_history() {
    let c = current(T);
    let c41 = with(c, |t| {
        t.country = 2;
        t.amount = amount(1001)
    });
    let big = |age, country| {
        aged(age, move |h| {
            h.country = country;
            h.amount = amount(10_001)
        })
    };
    check(
        41,
        (c41, vec![big(10 * D - 1, 1)]),
        (c41, vec![big(10 * D, 1)]),
    );
    check(42, (c41, vec![big(D, 5)]), (c41, vec![big(D, 1)]));

    // Rule 43 sees C in the list: with a later entry first, C is the second entry of H'.
    let c43 = with(c, |t| t.amount = amount(10_000));
    let small = aged(H, |h| h.amount = amount(100));
    check(
        43,
        (c43, vec![small]),
        (c43, vec![aged(H, |h| h.amount = amount(101))]),
    );
    let later = aged(-H, |h| h.amount = amount(5000));
    assert!(
        !fires(43, &c43, &[later, small]),
        "C, not the small entry, is second in H'"
    );
    assert!(!fires(43, &c43, &[]));

    let c44 = with(c, |t| t.amount = amount(10_001));
    let from = |age, country| aged(age, move |h| h.country = country);
    // C comes first in H', so an older entry is at least second: its window is 2 x 10 h.
    check(
        44,
        (c44, vec![from(20 * H - 1, 1)]),
        (c44, vec![from(20 * H, 1)]),
    );
    check(44, (with(c44, |t| t.country = 0), vec![]), (c44, vec![]));
    // C is always ahead of older entries in H': alone, the country-001 entry is second (window 20 h);
    // behind a later entry it is third (window 30 h).
    check(
        44,
        (c44, vec![from(-H, 5), from(25 * H, 1)]),
        (c44, vec![from(25 * H, 1)]),
    );

    let c45 = with(c, |t| {
        t.merchant = 33;
        t.amount = amount(1001)
    });
    let at_22 = |code: &'static str| {
        aged(H, move |h| {
            h.merchant = 22;
            h.code = digits(code)
        })
    };
    check(
        45,
        (c45, many(11, at_22("00007"))),
        (c45, many(10, at_22("00007"))),
    );

    let c46 = with(c, |t| t.amount = amount(20_001));
    let night = |code: &'static str| aged(10 * H, move |h| h.code = digits(code));
    check(
        46,
        (c46, many(51, night("00006"))),
        (c46, many(50, night("00006"))),
    );
    assert!(!fires(46, &c46, &many(60, night("00005"))));

    let c47 = with(c, |t| t.country = 122);
    let from_200 = |age| {
        aged(age, |h| {
            h.country = 200;
            h.amount = amount(10_001)
        })
    };
    check(47, (c47, vec![from_200(-2 * H)]), (c47, vec![from_200(-H)]));

    check(
        48,
        (c45, many(11, at_22("0001"))),
        (c45, many(11, at_22("00001"))),
    );
    let c49 = with(c45, |t| t.amount = amount(10_001));
    let code_1 = |age| {
        aged(age, |h| {
            h.merchant = 22;
            h.code = digits("0001");
            h.amount = amount(10_001)
        })
    };
    check(
        49,
        (c49, vec![code_1(10 * D - 1)]),
        (c49, vec![code_1(10 * D)]),
    );
}

#[test]
fn the_first_rule_that_fires_is_the_result() {
    let c = with(at_hour(2), |t| t.amount = amount(10_001));
    let history = vec![aged(D, |h| h.amount = amount(1))];
    assert_eq!(
        CaseStudyRules::hits(&c, &history) & ((1 << 9) | (1 << 36)),
        (1 << 9) | (1 << 36)
    );
    assert_eq!(CaseStudyRules.score(&c, &history), 9);
    let quiet = with(current(T), |t| t.amount = amount(1));
    assert_eq!(CaseStudyRules.score(&quiet, &history), 0);
}

#[test]
fn calendar_and_hours_are_utc() {
    assert_eq!(month_day_of(MARCH_25_2026_MS), (3, 25));
    assert_eq!(month_day_of(MARCH_25_2026_MS - 1), (3, 24));
    assert_eq!(
        month_day_of(1_711_333_800_000),
        (3, 25),
        "2024 is a leap year"
    );
    assert_eq!(month_day_of(0), (1, 1));
    assert_eq!(hour_of(1_711_333_800_000), 2);
}

// ---- the reference: a literal transcription of the spec ----

fn fixed(t: u64, width_ms: u64, list: &[Txn]) -> Vec<&Txn> {
    list.iter()
        .filter(|h| i128::from(h.timestamp_ms()) > i128::from(t) - i128::from(width_ms))
        .collect()
}

fn sliding(t: u64, width_ms: u64, list: &[Txn]) -> Vec<&Txn> {
    list.iter()
        .enumerate()
        .filter(|(i, h)| {
            i128::from(h.timestamp_ms()) > i128::from(t) - (*i as i128 + 1) * i128::from(width_ms)
        })
        .map(|(_, h)| h)
        .collect()
}

fn sum(list: &[&Txn]) -> u64 {
    list.iter().map(|h| h.amount.value).sum()
}

fn reference_hits(c: &Txn, history: &[Txn]) -> u64 {
    let t = c.timestamp_ms();
    let a = c.amount.value;
    let hour = hour_of(t);
    let night = (1..=3).contains(&hour);
    let (month, day) = month_day_of(t);
    let card = format!("{:014}", c.card);
    let country = format!("{:03}", c.country);
    let merchant = format!("{:04}", c.merchant);
    let currency = format!("{:03}", c.currency);
    let code = c.code.to_string();
    let response = format!("{:02}", c.response);
    let m = merchant.as_str();
    let h_merchant = |h: &Txn| format!("{:04}", h.merchant);
    let h_country = |h: &Txn| format!("{:03}", h.country);
    let h_code = |h: &Txn| h.code.to_string();
    let busy = |list: Vec<&Txn>| list.len() > 10 && sum(&list) >= 10_000_000;
    let s1s2 = |list: Vec<&Txn>| {
        let s = sum(&list);
        let s1 = if m == "0011" && currency == "011" {
            s
        } else {
            0
        };
        let s2 = if m == "0011" && currency == "022" {
            s
        } else {
            0
        };
        s1 > 10_000 || s2 > 20_000
    };
    let average = |list: Vec<&Txn>, limit: u64| {
        let count = list.len() as u64;
        let s = sum(&list);
        count > 0 && (a > s / count || s > limit)
    };
    let special_sum = |list: Vec<&Txn>| {
        list.iter()
            .filter(|h| h_code(h) == "3333" && h_merchant(h) == "2222")
            .map(|h| h.amount.value)
            .sum::<u64>()
    };
    let mut h_prime: Vec<Txn> = history.to_vec();
    let position = h_prime
        .iter()
        .position(|h| h.timestamp_ms() <= t)
        .unwrap_or(h_prime.len());
    h_prime.insert(position, *c);
    let rule_46 = {
        let mut count = 0;
        history.iter().any(|h| {
            if (1..=3).contains(&hour_of(h.timestamp_ms())) {
                count += 1;
            }
            count > 50 && h.code.value > 5 && a > 20_000
        })
    };
    let rule_47 = {
        let mut cutoff = i128::from(t);
        let mut s = 0u64;
        for h in history {
            cutoff -= i128::from(80 * DAY_MS);
            if i128::from(h.timestamp_ms()) > cutoff
                && (h_country(h) == "200" || h_country(h) == "201")
            {
                cutoff += i128::from(80 * DAY_MS + HOUR_MS);
                if i128::from(h.timestamp_ms()) > cutoff {
                    s += h.amount.value;
                }
            }
        }
        s > 10_000 && country == "122"
    };
    let m22_code_1 = |h: &&&Txn| h_merchant(h) == "0022" && h_code(h) == "0001";
    let rules: [bool; 50] = [
        false,
        country == "111" && a > 200_000 && m == "0022",
        country == "121" && response != "00",
        m == "0011" && a > 1000 && currency == "011",
        a > 100_000 && code == "1000",
        a > 100_000 && card == "00004000222100",
        card == "000112340000444422" && m == "2000",
        (m == "0001" || m == "2222") && country == "221",
        code == "3333" && a > 10_000 && m == "2222",
        night && a >= 10_000,
        night && m == "0101" && a >= 10_000,
        (country == "221" || country == "444") && (m == "0001" || m == "2222"),
        card == "00004000222333" && a > 50_000,
        (card == "000112340000444444" || country == "003300030044442211") && m == "2200",
        (card == "000112340000444444" || country == "003300030044442211") && code != "2222",
        night && m == "2222" && a >= 10_000,
        night && code == "2222" && a >= 10_000,
        month == 3 && day == 25 && code == "2222" && a >= 10_000,
        month == 3 && day == 25 && m == "2222" && a >= 10_000,
        code == "3344" && a >= 1_000_000,
        code == "1001" && a >= 500_000,
        card == "00004000222333" && sum(&fixed(t, HOUR_MS, history)) > 500_000,
        code == "3333" && m == "2222" && sum(&fixed(t, 5 * HOUR_MS, history)) > 1_000_000,
        fixed(t, 2 * HOUR_MS, history).len() > 100,
        code == "3344" && busy(fixed(t, 3 * HOUR_MS, history)),
        s1s2(sliding(t, 8 * HOUR_MS, history)),
        card == "00004000222333" && sum(&sliding(t, DAY_MS, history)) >= 500_000,
        special_sum(sliding(t, DAY_MS, history)) >= 1_000_000,
        sliding(t, DAY_MS, history).len() >= 300,
        code == "3344" && busy(sliding(t, DAY_MS, history)),
        s1s2(sliding(t, DAY_MS, history)),
        card == "00004000222333" && sum(&sliding(t, 10 * DAY_MS, history)) > 500_000,
        special_sum(sliding(t, 11 * DAY_MS, history)) > 500_000,
        sliding(t, 12 * DAY_MS, history).len() >= 400,
        code == "3344" && busy(sliding(t, 13 * DAY_MS, history)),
        s1s2(sliding(t, 14 * DAY_MS, history)),
        average(fixed(t, 60 * DAY_MS, history), 20_000),
        average(fixed(t, 70 * DAY_MS, history), 100_000),
        average(sliding(t, 70 * DAY_MS, history), 200_000),
        average(sliding(t, 90 * DAY_MS, history), 330_000),
        average(sliding(t, 90 * DAY_MS, history), 1_110_000),
        sliding(t, 10 * DAY_MS, history)
            .iter()
            .any(|h| h_country(h) == "001" && h.amount.value > 10_000)
            && country == "002"
            && a > 1000,
        sliding(t, 10 * DAY_MS, history)
            .iter()
            .any(|h| h_country(h) != "001" && h.amount.value > 10_000)
            && country == "002"
            && a > 1000,
        h_prime.len() > 1 && h_prime[1].amount.value <= 100 && a >= 10_000,
        sliding(t, 10 * HOUR_MS, &h_prime)
            .iter()
            .any(|h| h.country < 2)
            && a > 10_000,
        sliding(t, DAY_MS, history)
            .iter()
            .filter(|h| h_merchant(h) == "0022")
            .count()
            > 10
            && a > 1000
            && m == "0033",
        rule_46,
        rule_47,
        sliding(t, DAY_MS, history)
            .iter()
            .filter(m22_code_1)
            .count()
            > 10
            && m == "0033"
            && a > 1000,
        sliding(t, 10 * DAY_MS, history)
            .iter()
            .filter(m22_code_1)
            .map(|h| h.amount.value)
            .sum::<u64>()
            > 10_000
            && m == "0033"
            && a > 10_000,
    ];
    rules
        .iter()
        .enumerate()
        .filter(|(_, fires)| **fires)
        .fold(0, |hits, (rule, _)| hits | (1 << rule))
}

/// A transaction `age` ms before the test's T (timestamp filled in by the test) built from values the rules
/// single out.
fn interesting_txn() -> impl Strategy<Value = (i64, Txn)> {
    let ages = prop::sample::select(vec![
        -3 * H,
        -H - 1,
        0,
        1,
        H - 1,
        H,
        2 * H,
        3 * H,
        5 * H - 1,
        8 * H,
        10 * H,
        16 * H,
        D - 1,
        D,
        2 * D,
        10 * D,
        11 * D,
        13 * D,
        14 * D,
        59 * D,
        60 * D,
        65 * D,
        70 * D,
        71 * D,
        80 * D,
        89 * D,
    ]);
    let countries = prop::sample::select(vec![0u16, 1, 2, 5, 111, 121, 122, 200, 201, 221, 444]);
    let merchants = prop::sample::select(vec![0u16, 1, 11, 22, 33, 101, 2000, 2200, 2222, 400]);
    let codes = prop::sample::select(vec![
        "0001", "00001", "1000", "1001", "2222", "3333", "3344", "00006", "5",
    ]);
    let amounts = prop::sample::select(vec![
        0u64,
        50,
        100,
        101,
        1000,
        1001,
        10_000,
        10_001,
        20_001,
        50_001,
        100_001,
        500_000,
        1_000_000,
        2_147_483_647,
    ]);
    let cards = prop::sample::select(vec![1u64, 4_000_222_100, 4_000_222_333]);
    (
        ages,
        countries,
        merchants,
        codes,
        amounts,
        cards,
        prop::sample::select(vec![11u16, 22, 5]),
        any::<bool>(),
    )
        .prop_map(
            move |(age, country, merchant, code, value, card, currency, declined)| {
                (
                    age,
                    Txn {
                        card,
                        timestamp: Digits::of(0),
                        country,
                        response: if declined { 5 } else { 0 },
                        amount: Digits::of(value),
                        currency,
                        merchant,
                        city: 1,
                        code: digits(code),
                    },
                )
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn single_pass_rules_equal_the_literal_spec(
        hour in 0u64..24,
        on_march_25 in any::<bool>(),
        c in interesting_txn(),
        aged_history in prop::collection::vec(interesting_txn(), 0..40),
    ) {
        let t = if on_march_25 { MARCH_25_2026_MS } else { T - 12 * HOUR_MS } + hour * HOUR_MS;
        let mut c = c.1;
        c.timestamp = Digits::of(t);
        let mut history: Vec<Txn> = aged_history
            .into_iter()
            .map(|(age, h)| with(h, |h| h.timestamp = Digits::of((t as i64 - age) as u64)))
            .collect();
        // H as the store hands it over: within 90 days, newest first (stable for equal timestamps).
        history.retain(|h| h.timestamp_ms() + 90 * DAY_MS > t);
        history.sort_by_key(|h| std::cmp::Reverse(h.timestamp_ms()));
        let hits = CaseStudyRules::hits(&c, &history);
        prop_assert_eq!(hits, reference_hits(&c, &history));
        let expected = if hits == 0 { 0 } else { hits.trailing_zeros() as u8 };
        prop_assert_eq!(CaseStudyRules.score(&c, &history), expected);
    }
}
