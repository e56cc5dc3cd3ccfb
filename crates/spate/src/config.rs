//! `spate serve` options. Each can come from the command line, an environment variable (`SPATE_...`) or
//! a TOML file (`--config`, keys named like the long options with `_`), in that order of precedence.

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use spate_engine::{Durability, EngineConfig, Linger};
use spate_server::{AppModule, ClusterSetup, ServerConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The longest linger accepted: a request waiting longer for its group commit is a misconfiguration.
const LINGER_US_MAX: u64 = 10_000_000;
/// `--kafka-timeout-s` at most: Kafka's default `transaction.max.timeout.ms` (15 min) over two.
const KAFKA_TIMEOUT_S_MAX: u64 = 450;

/// The longest pass interval of a read model accepted: read models a second behind are a
/// misconfiguration (and a stop waits out the interval).
const PROJECTION_PASS_INTERVAL_US_MAX: u64 = 1_000_000;

#[derive(Debug, Clone, Copy, ValueEnum, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    /// fdatasync every group commit before acknowledging it
    Fsync,
    /// no fsync: survives a process crash, not a power loss
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RetentionArg {
    /// release what two snapshots and every projection checkpoint cover
    Snapshots,
    /// keep every record: read models can be rebuilt from the first event (`spate ledger rebuild`)
    All,
}

#[derive(Debug, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// TOML file with any of these options
    #[arg(long, env = "SPATE_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Directory for journals, snapshots and projection checkpoints [default: ./data]
    #[arg(long, env = "SPATE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080]
    #[arg(long, env = "SPATE_LISTEN")]
    listen: Option<SocketAddr>,
    /// API keys and their roles (TOML, made with `spate auth new-key`); required to listen on an
    /// address other than loopback [default: none, anyone who reaches the port may call anything]
    #[arg(long, env = "SPATE_AUTH")]
    auth: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM), with --tls-key [default: plain HTTP]
    #[arg(long, env = "SPATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(long, env = "SPATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Most client connections served at once; more wait to be accepted [default: 4096]
    #[arg(long, env = "SPATE_CONNECTIONS_MAX")]
    connections_max: Option<usize>,
    /// How long a request's line and headers may take, and a connection may idle, in ms [default: 30000]
    #[arg(long, env = "SPATE_HEADER_READ_TIMEOUT_MS")]
    header_read_timeout_ms: Option<u64>,
    /// The longest a request body may stop arriving, in ms [default: 30000]
    #[arg(long, env = "SPATE_BODY_READ_TIMEOUT_MS")]
    body_read_timeout_ms: Option<u64>,
    /// Most bytes of a request's line and headers (at least 8192) [default: 65536]
    #[arg(long, env = "SPATE_HEADER_BYTES_MAX")]
    header_bytes_max: Option<usize>,
    /// Number of partitions; fixed for the life of a data directory [default: one per core]
    #[arg(long, env = "SPATE_PARTITIONS")]
    partitions: Option<u16>,
    /// Comma-separated apps to enable [default: all]
    #[arg(long, env = "SPATE_APPS", value_delimiter = ',')]
    apps: Option<Vec<String>>,
    /// When a command counts as durable [default: fsync]
    #[arg(long, env = "SPATE_DURABILITY")]
    durability: Option<DurabilityArg>,
    /// Which journal records are kept [default: snapshots]
    #[arg(long, env = "SPATE_JOURNAL_RETENTION")]
    journal_retention: Option<RetentionArg>,
    /// Journal segment size in bytes [default: 67108864]
    #[arg(long, env = "SPATE_SEGMENT_BYTES")]
    segment_bytes: Option<u64>,
    /// A partition's group commit waits for more requests until none came for this many microseconds,
    /// then goes once the journal is free; set with --linger-max-us (0: no wait) [default: 0]
    #[arg(long, env = "SPATE_LINGER_QUIET_US")]
    linger_quiet_us: Option<u64>,
    /// ... or until its first request came this many microseconds ago; set with --linger-quiet-us
    /// [default: 0]
    #[arg(long, env = "SPATE_LINGER_MAX_US")]
    linger_max_us: Option<u64>,
    /// Records applied between two snapshots of a partition [default: 1000000]
    #[arg(long, env = "SPATE_SNAPSHOT_INTERVAL_RECORDS")]
    snapshot_interval_records: Option<u64>,
    /// Journal bytes written between two snapshots of a partition at most, whichever comes first with
    /// --snapshot-interval-records; a small state falls due sooner, after four times its last snapshot's
    /// size (at least 64 MiB), so that a restart replays little. The journal is released only behind
    /// snapshots [default: 268435456]
    #[arg(long, env = "SPATE_SNAPSHOT_INTERVAL_BYTES")]
    snapshot_interval_bytes: Option<u64>,
    /// Milliseconds a partition spends applying between two snapshots, whichever comes first with the
    /// two above: a restart after a crash replays what was applied since the newest snapshot, so this
    /// bounds its replay [default: 30000]
    #[arg(long, env = "SPATE_SNAPSHOT_INTERVAL_APPLY_MS")]
    snapshot_interval_apply_ms: Option<u64>,
    /// Bytes one step of a snapshot writes, for apps that snapshot in steps while they apply (all but
    /// ski); a partition applies nothing during a step, and takes a late snapshot's steps for at most 3
    /// ms at a time [default: 65536]
    #[arg(long, env = "SPATE_SNAPSHOT_STEP_BYTES")]
    snapshot_step_bytes: Option<usize>,
    /// Memory for the block cache of the archive on disk, where apps keep what is final (the ledger's
    /// committed and aborted transfers), all partitions together [default: 256]
    #[arg(long, env = "SPATE_ARCHIVE_CACHE_MB")]
    archive_cache_mb: Option<u64>,
    /// Memory (MiB) each partition's keyspace of the archive fills before its writes go to a table on
    /// disk; fixed when the archive is created, like --partitions [default: 64]
    #[arg(long, env = "SPATE_ARCHIVE_MEMTABLE_MB")]
    archive_memtable_mb: Option<u64>,
    /// What the background scrub reads back per second (MiB) from each store on disk (the archive,
    /// payments' list, ski's rides) to find blocks the disk damaged; 0 turns it off [default: 16]
    #[arg(long, env = "SPATE_STORE_SCRUB_MB_PER_S")]
    store_scrub_mb_per_s: Option<u64>,
    /// Free space (MiB) the data directory's file system keeps: below it, new writes are refused with
    /// 503 `disk_full` and reads go on, until space is freed; 0 turns the guard off [default: 128]
    #[arg(long, env = "SPATE_DISK_RESERVE_MB")]
    disk_reserve_mb: Option<u64>,
    /// Records a projection applies between two checkpoints of its read model [default: 1000000]
    #[arg(long, env = "SPATE_PROJECTION_CHECKPOINT_INTERVAL_RECORDS")]
    projection_checkpoint_interval_records: Option<u64>,
    /// Journal bytes of an app's records a projection applies between two checkpoints at most,
    /// whichever comes first with --projection-checkpoint-interval-records; a small read model falls
    /// due sooner, after four times its last checkpoint's size (at least 64 MiB) [default: 268435456]
    #[arg(long, env = "SPATE_PROJECTION_CHECKPOINT_INTERVAL_BYTES")]
    projection_checkpoint_interval_bytes: Option<u64>,
    /// Group commits queued for each projection; one further behind reads the journal instead
    /// [default: 1024]
    #[arg(long, env = "SPATE_PROJECTION_FEED_BATCHES")]
    projection_feed_batches: Option<usize>,
    /// Microseconds between two passes of a read model over its feed at least: the group commits of
    /// that time are applied and written together, for fewer wake-ups below the peak, and the model
    /// lags by up to that much more (the ledger's, which requests wait for, passes at once; 0: every
    /// read model passes at once; at most 1000000) [default: 1000]
    #[arg(long, env = "SPATE_PROJECTION_PASS_INTERVAL_US")]
    projection_pass_interval_us: Option<u64>,
    /// Requests waiting per partition before 503 [default: 16384]
    #[arg(long, env = "SPATE_QUEUE_CAPACITY")]
    queue_capacity: Option<usize>,
    /// How long a command id is remembered for retries, in ms [default: 86400000]
    #[arg(long, env = "SPATE_IDEMPOTENCY_WINDOW_MS")]
    idempotency_window_ms: Option<u64>,
    /// Most command ids remembered per partition [default: 1000000]
    #[arg(long, env = "SPATE_IDEMPOTENCY_ENTRIES_MAX")]
    idempotency_entries_max: Option<usize>,
    /// Most MiB of replies remembered per partition, with 96 bytes per entry besides [default: 64]
    #[arg(long, env = "SPATE_IDEMPOTENCY_MB")]
    idempotency_mb: Option<u64>,
    /// fraud: address of the acknowledged record stream, or "off" [default: 127.0.0.1:8090]
    #[arg(long, env = "SPATE_FRAUD_STREAM_LISTEN")]
    fraud_stream_listen: Option<String>,
    /// fraud: file with the AES-256 key for card data at rest; created if missing
    /// [default: <data-dir>/fraud.key]
    #[arg(long, env = "SPATE_FRAUD_KEY_FILE")]
    fraud_key_file: Option<PathBuf>,
    /// fraud: most transactions kept per card [default: 32]
    #[arg(long, env = "SPATE_FRAUD_ENTRIES_PER_CARD")]
    fraud_entries_per_card: Option<usize>,
    /// payments: the key-encrypting key for card data, outside the data directory; created (with a
    /// warning) if missing [default: $XDG_CONFIG_HOME/spate/payments.kek or ~/.config/spate/payments.kek]
    #[arg(long, env = "SPATE_KEK_FILE")]
    kek_file: Option<PathBuf>,
    /// payments: the keyring, the data keys the KEK wraps; created if missing on a single server. With
    /// --kafka: required, outside the data directory, made once with `spate payments new-keyring` and the
    /// same file on every node [default: <data-dir>/payments/keyring.json]
    #[arg(long, env = "SPATE_PAYMENTS_KEYRING_FILE")]
    payments_keyring_file: Option<PathBuf>,
    /// payments: merchant settings and feature switches (TOML) [default: the built-in copy]
    #[arg(long, env = "SPATE_PAYMENTS_MERCHANTS")]
    payments_merchants: Option<PathBuf>,
    /// payments: tax rates (CSV) [default: the built-in copy]
    #[arg(long, env = "SPATE_PAYMENTS_TAX_RATES")]
    payments_tax_rates: Option<PathBuf>,
    /// payments: where settlement files go [default: <data-dir>/settlements]
    #[arg(long, env = "SPATE_PAYMENTS_SETTLEMENT_DIR")]
    payments_settlement_dir: Option<PathBuf>,
    /// payments: settle every this many seconds inside the server; 0 only on request [default: 0]
    #[arg(long, env = "SPATE_PAYMENTS_SETTLE_EVERY_SECS")]
    payments_settle_every_secs: Option<u64>,
    /// payments: memory (MiB) for the block cache of the read model's list store on disk [default: 16]
    #[arg(long, env = "SPATE_PAYMENTS_STORE_CACHE_MB")]
    payments_store_cache_mb: Option<u64>,
    /// payments: events kept per partition for GET /v1/events [default: 1000000]
    #[arg(long, env = "SPATE_PAYMENTS_FEED_EVENTS")]
    payments_feed_events: Option<usize>,
    /// ledger: open transfers (RECEIVED or RESERVED) held before new prepares are refused (2003, HTTP
    /// 503); each costs about 500 bytes of memory until it is final and archived [default: 10000000]
    #[arg(long, env = "SPATE_LEDGER_OPEN_TRANSFERS_MAX")]
    ledger_open_transfers_max: Option<u64>,
    /// ski: memory (MiB) for the block cache of the read model's ride store on disk [default: 16]
    #[arg(long, env = "SPATE_SKI_STORE_CACHE_MB")]
    ski_store_cache_mb: Option<u64>,
    /// ski: accepted resortIDs, MIN-MAX [default: 1-10]
    #[arg(long, env = "SPATE_SKI_RESORTS")]
    ski_resorts: Option<String>,
    /// ski: accepted seasonIDs, MIN-MAX [default: 1900-2100]
    #[arg(long, env = "SPATE_SKI_SEASONS")]
    ski_seasons: Option<String>,
    /// ski: accepted skierIDs, MIN-MAX [default: 1-100000]
    #[arg(long, env = "SPATE_SKI_SKIERS")]
    ski_skiers: Option<String>,
    /// ski: accepted liftIDs, MIN-MAX [default: 1-40]
    #[arg(long, env = "SPATE_SKI_LIFTS")]
    ski_lifts: Option<String>,
    /// Kafka bootstrap servers (host:port,...): keep the journal on this Kafka cluster instead of the
    /// data directory [default: the embedded journal]
    #[arg(long, env = "SPATE_KAFKA")]
    kafka: Option<String>,
    /// The Kafka journal topic, one partition per engine partition; created if missing
    /// [default: spate-journal]
    #[arg(long, env = "SPATE_KAFKA_TOPIC")]
    kafka_topic: Option<String>,
    /// How long start-up waits for the Kafka cluster, and a group commit for Kafka, in seconds
    /// [default: 30]
    #[arg(long, env = "SPATE_KAFKA_TIMEOUT_S")]
    kafka_timeout_s: Option<u64>,
    /// With --kafka: run as node N of a cluster; the nodes on one topic share its partitions and take
    /// over each other's [default: a single node that applies every partition]
    #[arg(long, env = "SPATE_NODE_ID")]
    node_id: Option<u32>,
    /// With --node-id: the host:port other nodes reach this node's HTTP listener at [default: --listen]
    #[arg(long, env = "SPATE_ADVERTISE")]
    advertise: Option<String>,
    /// With --node-id: a file of at least 32 secret bytes, the same on every node; nodes sign their
    /// requests to each other with it and refuse unsigned ones (`head -c 32 /dev/urandom | base64 > FILE`)
    #[arg(long, env = "SPATE_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// ski: accepted ride times, MIN-MAX [default: 1-360]
    #[arg(long, env = "SPATE_SKI_TIMES")]
    ski_times: Option<String>,
}

