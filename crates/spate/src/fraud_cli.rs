//! `spate fraud ...`: the case-study generator, offline scoring, and stream producers.

use crate::clock::wall_ms;
use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use spate_fraud::generator::{HistoryGenerator, Seeds, TxnGenerator};
use spate_fraud::offline::{OfflineError, for_each_record};
use spate_fraud::producer::{self, ProducerConfig};
use spate_fraud::record::RECORD_BYTES;
use spate_fraud::rules::CaseStudyRules;
use spate_fraud::stream::{BATCH_RECORDS_MAX, KIND_HISTORY, KIND_SCORE};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum FraudCommand {
    /// Generate the case study's history and transactions to files, or serve them as its TCP source.
    Gen(GenArgs),
    /// Score a transactions file against a history file offline; writes `seq,card,fraud,rule` lines.
    Score(ScoreArgs),
    /// Send records to the acknowledged stream (from a file or the generator); resends after failures.
    Push(PushArgs),
    /// Read a case-study transaction source (no acknowledgements) and forward it to the stream.
    Pull(PullArgs),
}

#[derive(Args, Clone)]
pub struct GeneratorArgs {
    /// Cards 0..N
    #[arg(long, default_value_t = 1_000_000)]
    pub cards: u32,
    /// Timestamp of the first new transaction and "now" for the history, epoch ms [default: wall clock;
    /// new transactions then carry the wall clock]
    #[arg(long)]
    pub start_ms: Option<u64>,
    /// With --start-ms, transactions per virtual millisecond
    #[arg(long, default_value_t = 1000)]
    pub per_ms: u64,
    #[arg(long, default_value_t = 1)]
    pub seed_country: i64,
    #[arg(long, default_value_t = 1)]
    pub seed_merchant: i64,
    #[arg(long, default_value_t = 1)]
    pub seed_city: i64,
    #[arg(long, default_value_t = 100)]
    pub seed_amount: i64,
    #[arg(long, default_value_t = 10)]
    pub seed_response: i64,
    #[arg(long, default_value_t = 1)]
    pub seed_card: i64,
    #[arg(long, default_value_t = 7)]
    pub seed_timestamp: i64,
}

impl GeneratorArgs {
    pub fn seeds(&self) -> Seeds {
        Seeds {
            country: self.seed_country,
            merchant: self.seed_merchant,
            city: self.seed_city,
            amount: self.seed_amount,
            response: self.seed_response,
            card: self.seed_card,
            timestamp: self.seed_timestamp,
        }
    }

    /// The clock new transactions carry: virtual from --start-ms, else the wall clock.
    fn clock(&self) -> impl FnMut() -> u64 + use<> {
        let start = self.start_ms;
        let per_ms = self.per_ms.max(1);
        let mut produced = 0u64;
        move || {
            produced += 1;
            start.map_or_else(wall_ms, |start| start + (produced - 1) / per_ms)
        }
    }

    /// Batches of `batch` generated records, `count` in all (0: endless).
    pub fn batches(&self, count: u64, batch: usize) -> impl FnMut() -> Option<Vec<u8>> + use<> {
        let mut generator = TxnGenerator::new(&self.seeds(), self.cards);
        let mut clock = self.clock();
        let mut left = if count == 0 { u64::MAX } else { count };
        move || {
            if left == 0 {
                return None;
            }
            let n = left.min(batch as u64);
            left -= n;
            let mut records = Vec::with_capacity(n as usize * RECORD_BYTES);
            for _ in 0..n {
                generator.next_txn(clock()).write_record(&mut records);
            }
            Some(records)
        }
    }
}

#[derive(Args)]
pub struct GenArgs {
    #[command(flatten)]
    generator: GeneratorArgs,
    /// History records per card
    #[arg(long, default_value_t = 20)]
    history_len: u32,
    /// Write the history here
    #[arg(long)]
    history_out: Option<PathBuf>,
    /// Write new transactions here
    #[arg(long)]
    txns_out: Option<PathBuf>,
    /// New transactions to write, or per reader when serving (0: endless when serving)
    #[arg(long, default_value_t = 1_000_000)]
    count: u64,
    /// Serve new transactions to every reader that connects, like the case study's source
    #[arg(long)]
    serve: Option<String>,
    /// When serving, records per second per reader (0: as fast as the reader takes them)
    #[arg(long, default_value_t = 0)]
    rate: u64,
}

