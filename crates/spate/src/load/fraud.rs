//! `spate load fraud http|stream`: generated transactions over HTTP, or through the acknowledged stream
//! with the fraud producer.

use super::args::LoadArgs;
use super::common::mix64;
use crate::fraud_cli::{GeneratorArgs, StreamArgs, produce, stream_config};
use serde_json::json;
use spate_fraud::generator::{Seeds, TxnGenerator};
use spate_fraud::stream::KIND_SCORE;
use spate_load::{Request, Scenario};

pub struct FraudHttp {
    pub seed: u64,
    pub cards: u32,
    pub batch: usize,
    pub start_ms: u64,
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

/// `spate load fraud stream`: the generator through the acknowledged stream, reported like `push`.
pub fn push_generated(args: &LoadArgs) -> anyhow::Result<()> {
    let stream = StreamArgs {
        server: args.stream.clone(),
        batch: args.batch,
        window: args.connections as usize,
        producer_id: None,
        reconnect_for_secs: args.timeout_s.ceil() as u64,
    };
    let generator = GeneratorArgs {
        cards: args.cards,
        start_ms: None,
        per_ms: 1000,
        seed_country: 1,
        seed_merchant: 1,
        seed_city: 1,
        seed_amount: 100,
        seed_response: 10,
        seed_card: args.seed as i64,
        seed_timestamp: 7,
    };
    let count = args.requests.unwrap_or(10_000_000);
    produce(
        stream_config(&stream, KIND_SCORE)?,
        generator.batches(count, args.batch),
    )
}