/// Options of individual apps, resolved like the engine's.
pub struct AppOptions {
    /// Where apps keep their read models' stores.
    data_dir: PathBuf,
    fraud_stream_listen: Option<SocketAddr>,
    fraud_key_file: PathBuf,
    fraud_entries_per_card: usize,
    ski: spate_ski::SkiConfig,
    ski_store_cache_bytes: u64,
    payments: PaymentsOptions,
    ledger_open_transfers_max: u64,
}

/// The payments app's options; its module is built from them when the app is enabled.
pub struct PaymentsOptions {
    kek_file: Option<PathBuf>,
    keyring_file: PathBuf,
    create_keyring: bool,
    merchants: Option<PathBuf>,
    tax_rates: Option<PathBuf>,
    settlement_dir: PathBuf,
    settle_every_secs: u64,
    feed_events: usize,
    store_cache_bytes: u64,
}

impl PaymentsOptions {
    fn module(&self, data_dir: &Path) -> anyhow::Result<AppModule> {
        let kek_file = match &self.kek_file {
            Some(path) => path.clone(),
            None => spate_payments::keys::default_kek_path().context(
                "payments: no --kek-file, SPATE_KEK_FILE, XDG_CONFIG_HOME or HOME to place the key-encrypting key",
            )?,
        };
        spate_payments::module(spate_payments::PaymentsConfig {
            data_dir: data_dir.to_path_buf(),
            kek_file,
            keyring_file: self.keyring_file.clone(),
            create_keyring: self.create_keyring,
            settlement_dir: self.settlement_dir.clone(),
            reference: spate_payments::reference::ReferenceSources {
                merchants_file: self.merchants.clone(),
                tax_rates_file: self.tax_rates.clone(),
            },
            settle_every: (self.settle_every_secs > 0)
                .then(|| Duration::from_secs(self.settle_every_secs)),
            feed_events_per_partition: self.feed_events.max(1),
            store_cache_bytes: self.store_cache_bytes,
        })
        .map_err(|e| anyhow::anyhow!("payments: {e}"))
    }
}

