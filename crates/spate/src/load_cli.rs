//! `spate load <app> <scenario>`: drives a running server with one of the scenarios below.

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use spate_fraud::generator::{Seeds, TxnGenerator};
use spate_load::{LoadConfig, Pace, Report, Request, Scenario};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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

#[derive(Args, Clone)]
pub struct LoadArgs {
    /// The app (`server`, `tally`, `fraud`, `leaderboard`, or `redis` for the peer)
    pub app: String,
    /// The scenario (see `--list`)
    pub scenario: String,
    /// Server base URL
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub target: String,
    /// The fraud stream's address (fraud stream)
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub stream: String,
    /// Connections (closed loop: each sends when its previous reply arrived)
    #[arg(long, default_value_t = 16)]
    pub connections: u32,
    /// Open loop at this many requests per second in all (latency from each scheduled send time)
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured seconds
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    /// Stop after this many measured requests instead
    #[arg(long)]
    pub requests: Option<u64>,
    /// Unmeasured seconds before measuring
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
    /// A request slower than this counts as a timeout
    #[arg(long, default_value_t = 10.0)]
    pub timeout_s: f64,
    /// Seed of the scenario's data
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Transactions per request (fraud), updates per request (leaderboard bulk, redis)
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Users the leaderboard scenarios, or skiers the ski scenarios, draw from; for ledger reads, the
    /// transfers each writer wrote
    #[arg(long, default_value_t = 100_000)]
    pub users: u64,
    /// ledger reads: connections of the `ledger batch` run that wrote the transfers
    #[arg(long, default_value_t = 4)]
    pub written_by: u32,
    /// FSPs the ledger scenario creates and moves money between
    #[arg(long, default_value_t = 16)]
    pub participants: u32,
    /// Cards the fraud generator draws from
    #[arg(long, default_value_t = 1_000_000)]
    pub cards: u32,
    /// Exit with status 1 when the share of failed requests is above this
    #[arg(long, default_value_t = 0.01)]
    pub max_error_share: f64,
    /// Write `<app>-<scenario>.json` and `.svg` here
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl LoadArgs {
    /// The defaults of `spate load <app> <scenario> --target <target>`, for benchmarks to adjust.
    pub fn new(app: &str, scenario: &str, target: &str) -> Self {
        Self {
            app: app.into(),
            scenario: scenario.into(),
            target: target.into(),
            stream: String::new(),
            connections: 16,
            rate: None,
            duration_s: 10.0,
            requests: None,
            warmup_s: 1.0,
            timeout_s: 10.0,
            seed: 1,
            batch: 1,
            users: 100_000,
            written_by: 4,
            participants: 16,
            cards: 1,
            max_error_share: 0.01,
            out: None,
        }
    }
}

struct Health;

impl Scenario for Health {
    fn name(&self) -> String {
        "server health".into()
    }

