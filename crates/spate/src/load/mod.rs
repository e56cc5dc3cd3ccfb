//! `spate load <app> <scenario>`: drives a running server with one of the scenarios below, each app's in
//! a file of its own; this module names them, picks one and runs it.

pub mod args;
pub mod common;
mod fraud;
pub mod leaderboard;
mod ledger;
mod payments;
mod redis;
mod server;
mod ski;
mod tally;

use anyhow::{Context, bail};
use args::LoadArgs;
use common::{host_port, write_outputs};
use fraud::FraudHttp;
use leaderboard::{LeaderboardBulk, LeaderboardUpdates, create_load_board};
use ledger::{LedgerBatch, LedgerReads, LedgerTransfers, create_ledger_participants};
use redis::RedisZincrby;
use server::Health;
use ski::{SkiQueries, SkiRides};
use spate_load::{LoadConfig, Pace, Report, Scenario};
use std::sync::Arc;
use std::time::Duration;
use tally::TallyAdds;

/// Every scenario this binary knows, as `app scenario`.
pub const SCENARIOS: &[(&str, &str, &str)] = &[
    (
        "server",
        "health",
        "GET /health: the trivial endpoint, for checking the tool against wrk or oha",
    ),
    (
        "tally",
        "adds",
        "POST /tally/accounts/{name}/entries over 10,000 accounts, with idempotency keys",
    ),
    (
        "leaderboard",
        "updates",
        "PUT /leaderboards/load/members/{user}: increment a random one of --users users (100,000) and get \
         its new rank; the case study's load test",
    ),
    (
        "leaderboard",
        "bulk",
        "POST /leaderboards/scores with --batch increments of random users per request",
    ),
    (
        "redis",
        "zincrby",
        "the leaderboard workload on Redis at --target redis://host:port: with --batch 1, ZINCRBY then \
         ZREVRANK pipelined in one round trip (the peer of `leaderboard updates`); with --batch N, a \
         pipeline of N ZINCRBY (the peer of `leaderboard bulk`)",
    ),
    (
        "ski",
        "rides",
        "POST /skiers/{resortID}/seasons/2022/days/1/skiers/{skierID} {\"time\",\"liftID\"}: the course \
         client's lift rides (resort 1-10, skier 1 to --users, lift 1-40, time 1-360)",
    ),
    (
        "ski",
        "queries",
        "the seed's four questions and the spec's GETs in turn, for random skiers of --users (a 404, no \
         rides for that skier, is an answer)",
    ),
    (
        "ledger",
        "transfers",
        "the Mojaloop PoC's simulator: POST /transfers (prepare) then PUT /transfers/{id} (fulfil, as the \
         payee) for random pairs of --participants FSPs; two requests per financial transfer",
    ),
    (
        "ledger",
        "batch",
        "POST /transfers/batch: --batch prepares, then the next request fulfils the same --batch transfers",
    ),
    (
        "ledger",
        "reads",
        "GET /transfers/{id} of random transfers an earlier `ledger batch` run with the same --seed and \
         --participants wrote: --written-by of its connections, the first --users transfers of each",
    ),
    (
        "payments",
        "authorize",
        "POST /v1/payments: authorizations with idempotency keys, cards drawn from --cards, merchants and \
         tax lines in turn (a decline, 402, is an answer)",
    ),
    (
        "payments",
        "authorize-capture",
        "as authorize, with capture_method automatic: each authorization also spools a capture",
    ),
    (
        "payments",
        "mix",
        "70% authorizations, 20% one-cent captures and 10% one-cent refunds of --participants payments \
         prepared first (authorized, half captured and settled)",
    ),
    (
        "fraud",
        "http",
        "POST /fraud/transactions, batches of --batch generated transactions",
    ),
    (
        "fraud",
        "stream",
        "generator -> acknowledged stream at --stream: --requests records (default 10M) in batches of \
         --batch, --connections unacknowledged batches",
    ),
];