/// Every app this binary can run, with the kind of party a key may be scoped to in it.
pub fn apps_with_party_kinds() -> Vec<(&'static str, Option<&'static str>)> {
    vec![
        (spate_fraud::APP_NAME, None),
        (spate_leaderboard::APP_NAME, None),
        (
            spate_ledger::APP_NAME,
            spate_ledger::ROUTE_ACCESS.party_kind,
        ),
        (
            spate_payments::APP_NAME,
            spate_payments::ROUTE_ACCESS.party_kind,
        ),
        (spate_ski::APP_NAME, None),
        (spate_tally::APP_NAME, None),
    ]
}

/// Every app this binary can run, by name.
const APPS: &[&str] = &[
    spate_fraud::APP_NAME,
    spate_leaderboard::APP_NAME,
    spate_ledger::APP_NAME,
    spate_payments::APP_NAME,
    spate_ski::APP_NAME,
    spate_tally::APP_NAME,
];

pub fn modules(names: &[String], options: &AppOptions) -> anyhow::Result<Vec<AppModule>> {
    names
        .iter()
        .map(|name| match name.as_str() {
            spate_tally::APP_NAME => Ok(spate_tally::module()),
            spate_leaderboard::APP_NAME => Ok(spate_leaderboard::module()),
            spate_ski::APP_NAME => spate_ski::module(
                options.ski,
                &options.data_dir,
                options.ski_store_cache_bytes,
            )
            .map_err(|e| anyhow::anyhow!("ski: {e}")),
            spate_ledger::APP_NAME => Ok(spate_ledger::module(options.ledger_open_transfers_max)),
            spate_payments::APP_NAME => options.payments.module(&options.data_dir),
            spate_fraud::APP_NAME => {
                let key = spate_fraud::cipher::load_or_create_key(&options.fraud_key_file)
                    .with_context(|| {
                        format!("fraud key file {}", options.fraud_key_file.display())
                    })?;
                let mut config = spate_fraud::FraudConfig::new(key);
                config.stream_listen = options.fraud_stream_listen;
                config.entries_per_card_max = options.fraud_entries_per_card;
                Ok(spate_fraud::module(config))
            }
            other => bail!("unknown app {other:?}; known apps: {}", APPS.join(", ")),
        })
        .collect()
}

