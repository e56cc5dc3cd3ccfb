//! Every route of every app, for the tests that walk them all (`access.rs`, `openapi.rs`).

/// What a route needs of a key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Need {
    Read,
    Write,
    Admin,
}
use Need::{Admin, Read, Write};

/// Every route of every app: (method, a path that matches it, its app, what it needs). A new route
/// belongs here; the server refuses it to keys without a role for it whether or not it is listed.
pub const ENDPOINTS: &[(&str, &str, &str, Need)] = &[
    ("POST", "/tally/accounts/a/entries", "tally", Write),
    ("POST", "/tally/transfers", "tally", Write),
    ("GET", "/tally/accounts/a", "tally", Read),
    ("GET", "/tally/totals", "tally", Read),
    ("POST", "/fraud/transactions", "fraud", Write),
    ("GET", "/fraud/cards/4111111111111111", "fraud", Read),
    ("GET", "/fraud/stats", "fraud", Read),
    ("POST", "/fraud/history/generate", "fraud", Admin),
    ("GET", "/leaderboards", "leaderboard", Read),
    ("POST", "/leaderboards", "leaderboard", Write),
    ("POST", "/leaderboards/scores", "leaderboard", Write),
    ("GET", "/leaderboards/ranks", "leaderboard", Read),
    ("GET", "/leaderboards/b", "leaderboard", Read),
    ("DELETE", "/leaderboards/b", "leaderboard", Write),
    ("POST", "/leaderboards/b/reset", "leaderboard", Write),
    ("GET", "/leaderboards/b/top", "leaderboard", Read),
    ("GET", "/leaderboards/b/members/m", "leaderboard", Read),
    ("PUT", "/leaderboards/b/members/m", "leaderboard", Write),
    ("DELETE", "/leaderboards/b/members/m", "leaderboard", Write),
    (
        "GET",
        "/leaderboards/b/members/m/around",
        "leaderboard",
        Read,
    ),
    ("GET", "/leaderboard", "leaderboard", Read),
    ("POST", "/leaderboard", "leaderboard", Write),
    ("GET", "/leaderboard/b", "leaderboard", Read),
    ("GET", "/leaderboard/b/m", "leaderboard", Read),
    ("PUT", "/leaderboard/b/m", "leaderboard", Write),
    (
        "POST",
        "/skiers/1/seasons/2024/days/1/skiers/5",
        "ski",
        Write,
    ),
    ("GET", "/skiers/1/seasons/2024/days/1/skiers/5", "ski", Read),
    ("GET", "/resorts", "ski", Read),
    ("GET", "/resorts/1/seasons", "ski", Read),
    ("POST", "/resorts/1/seasons", "ski", Write),
    ("GET", "/resorts/1/seasons/2024/day/1/skiers", "ski", Read),
    ("GET", "/skiers/5/vertical", "ski", Read),
    ("GET", "/skiers/1/seasons/2024/days", "ski", Read),
    ("GET", "/skiers/1/seasons/2024/days/1/lifts", "ski", Read),
    ("GET", "/statistics", "ski", Read),
    ("GET", "/ski/lag", "ski", Read),
    ("POST", "/participants", "ledger", Write),
    ("GET", "/participants", "ledger", Read),
    ("GET", "/participants/x", "ledger", Read),
    ("PUT", "/participants/x/ndc", "ledger", Write),
    ("GET", "/participants/x/entries", "ledger", Read),
    ("POST", "/transfers", "ledger", Write),
    ("POST", "/transfers/batch", "ledger", Write),
    (
        "PUT",
        "/transfers/00000000-0000-4000-8000-000000000999",
        "ledger",
        Write,
    ),
    (
        "GET",
        "/transfers/00000000-0000-4000-8000-000000000999",
        "ledger",
        Read,
    ),
    (
        "PUT",
        "/transfers/00000000-0000-4000-8000-000000000999/error",
        "ledger",
        Write,
    ),
    ("POST", "/v1/payments", "payments", Write),
    ("GET", "/v1/payments", "payments", Read),
    ("GET", "/v1/payments/pay_x", "payments", Read),
    ("POST", "/v1/payments/pay_x/capture", "payments", Write),
    ("POST", "/v1/payments/pay_x/cancel", "payments", Write),
    ("POST", "/v1/payments/pay_x/refunds", "payments", Write),
    ("GET", "/v1/events", "payments", Read),
    ("POST", "/admin/reload", "payments", Admin),
    ("GET", "/admin/reference", "payments", Admin),
    ("POST", "/admin/settlements", "payments", Admin),
    ("POST", "/admin/settlements/b/files", "payments", Admin),
];

pub const APPS: [&str; 6] = ["tally", "fraud", "leaderboard", "ski", "ledger", "payments"];
