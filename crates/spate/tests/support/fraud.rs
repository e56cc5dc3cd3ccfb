//! What the fraud tests compare the server with: the same library code, run in the test.

use super::{Server, agent, post};
use serde_json::{Value, json};
use spate_fraud::generator::{HistoryGenerator, Seeds, TxnGenerator};
use spate_fraud::history::{ENTRIES_PER_CARD_DEFAULT, HistoryStore, UNSCORED};
use spate_fraud::record::Txn;
use spate_fraud::rules::CaseStudyRules;

pub const START_MS: u64 = 1_800_000_000_000;

/// Card numbers distinctive enough that neither their text nor their binary form turns up by chance.
pub const SECRET_CARDS: [u64; 3] = [31_415_926_535_897, 27_182_818_284_590, 16_180_339_887_498];

/// Fails if any of `files` holds one of `cards` as 14-digit text or as little-endian bytes. A file that
/// vanished meanwhile (a broker deleting a segment) is passed over.
pub fn assert_no_card_numbers(files: &[std::path::PathBuf], cards: &[u64]) {
    let needles: Vec<Vec<u8>> = cards
        .iter()
        .flat_map(|card| {
            [
                format!("{card:014}").into_bytes(),
                card.to_le_bytes().to_vec(),
            ]
        })
        .collect();
    for file in files {
        let Ok(bytes) = std::fs::read(file) else {
            continue;
        };
        for needle in &needles {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_slice()),
                "{} holds a card number in clear",
                file.display()
            );
        }
    }
}

/// A transaction as the HTTP API takes it.
pub fn as_json(txn: &Txn) -> Value {
    json!({
        "card": format!("{:014}", txn.card),
        "timestamp": txn.timestamp.to_string(),
        "country": format!("{:03}", txn.country),
        "response": format!("{:02}", txn.response),
        "amount": txn.amount.to_string(),
        "currency": format!("{:03}", txn.currency),
        "merchant": format!("{:04}", txn.merchant),
        "city": format!("{:05}", txn.city),
        "code": txn.code.to_string(),
    })
}

/// The generator's transactions with the virtual clock `spate fraud push --start-ms --per-ms` uses.
pub fn generated(cards: u32, count: u64, per_ms: u64) -> Vec<Txn> {
    let mut generator = TxnGenerator::new(&Seeds::default(), cards);
    (0..count)
        .map(|i| generator.next_txn(START_MS + i / per_ms))
        .collect()
}

/// The store and verdicts after the generated history of `history_cards` cards (0: none), then `txns`.
pub fn expected(history_cards: u32, txns: &[Txn]) -> (HistoryStore, Vec<u8>) {
    let mut store = HistoryStore::new(ENTRIES_PER_CARD_DEFAULT);
    for txn in HistoryGenerator::new(&Seeds::default(), history_cards, 20, START_MS) {
        store.store(&txn, UNSCORED);
    }
    let mut window = Vec::new();
    let verdicts = txns
        .iter()
        .map(|txn| store.score_and_store(txn, &CaseStudyRules, &mut window))
        .collect();
    (store, verdicts)
}

/// Verdict counts per rule, shaped like `/fraud/stats`'s `flagged_by_rule`.
pub fn by_rule(verdicts: &[u8]) -> Value {
    let mut counts = serde_json::Map::new();
    for rule in 1..=49u8 {
        let n = verdicts.iter().filter(|v| **v == rule).count();
        if n > 0 {
            counts.insert(rule.to_string(), json!(n));
        }
    }
    Value::Object(counts)
}

/// Has the server generate the case study's history of `cards` cards, as of [`START_MS`].
pub fn generate_history(server: &Server, cards: u32) {
    let url = format!("{}/fraud/history/generate", server.base);
    let body = json!({"cards": cards, "now_ms": START_MS});
    let (status, reply) = post(&agent(), &url, None, &body).unwrap();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["stored"], u64::from(cards) * 20);
}