macro_rules! merge {
    ($cli:ident, $file:ident, $($field:ident),*) => {
        $( if $cli.$field.is_none() { $cli.$field = $file.$field.take(); } )*
    };
}

impl ServeArgs {
    /// Merges the config file under the command line and environment, and applies the defaults.
    pub fn resolve(mut self) -> anyhow::Result<(ServerConfig, Vec<String>, AppOptions)> {
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut file: ServeArgs =
                toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            merge!(
                self,
                file,
                data_dir,
                listen,
                auth,
                tls_cert,
                tls_key,
                connections_max,
                header_read_timeout_ms,
                body_read_timeout_ms,
                header_bytes_max,
                partitions,
                apps,
                durability,
                journal_retention,
                segment_bytes,
                linger_quiet_us,
                linger_max_us,
                snapshot_interval_records,
                snapshot_interval_bytes,
                snapshot_interval_apply_ms,
                snapshot_step_bytes,
                archive_cache_mb,
                archive_memtable_mb,
                store_scrub_mb_per_s,
                disk_reserve_mb,
                projection_checkpoint_interval_records,
                projection_checkpoint_interval_bytes,
                projection_feed_batches,
                projection_pass_interval_us,
                queue_capacity,
                idempotency_window_ms,
                idempotency_entries_max,
                idempotency_mb,
                fraud_stream_listen,
                fraud_key_file,
                fraud_entries_per_card,
                kek_file,
                payments_keyring_file,
                payments_merchants,
                payments_tax_rates,
                payments_settlement_dir,
                payments_settle_every_secs,
                payments_feed_events,
                payments_store_cache_mb,
                ledger_open_transfers_max,
                ski_resorts,
                ski_seasons,
                ski_skiers,
                ski_lifts,
                ski_times,
                ski_store_cache_mb,
                kafka,
                kafka_topic,
                kafka_timeout_s,
                node_id,
                advertise,
                cluster_secret_file
            );
        }
        let ski = self.ski_config()?;
        let apps = self
            .apps
            .take()
            .unwrap_or_else(|| APPS.iter().map(|s| s.to_string()).collect());
        let data_dir = self.data_dir.unwrap_or_else(|| PathBuf::from("./data"));
        let fraud_stream_listen = match self.fraud_stream_listen.as_deref() {
            None => Some(SocketAddr::from(([127, 0, 0, 1], 8090))),
            Some("off") => None,
            Some(text) => Some(text.parse().with_context(|| {
                format!("--fraud-stream-listen {text:?} is not an address or \"off\"")
            })?),
        };
        let entries_per_card = self
            .fraud_entries_per_card
            .unwrap_or(spate_fraud::history::ENTRIES_PER_CARD_DEFAULT);
        if !(1..=spate_fraud::history::ENTRIES_PER_CARD_MAX).contains(&entries_per_card) {
            bail!(
                "--fraud-entries-per-card must be 1..={}",
                spate_fraud::history::ENTRIES_PER_CARD_MAX
            );
        }
        check_keys_for_kafka(
            &apps,
            self.kafka.is_some(),
            self.fraud_key_file.is_some(),
            self.payments_keyring_file.is_some(),
        )?;
        if self.node_id.is_some() && self.payments_settle_every_secs.unwrap_or(0) > 0 {
            bail!(
                "--payments-settle-every-secs does not go with --node-id: every node would settle at \
                 once; settle on request through one node (`spate payments settle --url NODE`)"
            );
        }
        let app_options = AppOptions {
            data_dir: data_dir.clone(),
            fraud_stream_listen,
            fraud_key_file: self
                .fraud_key_file
                .unwrap_or_else(|| data_dir.join("fraud.key")),
            fraud_entries_per_card: entries_per_card,
            ski,
            ski_store_cache_bytes: megabytes_or(
                self.ski_store_cache_mb,
                spate_ski::model::STORE_CACHE_BYTES_DEFAULT,
            ),
            ledger_open_transfers_max: self
                .ledger_open_transfers_max
                .unwrap_or(spate_ledger::OPEN_TRANSFERS_MAX_DEFAULT),
            payments: PaymentsOptions {
                kek_file: self.kek_file,
                // Nodes on Kafka share one keyring: a node never makes its own.
                create_keyring: self.kafka.is_none(),
                keyring_file: self
                    .payments_keyring_file
                    .unwrap_or_else(|| spate_payments::keys::Keyring::path_in(&data_dir)),
                merchants: self.payments_merchants,
                tax_rates: self.payments_tax_rates,
                settlement_dir: self
                    .payments_settlement_dir
                    .unwrap_or_else(|| data_dir.join("settlements")),
                settle_every_secs: self.payments_settle_every_secs.unwrap_or(0),
                feed_events: self
                    .payments_feed_events
                    .unwrap_or(spate_payments::model::FEED_EVENTS_PER_PARTITION_DEFAULT),
                store_cache_bytes: megabytes_or(
                    self.payments_store_cache_mb,
                    spate_payments::model::STORE_CACHE_BYTES_DEFAULT,
                ),
            },
        };
        let mut engine = EngineConfig::new(data_dir);
        if let Some(partitions) = self.partitions {
            if partitions == 0 {
                bail!("--partitions must be at least 1");
            }
            engine.partitions = partitions;
        }
        engine.journal.durability = match self.durability.unwrap_or(DurabilityArg::Fsync) {
            DurabilityArg::Fsync => Durability::Fsync,
            DurabilityArg::None => Durability::None,
        };
        engine.journal.keep_all = self.journal_retention == Some(RetentionArg::All);
        if let Some(bytes) = self.segment_bytes {
            engine.journal.segment_bytes = bytes;
        }
        for (option, us, time) in [
            (
                "--linger-quiet-us",
                self.linger_quiet_us,
                &mut engine.linger.quiet,
            ),
            (
                "--linger-max-us",
                self.linger_max_us,
                &mut engine.linger.max,
            ),
        ] {
            let us = us.unwrap_or(0);
            if us > LINGER_US_MAX {
                bail!("{option} must be at most {LINGER_US_MAX} (10 s), not {us}");
            }
            *time = Duration::from_micros(us);
        }
        if !engine.linger.is_on() && engine.linger != Linger::default() {
            bail!(
                "--linger-quiet-us and --linger-max-us work together: set both above 0, or neither \
                 (quiet {} µs, max {} µs)",
                engine.linger.quiet.as_micros(),
                engine.linger.max.as_micros()
            );
        }
        if let Some(records) = self.snapshot_interval_records {
            engine.snapshot_interval_records = records.max(1);
        }
        if let Some(bytes) = self.snapshot_interval_bytes {
            engine.snapshot_interval_bytes = bytes.max(1);
        }
        if let Some(ms) = self.snapshot_interval_apply_ms {
            engine.snapshot_interval_apply = Duration::from_millis(ms.max(1));
        }
        if let Some(bytes) = self.snapshot_step_bytes {
            engine.snapshot_step_bytes = bytes.max(1);
        }
        if let Some(mb) = self.archive_cache_mb {
            engine.archive_cache_bytes = mb.saturating_mul(1 << 20);
        }
        if let Some(mb) = self.archive_memtable_mb {
            // Under a MiB, a table would hold a handful of records.
            engine.archive_memtable_bytes = mb.max(1).saturating_mul(1 << 20);
        }
        if let Some(mb) = self.store_scrub_mb_per_s {
            engine.store_scrub_bytes_per_s = mb.saturating_mul(1 << 20);
        }
        if let Some(mb) = self.disk_reserve_mb {
            engine.disk_reserve_bytes = mb.saturating_mul(1 << 20);
        }
        if let Some(records) = self.projection_checkpoint_interval_records {
            engine.projection_checkpoint_interval_records = records.max(1);
        }
        if let Some(bytes) = self.projection_checkpoint_interval_bytes {
            engine.projection_checkpoint_interval_bytes = bytes.max(1);
        }
        if let Some(batches) = self.projection_feed_batches {
            engine.projection_feed_batches_max = batches.max(1);
        }
        if let Some(us) = self.projection_pass_interval_us {
            if us > PROJECTION_PASS_INTERVAL_US_MAX {
                bail!(
                    "--projection-pass-interval-us must be at most {PROJECTION_PASS_INTERVAL_US_MAX} (1 s), not {us}"
                );
            }
            engine.projection_pass_interval = Duration::from_micros(us);
        }
        if let Some(capacity) = self.queue_capacity {
            engine.queue_capacity = capacity.max(1);
        }
        if let Some(window) = self.idempotency_window_ms {
            engine.idempotency_window_ms = window;
        }
        if let Some(entries) = self.idempotency_entries_max {
            engine.idempotency_entries_max = entries.max(1);
        }
        if let Some(mb) = self.idempotency_mb {
            engine.idempotency_bytes_max =
                usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        }
        let listen = self
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
        if !listen.ip().is_loopback() && self.auth.is_none() {
            bail!(
                "--listen {listen} reaches beyond this machine: it needs --auth FILE, the API keys that \
                 may call the server (make one with `spate auth new-key --name NAME --role admin --file FILE`)"
            );
        }
        if let Some(address) = app_options.fraud_stream_listen
            && !address.ip().is_loopback()
        {
            bail!(
                "--fraud-stream-listen {address}: the fraud stream has no API keys, so it listens on \
                 loopback only (or \"off\"); send transactions from other machines over HTTP"
            );
        }
        for (option, value) in [
            ("--header-read-timeout-ms", self.header_read_timeout_ms),
            ("--body-read-timeout-ms", self.body_read_timeout_ms),
        ] {
            // 0 would cut every connection at once.
            anyhow::ensure!(value != Some(0), "{option} must be at least 1");
        }
        let defaults = spate_server::connections::ConnectionLimits::default();
        let connections = spate_server::connections::ConnectionLimits {
            connections_max: self
                .connections_max
                .unwrap_or(defaults.connections_max)
                .max(1),
            header_read_timeout_ms: (self.header_read_timeout_ms)
                .unwrap_or(defaults.header_read_timeout_ms),
            body_read_timeout_ms: (self.body_read_timeout_ms)
                .unwrap_or(defaults.body_read_timeout_ms),
            header_bytes_max: self.header_bytes_max.unwrap_or(defaults.header_bytes_max),
        };
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        if tls.is_some() && self.node_id.is_some() {
            bail!(
                "--tls-cert does not go with --node-id yet: the nodes of a cluster call each other in \
                 plain HTTP (signed, not encrypted); put TLS in front of the nodes instead"
            );
        }
        let (logs, cluster, watch_logs) = match self.kafka {
            None if self.node_id.is_some()
                || self.advertise.is_some()
                || self.cluster_secret_file.is_some() =>
            {
                bail!(
                    "--node-id, --advertise and --cluster-secret-file need --kafka: a cluster shares \
                     its journal on Kafka"
                )
            }
            None => (None, None, None),
            Some(bootstrap) => {
                let mut kafka = spate_kafka::KafkaConfig::new(bootstrap);
                if let Some(topic) = self.kafka_topic {
                    kafka.topic = topic;
                }
                if let Some(seconds) = self.kafka_timeout_s {
                    if seconds == 0 {
                        bail!("--kafka-timeout-s must be at least 1");
                    }
                    // Transactions time out at twice it, and Kafka refuses more than its
                    // transaction.max.timeout.ms (15 min unless set otherwise).
                    if seconds > KAFKA_TIMEOUT_S_MAX {
                        bail!(
                            "--kafka-timeout-s must be at most {KAFKA_TIMEOUT_S_MAX}: a transaction may \
                             last twice it, and Kafka refuses transactions over 15 minutes by default"
                        );
                    }
                    kafka.connect_timeout = Duration::from_secs(seconds);
                    kafka.commit_timeout = Duration::from_secs(seconds);
                }
                // Checked before connecting, which may take --kafka-timeout-s.
                let node = match (self.node_id, &self.cluster_secret_file) {
                    (None, _) if self.advertise.is_some() || self.cluster_secret_file.is_some() => {
                        bail!("--advertise and --cluster-secret-file need --node-id")
                    }
                    (None, _) => None,
                    (Some(_), None) => bail!(
                        "--node-id needs --cluster-secret-file: nodes accept requests from each \
                         other only when signed with a secret they share (create one with \
                         `head -c 32 /dev/urandom | base64 > FILE` and give every node the same file)"
                    ),
                    (Some(node_id), Some(file)) => Some((
                        node_id,
                        spate_server::cluster_auth::ClusterSecret::read(file)
                            .map_err(anyhow::Error::msg)?,
                    )),
                };
                let store = spate_kafka::KafkaLogStore::connect(kafka, engine.partitions)
                    .context("the Kafka cluster given by --kafka")?;
                let cluster = match node {
                    None => None,
                    Some((node_id, secret)) => Some(cluster_setup(
                        &store,
                        node_id,
                        self.advertise,
                        listen,
                        secret,
                    )?),
                };
                let store = Arc::new(store);
                let watch_logs: Option<spate_server::JoinCluster> = match cluster {
                    Some(_) => None,
                    None => {
                        let store = store.clone();
                        Some(Box::new(move |engine| {
                            spate_kafka::watch_sole_owner(&store, engine).map_err(|e| e.to_string())
                        }))
                    }
                };
                (
                    Some(store as Arc<dyn spate_engine::LogStore>),
                    cluster,
                    watch_logs,
                )
            }
        };
        Ok((
            ServerConfig {
                listen,
                auth_file: self.auth,
                tls,
                connections,
                engine,
                logs,
                cluster,
                watch_logs,
            },
            apps,
            app_options,
        ))
    }

    fn ski_config(&self) -> anyhow::Result<spate_ski::SkiConfig> {
        let mut ski = spate_ski::SkiConfig::default();
        for (option, text, bounds) in [
            ("--ski-resorts", &self.ski_resorts, &mut ski.resorts),
            ("--ski-seasons", &self.ski_seasons, &mut ski.seasons),
            ("--ski-skiers", &self.ski_skiers, &mut ski.skiers),
            ("--ski-lifts", &self.ski_lifts, &mut ski.lifts),
            ("--ski-times", &self.ski_times, &mut ski.times),
        ] {
            if let Some(text) = text {
                *bounds =
                    spate_ski::Bounds::parse(text).map_err(|e| anyhow::anyhow!("{option}: {e}"))?;
            }
        }
        ski.check().map_err(anyhow::Error::msg)?;
        Ok(ski)
    }
}