fn scenario(args: &LoadArgs) -> anyhow::Result<Arc<dyn Scenario>> {
    Ok(match (args.app.as_str(), args.scenario.as_str()) {
        ("server", "health") => Arc::new(Health),
        ("tally", "adds") => Arc::new(TallyAdds { seed: args.seed }),
        ("leaderboard", scenario @ ("updates" | "bulk")) => {
            if args.users == 0 {
                bail!("--users must be at least 1");
            }
            create_load_board(&args.target)?;
            if scenario == "updates" {
                Arc::new(LeaderboardUpdates {
                    seed: args.seed,
                    users: args.users,
                })
            } else {
                if args.batch == 0 || args.batch > spate_leaderboard::UPDATES_PER_REQUEST_MAX {
                    bail!(
                        "--batch must be 1..={}",
                        spate_leaderboard::UPDATES_PER_REQUEST_MAX
                    );
                }
                Arc::new(LeaderboardBulk {
                    seed: args.seed,
                    users: args.users,
                    batch: args.batch,
                })
            }
        }
        ("ski", scenario @ ("rides" | "queries")) => {
            if args.users == 0 || args.users > u64::from(spate_ski::SKIER_ID_MAX) {
                bail!("--users must be 1..={}", spate_ski::SKIER_ID_MAX);
            }
            if scenario == "rides" {
                Arc::new(SkiRides {
                    seed: args.seed,
                    skiers: args.users,
                })
            } else {
                Arc::new(SkiQueries {
                    seed: args.seed,
                    skiers: args.users,
                })
            }
        }
        ("ledger", scenario @ ("transfers" | "batch")) => {
            if args.participants < 2 {
                bail!("--participants must be at least 2");
            }
            create_ledger_participants(&args.target, args.participants)?;
            let transfers = LedgerTransfers {
                seed: args.seed,
                participants: args.participants,
            };
            if scenario == "transfers" {
                Arc::new(transfers)
            } else {
                if args.batch == 0 || args.batch > spate_ledger::BATCH_OPERATIONS_MAX {
                    bail!("--batch must be 1..={}", spate_ledger::BATCH_OPERATIONS_MAX);
                }
                Arc::new(LedgerBatch {
                    transfers,
                    batch: args.batch as u64,
                })
            }
        }
        ("ledger", "reads") => {
            if args.participants < 2 || args.written_by == 0 || args.users == 0 {
                bail!("--participants must be at least 2, --written-by and --users at least 1");
            }
            Arc::new(LedgerReads {
                transfers: LedgerTransfers {
                    seed: args.seed,
                    participants: args.participants,
                },
                writers: args.written_by,
                per_writer: args.users,
            })
        }
        ("payments", scenario @ ("authorize" | "authorize-capture" | "mix")) => {
            let authorize = payments::PaymentsAuthorize {
                seed: args.seed,
                cards: u64::from(args.cards.max(1)),
                capture: scenario == "authorize-capture",
                run: crate::clock::wall_ms(),
            };
            if scenario == "mix" {
                let prepared = payments::prepare_mix(
                    &args.target,
                    args.participants.max(1) as usize,
                    authorize.run,
                )?;
                Arc::new(payments::PaymentsMix {
                    authorize,
                    prepared,
                })
            } else {
                Arc::new(authorize)
            }
        }
        ("redis", "zincrby") => Arc::new(RedisZincrby {
            seed: args.seed,
            users: args.users.max(1),
        }),
        ("fraud", "http") => {
            if args.batch == 0 || args.batch > spate_fraud::TXNS_PER_REQUEST_MAX {
                bail!("--batch must be 1..={}", spate_fraud::TXNS_PER_REQUEST_MAX);
            }
            Arc::new(FraudHttp {
                seed: args.seed,
                cards: args.cards,
                batch: args.batch,
                start_ms: crate::clock::wall_ms(),
            })
        }
        (app, name) => {
            let known: Vec<String> = SCENARIOS
                .iter()
                .map(|(a, s, _)| format!("{a} {s}"))
                .collect();
            bail!(
                "unknown scenario {app:?} {name:?}; known: {}",
                known.join(", ")
            )
        }
    })
}

/// Runs an HTTP scenario and returns its report (printed and written by the caller).
pub fn load_http(args: &LoadArgs) -> anyhow::Result<Report> {
    let config = LoadConfig {
        target: host_port(&args.target)?,
        connections: args.connections.max(1),
        pace: match args.rate {
            Some(rate) if rate > 0.0 => Pace::Open { rate_per_s: rate },
            Some(_) => bail!("--rate must be positive"),
            None => Pace::Closed,
        },
        duration: args
            .requests
            .is_none()
            .then(|| Duration::from_secs_f64(args.duration_s.max(0.1))),
        requests: args.requests,
        warmup: Duration::from_secs_f64(args.warmup_s.max(0.0)),
        timeout: Duration::from_secs_f64(args.timeout_s.max(0.001)),
        progress: true,
    };
    let scenario = scenario(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    Ok(runtime.block_on(spate_load::run(config, scenario)))
}

pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    if (args.app.as_str(), args.scenario.as_str()) == ("fraud", "stream") {
        return fraud::push_generated(&args);
    }
    let report = load_http(&args)?;
    print!("{}", report.table());
    if let Some(out) = &args.out {
        write_outputs(&report, out, &format!("{}-{}", args.app, args.scenario))?;
    }
    if report.error_share > args.max_error_share {
        bail!(
            "{:.3}% of requests failed, above --max-error-share {:.3}%",
            report.error_share * 100.0,
            args.max_error_share * 100.0
        );
    }
    Ok(())
}
