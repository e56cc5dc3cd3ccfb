//! fraud: card transactions scored against each card's recent history by a rule set (the case study's 49
//! rules built in), with the verdict stored in the history. `specs/fraud.md` has the exact semantics.
//!
//! Ingest paths (HTTP, the acknowledged stream, the pull bridge) all go through [`ingest::Ingest`], which
//! splits batches by card and queues one encrypted command per partition. Apply ([`state::FraudState`])
//! scores and stores; card data is encrypted in the journal and in snapshots ([`cipher`]).

pub mod command;
pub mod generator;
mod http;
pub mod ingest;
pub mod java_random;
pub mod offline;
pub mod producer;
pub mod state;
pub mod stream;

pub use http::TXNS_PER_REQUEST_MAX;
// The scoring library lives in `spate-cards`, which payments uses too; fraud names it as its own.
pub use spate_cards::{cipher, history, record, rules};

use cipher::CardCipher;
use rules::{CaseStudyRules, RuleSet};
use spate_engine::AppSpec;
use spate_server::AppModule;
use std::net::SocketAddr;
use std::sync::Arc;

pub const APP_ID: spate_engine::AppId = 1;
pub const APP_NAME: &str = "fraud";

pub struct FraudConfig {
    pub entries_per_card_max: usize,
    /// AES-256 key for card data at rest.
    pub key: [u8; cipher::KEY_BYTES],
    /// Where the acknowledged stream listens; `None` disables it.
    pub stream_listen: Option<SocketAddr>,
    pub rules: Arc<dyn RuleSet>,
}

impl FraudConfig {
    pub fn new(key: [u8; cipher::KEY_BYTES]) -> Self {
        Self {
            entries_per_card_max: history::ENTRIES_PER_CARD_DEFAULT,
            key,
            stream_listen: Some(SocketAddr::from(([127, 0, 0, 1], 8090))),
            rules: Arc::new(CaseStudyRules),
        }
    }
}

pub fn module(config: FraudConfig) -> AppModule {
    let cipher = Arc::new(CardCipher::new(&config.key));
    let (rules, cap) = (config.rules.clone(), config.entries_per_card_max);
    let (restore_rules, restore_cipher) = (config.rules.clone(), cipher.clone());
    let state_cipher = cipher.clone();
    let spec = AppSpec {
        id: APP_ID,
        name: APP_NAME,
        new_state: Box::new(move |_| {
            Box::new(state::FraudState::new(
                cap,
                rules.clone(),
                state_cipher.clone(),
            ))
        }),
        restore: Box::new(move |_, input| {
            Ok(Box::new(state::FraudState::restore(
                input,
                restore_rules.clone(),
                restore_cipher.clone(),
            )?))
        }),
        archives: false,
        projection: None,
    };
    let stream_listen = config.stream_listen;
    AppModule {
        spec,
        routes: Box::new(move |engine, registry| {
            let metrics = ingest::FraudMetrics::register(registry);
            let ingest = ingest::Ingest::new(engine, cipher, metrics);
            if let Some(address) = stream_listen {
                let listener = std::net::TcpListener::bind(address)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .and_then(tokio::net::TcpListener::from_std)
                    .map_err(|e| format!("cannot listen for the fraud stream on {address}: {e}"))?;
                let local = listener.local_addr().map_err(|e| e.to_string())?;
                // Scripts and tests read the stream port from this line (the address may end in :0).
                println!("spate fraud stream on {local}");
                tokio::spawn(stream::serve(listener, ingest.clone()));
            }
            Ok(http::routes(ingest, cap))
        }),
        access: http::ROUTE_ACCESS,
        message_only_error_paths: &[],
    }
}