#[derive(Args)]
pub struct ScoreArgs {
    #[arg(long)]
    history: PathBuf,
    #[arg(long)]
    txns: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// Most transactions kept per card
    #[arg(long, default_value_t = spate_fraud::history::ENTRIES_PER_CARD_DEFAULT)]
    entries_per_card: usize,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PushKind {
    /// Score each record
    Score,
    /// Store records as history, unscored
    History,
}

#[derive(Args, Clone)]
pub struct StreamArgs {
    /// The server's stream address
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub server: String,
    /// Records per batch
    #[arg(long, default_value_t = 2048)]
    pub batch: usize,
    /// Unacknowledged batches in flight
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Identifies this producer's batches for exactly-once resends [default: random]
    #[arg(long)]
    pub producer_id: Option<u64>,
    /// Keep trying to reach the server this long before giving up
    #[arg(long, default_value_t = 60)]
    pub reconnect_for_secs: u64,
}

#[derive(Args)]
pub struct PushArgs {
    #[command(flatten)]
    stream: StreamArgs,
    #[arg(long, value_enum, default_value = "score")]
    kind: PushKind,
    /// Records file; without it, the generator
    #[arg(long)]
    file: Option<PathBuf>,
    #[command(flatten)]
    generator: GeneratorArgs,
    /// Generated records to send
    #[arg(long, default_value_t = 1_000_000)]
    count: u64,
}

#[derive(Args)]
pub struct PullArgs {
    #[command(flatten)]
    stream: StreamArgs,
    /// The transaction source, HOST:PORT
    #[arg(long)]
    source: String,
    /// Stop after this many records (0: until the source closes)
    #[arg(long, default_value_t = 0)]
    count: u64,
}

pub fn run(command: FraudCommand) -> anyhow::Result<()> {
    match command {
        FraudCommand::Gen(args) => gen_command(args),
        FraudCommand::Score(args) => score_command(args),
        FraudCommand::Push(args) => push_command(args),
        FraudCommand::Pull(args) => pull_command(args),
    }
}

fn create(path: &PathBuf) -> anyhow::Result<BufWriter<File>> {
    Ok(BufWriter::with_capacity(
        1 << 20,
        File::create(path).with_context(|| format!("creating {}", path.display()))?,
    ))
}

fn gen_command(args: GenArgs) -> anyhow::Result<()> {
    let now_ms = args.generator.start_ms.unwrap_or_else(wall_ms);
    if let Some(path) = &args.history_out {
        let mut out = create(path)?;
        let mut record = Vec::with_capacity(RECORD_BYTES);
        let generator = HistoryGenerator::new(
            &args.generator.seeds(),
            args.generator.cards,
            args.history_len,
            now_ms,
        );
        for txn in generator {
            record.clear();
            txn.write_record(&mut record);
            out.write_all(&record)?;
        }
        out.flush()?;
    }
    if let Some(path) = &args.txns_out {
        let mut out = create(path)?;
        let mut batches = args.generator.batches(args.count, 8192);
        while let Some(records) = batches() {
            out.write_all(&records)?;
        }
        out.flush()?;
    }
    if let Some(address) = &args.serve {
        let listener = std::net::TcpListener::bind(address)
            .with_context(|| format!("listening on {address}"))?;
        println!("spate fraud source on {}", listener.local_addr()?);
        for socket in listener.incoming() {
            let mut socket = socket?;
            let generator = args.generator.clone();
            let (count, rate) = (args.count, args.rate);
            std::thread::spawn(move || {
                let batch = if rate == 0 {
                    1000
                } else {
                    (rate / 100).clamp(1, 1000) as usize
                };
                let mut batches = generator.batches(count, batch);
                let started = Instant::now();
                let mut sent = 0u64;
                while let Some(records) = batches() {
                    if socket.write_all(&records).is_err() {
                        return;
                    }
                    sent += (records.len() / RECORD_BYTES) as u64;
                    if rate > 0 {
                        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                        if let Some(wait) = due.checked_sub(started.elapsed()) {
                            std::thread::sleep(wait);
                        }
                    }
                }
            });
        }
    }
    if args.history_out.is_none() && args.txns_out.is_none() && args.serve.is_none() {
        bail!("nothing to do: give --history-out, --txns-out or --serve");
    }
    Ok(())
}

fn score_command(args: ScoreArgs) -> anyhow::Result<()> {
    let open =
        |path: &PathBuf| File::open(path).with_context(|| format!("opening {}", path.display()));
    let started = Instant::now();
    let summary = spate_fraud::offline::score_files(
        open(&args.history)?,
        open(&args.txns)?,
        create(&args.out)?,
        &CaseStudyRules,
        args.entries_per_card,
    )?;
    let flagged: u64 = summary.flagged_by_rule[1..].iter().sum();
    eprintln!(
        "history {} records, scored {} ({} flagged) in {:.2} s",
        summary.history,
        summary.scored,
        flagged,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn stream_config(args: &StreamArgs, kind: u8) -> anyhow::Result<ProducerConfig> {
    if args.batch == 0 || args.batch > BATCH_RECORDS_MAX {
        bail!("--batch must be 1..={BATCH_RECORDS_MAX}");
    }
    Ok(ProducerConfig {
        server: args.server.clone(),
        kind,
        producer_id: args.producer_id.unwrap_or_else(rand::random),
        window: args.window.max(1),
        reconnect_for: Duration::from_secs(args.reconnect_for_secs),
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs the producer and prints its summary as one JSON line on stdout.
pub fn produce(
    config: ProducerConfig,
    next_batch: impl FnMut() -> Option<Vec<u8>>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let report = runtime()?.block_on(producer::run(&config, next_batch))?;
    let seconds = started.elapsed().as_secs_f64();
    let mut latencies = hdrhistogram::Histogram::<u64>::new(3)?;
    for us in &report.ack_latency_us {
        latencies.record(*us)?;
    }
    let summary = serde_json::json!({
        "records": report.records,
        "scored": report.scored,
        "flagged": report.flagged,
        "malformed": report.malformed,
        "batches": report.batches,
        "reconnects": report.reconnects,
        "resent_batches": report.resent_batches,
        "seconds": seconds,
        "records_per_s": report.records as f64 / seconds,
        "ack_p50_us": latencies.value_at_quantile(0.5),
        "ack_p99_us": latencies.value_at_quantile(0.99),
        "ack_max_us": latencies.max(),
        "cpu_s": own_cpu_seconds(),
    });
    println!("{summary}");
    Ok(())
}

/// User plus system CPU this process has used.
fn own_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return f64::NAN;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

fn push_command(args: PushArgs) -> anyhow::Result<()> {
    let kind = match args.kind {
        PushKind::Score => KIND_SCORE,
        PushKind::History => KIND_HISTORY,
    };
    let config = stream_config(&args.stream, kind)?;
    let batch = args.stream.batch;
    match &args.file {
        Some(path) => {
            let mut file = std::io::BufReader::with_capacity(
                1 << 20,
                File::open(path).with_context(|| format!("opening {}", path.display()))?,
            );
            let mut failed: Option<std::io::Error> = None;
            produce(config, || {
                let mut records = vec![0; batch * RECORD_BYTES];
                let mut filled = 0;
                while filled < records.len() {
                    match file.read(&mut records[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(error) => {
                            failed = Some(error);
                            break;
                        }
                    }
                }
                // A trailing partial record is sent as is; the server reports it as malformed.
                records.truncate(filled.div_ceil(RECORD_BYTES) * RECORD_BYTES);
                (filled > 0).then_some(records)
            })?;
            if let Some(error) = failed {
                return Err(error).with_context(|| format!("reading {}", path.display()));
            }
            Ok(())
        }
        None => produce(config, args.generator.batches(args.count, batch)),
    }
}

fn pull_command(args: PullArgs) -> anyhow::Result<()> {
    let config = stream_config(&args.stream, KIND_SCORE)?;
    let source = std::net::TcpStream::connect(&args.source)
        .with_context(|| format!("connecting to the source {}", args.source))?;
    let batch = args.stream.batch;
    let (batches, received) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
    let limit = if args.count == 0 {
        u64::MAX
    } else {
        args.count
    };
    // The source has no acknowledgements: records read but not yet acknowledged by spate are lost if this
    // process dies.
    std::thread::spawn(move || {
        let mut taken = 0u64;
        let mut records = Vec::with_capacity(batch * RECORD_BYTES);
        let result = for_each_record(source, "source", |_, record| {
            records.extend_from_slice(record);
            taken += 1;
            if records.len() == batch * RECORD_BYTES || taken == limit {
                let full =
                    std::mem::replace(&mut records, Vec::with_capacity(batch * RECORD_BYTES));
                if batches.send(full).is_err() || taken == limit {
                    return Err(OfflineError::Io {
                        file: "source".into(),
                        error: std::io::Error::other("done"),
                    });
                }
            }
            Ok(())
        });
        if !records.is_empty() {
            let _ = batches.send(records);
        }
        if let Err(error) = result {
            tracing::info!(%error, "source stream ended");
        }
    });
    produce(config, || received.recv().ok())
}