/// `mb` MiB in bytes, or `default_bytes` without it.
fn megabytes_or(mb: Option<u64>, default_bytes: u64) -> u64 {
    mb.map_or(default_bytes, |mb| mb.saturating_mul(1 << 20))
}

/// Joins the cluster of the journal in `store` as node `node_id`, reachable at `advertise` (or the listen address).
fn cluster_setup(
    store: &spate_kafka::KafkaLogStore,
    node_id: u32,
    advertise: Option<String>,
    listen: SocketAddr,
    secret: spate_server::cluster_auth::ClusterSecret,
) -> anyhow::Result<ClusterSetup> {
    let address = match advertise {
        Some(address) => address,
        None if listen.port() == 0 => {
            bail!(
                "--listen with port 0 needs --advertise: other nodes must know where to reach this one"
            )
        }
        None => listen.to_string(),
    };
    let node = spate_kafka::NodeIdentity { node_id, address };
    let membership =
        spate_kafka::KafkaMembership::prepare(store, node).context("joining the cluster")?;
    Ok(ClusterSetup {
        directory: membership.directory(),
        secret,
        join: Box::new(move |engine| {
            membership
                .join(engine)
                .map_err(|e| format!("joining the cluster: {e}"))
        }),
    })
}

/// With the journal on Kafka, card data sealed in it must stay readable when this machine's data directory
/// is lost, and in a cluster by every node: its keys must come from outside the data directory, the same
/// on every node.
fn check_keys_for_kafka(
    apps: &[String],
    kafka: bool,
    fraud_key_file: bool,
    payments_keyring_file: bool,
) -> anyhow::Result<()> {
    let enabled = |app: &str| apps.iter().any(|a| a == app);
    if kafka && enabled(spate_fraud::APP_NAME) && !fraud_key_file {
        bail!(
            "with --kafka, fraud needs --fraud-key-file outside the data directory (and the same file on every \
             node): the journal on Kafka outlives this machine's disk, and a key kept on it would leave the \
             journal unreadable"
        );
    }
    if kafka && enabled(spate_payments::APP_NAME) && !payments_keyring_file {
        bail!(
            "with --kafka, payments needs --payments-keyring-file outside the data directory (made once with \
             `spate payments new-keyring`, the same file and --kek-file on every node): the journal on Kafka \
             outlives this machine's disk, and data keys kept on it would leave its card data unreadable"
        );
    }
    Ok(())
}