    fn request(&self, _worker: u32, _seq: u64) -> Request {
        Request::get("/health")
    }
}

struct TallyAdds {
    seed: u64,
}

const TALLY_ACCOUNTS: u64 = 10_000;

impl Scenario for TallyAdds {
    fn name(&self) -> String {
        "tally adds".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let n = (u64::from(worker) << 40 | seq) ^ self.seed;
        let account = mix64(n) % TALLY_ACCOUNTS;
        let body = serde_json::to_vec(&json!({"amount": 1, "tag": n})).expect("JSON");
        Request::post_json(format!("/tally/accounts/acct-{account}/entries"), body).with_header(
            "idempotency-key",
            format!("load-{}-{worker}-{seq}", self.seed),
        )
    }
}

/// A 64-bit mix (splitmix64's finaliser): spreads keys reproducibly.
pub(crate) fn mix64(mut n: u64) -> u64 {
    n = (n ^ (n >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    n = (n ^ (n >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    n ^ (n >> 31)
}

/// The board the leaderboard scenarios (and the Redis peer's sorted set) update.
pub const LEADERBOARD_BOARD: &str = "load";

/// The `seq`-th update of `worker`: a user and an increment, the same for spate and Redis.
fn leaderboard_update(seed: u64, users: u64, worker: u32, seq: u64) -> (u64, u64) {
    let n = mix64((u64::from(worker) << 40 | seq) ^ seed);
    (n % users, 1 + (n >> 32) % 100)
}

struct LeaderboardUpdates {
    seed: u64,
    users: u64,
}

impl Scenario for LeaderboardUpdates {
    fn name(&self) -> String {
        "leaderboard updates".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (user, amount) = leaderboard_update(self.seed, self.users, worker, seq);
        let body =
            serde_json::to_vec(&json!({"score": amount, "operator": "increment"})).expect("JSON");
        Request::json(
            spate_load::Method::PUT,
            format!("/leaderboards/{LEADERBOARD_BOARD}/members/user-{user}"),
            body,
        )
    }
}

struct LeaderboardBulk {
    seed: u64,
    users: u64,
    batch: usize,
}

impl Scenario for LeaderboardBulk {
    fn name(&self) -> String {
        format!("leaderboard bulk of {}", self.batch)
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        use std::fmt::Write;
        // Written directly: building a JSON value per update would cost the load tool more CPU than the
        // server spends on it, on the same cores.
        let mut body =
            format!("{{\"leaderboards\":[{{\"leaderboardId\":\"{LEADERBOARD_BOARD}\",\"scores\":[");
        for i in 0..self.batch as u64 {
            let (user, amount) =
                leaderboard_update(self.seed, self.users, worker, seq * self.batch as u64 + i);
            let comma = if i == 0 { "" } else { "," };
            write!(
                body,
                "{comma}{{\"memberId\":\"user-{user}\",\"score\":{amount},\"mode\":\"increment\"}}"
            )
            .expect("writing to a String");
        }
        body.push_str("]}]}");
        Request::post_json("/leaderboards/scores", body.into_bytes())
    }
}

struct RedisZincrby {
    seed: u64,
    users: u64,
}

impl Scenario for RedisZincrby {
    fn name(&self) -> String {
        "redis zincrby".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (user, amount) = leaderboard_update(self.seed, self.users, worker, seq);
        let member = format!("user-{user}").into_bytes();
        let key = LEADERBOARD_BOARD.as_bytes().to_vec();
        Request::Redis(vec![
            vec![
                b"ZINCRBY".to_vec(),
                key.clone(),
                amount.to_string().into_bytes(),
                member.clone(),
            ],
            vec![b"ZREVRANK".to_vec(), key, member],
        ])
    }
}

/// Creates the leaderboard scenarios' board unless it exists.
fn create_load_board(target: &str) -> anyhow::Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .post(format!("{}/leaderboards", target.trim_end_matches('/')))
        .send_json(json!({"name": LEADERBOARD_BOARD, "operator": "increment"}))
        .with_context(|| format!("creating board {LEADERBOARD_BOARD:?} at {target}"))?;
    match response.status().as_u16() {
        201 | 409 => Ok(()),
        status => bail!(
            "creating board {LEADERBOARD_BOARD:?} answered {status}: {}",
            response.body_mut().read_to_string()?
        ),
    }
}

/// The `seq`-th ride of `worker`: `(resort, skier, lift, time)`, like the course assignment's client.
fn ski_ride(seed: u64, skiers: u64, worker: u32, seq: u64) -> (u64, u64, u64, u64) {
    let n = mix64((u64::from(worker) << 40 | seq) ^ seed);
    (
        1 + (n >> 20) % 10,
        1 + n % skiers,
        1 + (n >> 28) % 40,
        1 + (n >> 36) % 360,
    )
}

/// The season and day of every generated ride, as in the assignment.
const SKI_SEASON: u32 = 2022;
const SKI_DAY: u32 = 1;

struct SkiRides {
    seed: u64,
    skiers: u64,
}

impl Scenario for SkiRides {
    fn name(&self) -> String {
        "ski rides".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (resort, skier, lift, time) = ski_ride(self.seed, self.skiers, worker, seq);
        Request::post_json(
            format!("/skiers/{resort}/seasons/{SKI_SEASON}/days/{SKI_DAY}/skiers/{skier}"),
            format!("{{\"time\":{time},\"liftID\":{lift}}}").into_bytes(),
        )
    }
}

struct SkiQueries {
    seed: u64,
    skiers: u64,
}

impl Scenario for SkiQueries {
    fn name(&self) -> String {
        "ski queries".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let (resort, skier, _, _) = ski_ride(self.seed, self.skiers, worker, seq);
        let path = match seq % 5 {
            0 => format!("/skiers/{skier}/seasons/{SKI_SEASON}/days"),
            1 => format!("/skiers/{skier}/seasons/{SKI_SEASON}/days/{SKI_DAY}/lifts"),
            2 => format!("/resorts/{resort}/seasons/{SKI_SEASON}/day/{SKI_DAY}/skiers"),
            3 => format!("/skiers/{skier}/vertical?resort={resort}"),
            _ => format!("/skiers/{resort}/seasons/{SKI_SEASON}/days/{SKI_DAY}/skiers/{skier}"),
        };
        Request::get(path).also_ok(&[404])
    }
}

/// Far enough ahead that no transfer of a load run expires.
const LEDGER_EXPIRATION: &str = "2100-01-01T00:00:00.000Z";

struct LedgerTransfers {
    seed: u64,
    participants: u32,
}

impl LedgerTransfers {
    fn fsp(index: u64) -> String {
        format!("loadfsp{index}")
    }
}

impl Scenario for LedgerTransfers {
    fn name(&self) -> String {
        format!("ledger transfers between {} FSPs", self.participants)
    }

    /// Even `seq`: the prepare of transfer `seq / 2` of this worker; odd: its fulfil. A worker's requests
    /// go out in order on one connection, so the fulfil always follows its prepare's answer.
    fn request(&self, worker: u32, seq: u64) -> Request {
        let transfer = self.transfer(worker, seq / 2);
        if seq.is_multiple_of(2) {
            let mut body = String::new();
            transfer.write_prepare(&mut body);
            Request::post_json("/transfers", body.into_bytes())
        } else {
            let body = format!(
                r#"{{"transferState":"COMMITTED","fulfilment":"{}"}}"#,
                transfer.fulfilment
            );
            Request::json(
                spate_load::Method::PUT,
                format!("/transfers/{}", transfer.id),
                body.into_bytes(),
            )
            .with_header("fspiop-source", transfer.payee)
        }
    }
}

/// One generated transfer. Its JSON is written directly: every field is plain ASCII, and building a
/// JSON value per transfer would cost the load generator more CPU than the server spends on it, on the
/// same cores.
struct GeneratedTransfer {
    id: String,
    payer: String,
    payee: String,
    amount: u64,
    condition: String,
    fulfilment: String,
}

impl GeneratedTransfer {
    /// The FSPIOP prepare body.
    fn write_prepare(&self, out: &mut String) {
        use std::fmt::Write;
        write!(
            out,
            r#"{{"transferId":"{}","payerFsp":"{}","payeeFsp":"{}","amount":{{"currency":"USD","amount":"{}"}},"condition":"{}","expiration":"{LEDGER_EXPIRATION}"}}"#,
            self.id, self.payer, self.payee, self.amount, self.condition
        )
        .expect("writing to a String");
    }
}

impl LedgerTransfers {
    /// The `number`-th transfer of `worker`, the same however it is sent.
    fn transfer(&self, worker: u32, number: u64) -> GeneratedTransfer {
        use base64::Engine as _;
        use sha2::Digest as _;
        let n = mix64(((u64::from(worker) << 40) | number) ^ self.seed);
        let count = u64::from(self.participants);
        let payer = n % count;
        let payee = (payer + 1 + (n >> 20) % (count - 1)) % count;
        let id = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            n >> 32,
            (n >> 16) & 0xffff,
            worker & 0xfff,
            (number >> 48) & 0xfff,
            number & 0xffff_ffff_ffff
        );
        let mut fulfilment = [0u8; 32];
        fulfilment[..8].copy_from_slice(&n.to_le_bytes());
        fulfilment[8..16].copy_from_slice(&number.to_le_bytes());
        let encode = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        GeneratedTransfer {
            id,
            payer: Self::fsp(payer),
            payee: Self::fsp(payee),
            amount: 1 + (n >> 40) % 100,
            condition: encode(&sha2::Sha256::digest(fulfilment)),
            fulfilment: encode(&fulfilment),
        }
    }
}

/// GETs of random transfers that a [`LedgerBatch`] run wrote: those of its first `writers` workers,
/// numbers below `per_writer`.
struct LedgerReads {
    transfers: LedgerTransfers,
    writers: u32,
    per_writer: u64,
}

impl Scenario for LedgerReads {
    fn name(&self) -> String {
        format!(
            "ledger reads of {} written transfers",
            u64::from(self.writers) * self.per_writer
        )
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let n = mix64((u64::from(worker) << 40 | seq) ^ !self.transfers.seed);
        let writer = (n % u64::from(self.writers)) as u32;
        let number = (n >> 8) % self.per_writer;
        let transfer = self.transfers.transfer(writer, number);
        Request::get(format!("/transfers/{}", transfer.id))
    }
}

/// Batches of the same transfers: `--batch` prepares in one request, their fulfils in the next.
struct LedgerBatch {
    transfers: LedgerTransfers,
    batch: u64,
}

impl Scenario for LedgerBatch {
    fn name(&self) -> String {
        format!(
            "ledger batches of {} between {} FSPs",
            self.batch, self.transfers.participants
        )
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        use std::fmt::Write;
        let first = seq / 2 * self.batch;
        let mut body = String::from(r#"{"operations":["#);
        for number in first..first + self.batch {
            let t = self.transfers.transfer(worker, number);
            if number > first {
                body.push(',');
            }
            if seq.is_multiple_of(2) {
                body.push_str(r#"{"prepare":"#);
                t.write_prepare(&mut body);
                body.push('}');
            } else {
                write!(
                    body,
                    r#"{{"fulfil":{{"transferId":"{}","source":"{}","fulfilment":"{}"}}}}"#,
                    t.id, t.payee, t.fulfilment
                )
                .expect("writing to a String");
            }
        }
        body.push_str("]}");
        Request::post_json("/transfers/batch", body.into_bytes())
    }
}

/// Creates the ledger scenario's FSPs (with caps no load run reaches) unless they exist.
fn create_ledger_participants(target: &str, count: u32) -> anyhow::Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    for index in 0..u64::from(count) {
        let name = LedgerTransfers::fsp(index);
        let mut response = agent
            .post(format!("{}/participants", target.trim_end_matches('/')))
            .send_json(json!({"name": name, "currency": "USD", "ndc": "1000000000000"}))
            .with_context(|| format!("creating participant {name} at {target}"))?;
        match response.status().as_u16() {
            201 | 409 => {}
            status => bail!(
                "creating participant {name} answered {status}: {}",
                response.body_mut().read_to_string()?
            ),
        }
    }
    Ok(())
}

struct FraudHttp {
    seed: u64,
    cards: u32,
    batch: usize,
    start_ms: u64,
}

impl Scenario for FraudHttp {
    fn name(&self) -> String {
        format!("fraud http (batches of {})", self.batch)
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let derived = mix64(self.seed ^ (u64::from(worker) << 40) ^ seq) as i64;
        let seeds = Seeds {
            card: derived,
            country: derived ^ 1,
            merchant: derived ^ 1,
            city: derived ^ 1,
            amount: derived ^ 2,
            response: derived ^ 3,
            timestamp: 0,
        };
        let mut generator = TxnGenerator::new(&seeds, self.cards);
        let timestamp_ms = self.start_ms + seq;
        let txns: Vec<_> = (0..self.batch)
            .map(|_| {
                let t = generator.next_txn(timestamp_ms);
                json!({
                    "card": format!("{:014}", t.card), "timestamp": t.timestamp.to_string(),
                    "country": format!("{:03}", t.country), "response": format!("{:02}", t.response),
                    "amount": t.amount.to_string(), "currency": format!("{:03}", t.currency),
                    "merchant": format!("{:04}", t.merchant), "city": format!("{:05}", t.city),
                    "code": t.code.to_string(),
                })
            })
            .collect();
        Request::post_json(
            "/fraud/transactions",
            serde_json::to_vec(&txns).expect("JSON"),
        )
    }
}

fn host_port(target: &str) -> anyhow::Result<String> {
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("redis://"))
        .context("--target must start with http:// or redis:// (TLS is not supported)")?;
    Ok(rest.trim_end_matches('/').to_string())
}

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
            let authorize = crate::load_payments::PaymentsAuthorize {
                seed: args.seed,
                cards: u64::from(args.cards.max(1)),
                capture: scenario == "authorize-capture",
                run: crate::clock::wall_ms(),
            };
            if scenario == "mix" {
                let prepared = crate::load_payments::prepare_mix(
                    &args.target,
                    args.participants.max(1) as usize,
                    authorize.run,
                )?;
                Arc::new(crate::load_payments::PaymentsMix {
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

pub fn write_outputs(report: &Report, out: &std::path::Path, stem: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(
        out.join(format!("{stem}.svg")),
        spate_load::write_svg(report),
    )?;
    Ok(())
}

pub fn run(args: LoadArgs) -> anyhow::Result<()> {
    if (args.app.as_str(), args.scenario.as_str()) == ("fraud", "stream") {
        return crate::fraud_cli::push_generated(&args);
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
