//! payments: card authorization with fraud scoring and tax, deferred capture settled in batch files, and
//! card data that is never readable at rest.
//!
//! - `card.rs`: card fields at the edge (Luhn, masking, CVC, expiry). `keys.rs`: the KEK, the keyring it
//!   wraps (data keys, token key, settlement MAC key), sealing and tokens, rotation.
//! - `reference.rs`: tax rates, merchant settings and feature switches, reloaded without a restart.
//! - `command.rs`: commands, replies, events and the payment object. `state.rs`: the rules on one
//!   partition (a payment lives on its card's partition, next to the card's fraud history).
//! - `model.rs`: the read model (listing, events feed). `settle.rs`: settlement batches and their files.
//!   `http.rs`: the API.

pub mod card;
pub mod command;
mod http;
pub mod keys;
pub mod model;
pub mod reference;
pub mod settle;
pub mod state;

pub use http::{AMOUNT_MAX, PAGE_LIMIT_MAX, ROUTE_ACCESS};

use keys::{Kek, Keyring};
use model::{ModelStore, PaymentsModel, PaymentsProjection};
use reference::{Reference, ReferenceSources};
use settle::Settler;
use spate_cards::rules::CaseStudyRules;
use spate_engine::AppSpec;
use spate_server::AppModule;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub const APP_ID: spate_engine::AppId = 5;
pub const APP_NAME: &str = "payments";

pub struct PaymentsConfig {
    pub data_dir: PathBuf,
    /// The key-encrypting key; never inside `data_dir`.
    pub kek_file: PathBuf,
    /// The keys it wraps (`Keyring::path_in(data_dir)` for a single server).
    pub keyring_file: PathBuf,
    /// Whether a missing keyring is created (a single server) or refused (a cluster's nodes share one).
    pub create_keyring: bool,
    pub settlement_dir: PathBuf,
    pub reference: ReferenceSources,
    /// Settle on this period inside the server; `None` only on request.
    pub settle_every: Option<Duration>,
    pub feed_events_per_partition: usize,
    /// The block cache of the read model's list store.
    pub store_cache_bytes: u64,
}

pub fn module(config: PaymentsConfig) -> Result<AppModule, String> {
    let (kek, created) =
        Kek::load_or_create(&config.kek_file, &config.data_dir).map_err(|e| e.to_string())?;
    if created {
        tracing::warn!(
            kek_file = %config.kek_file.display(),
            "created a development key-encrypting key for card data; in production provision one (--kek-file or SPATE_KEK_FILE) and keep it off this machine's data disk"
        );
    }
    let keyring = if config.create_keyring {
        Keyring::load_or_create(&config.keyring_file, &kek).map_err(|e| e.to_string())
    } else {
        Keyring::load(&config.keyring_file, &kek).map_err(|e| {
            format!(
                "{e} (the nodes of a cluster share one keyring: create it once with `spate payments \
                 new-keyring` and give every node the same file and KEK)"
            )
        })
    };
    let keyring = Arc::new(keyring?);
    tracing::info!(
        kek = kek.id(),
        data_key = keyring.active_data_key(),
        "payments keyring open"
    );
    let reference = Arc::new(Reference::load(config.reference)?);
    let store = ModelStore::open(
        &config.data_dir.join("payments").join("model"),
        config.store_cache_bytes,
    )
    .map_err(|e| e.to_string())?;
    let store_db = store.database();
    let model = Arc::new(RwLock::new(PaymentsModel::new(
        config.feed_events_per_partition,
        store,
    )));
    let spec = AppSpec {
        id: APP_ID,
        name: APP_NAME,
        new_state: Box::new(|_| Box::new(new_state())),
        restore: Box::new(|_, input| {
            Ok(Box::new(state::PaymentsState::restore(
                input,
                Arc::new(CaseStudyRules),
            )?))
        }),
        archives: true,
        projection: Some(Box::new(PaymentsProjection {
            model: model.clone(),
        })),
    };
    let (settlement_dir, settle_every) = (config.settlement_dir, config.settle_every);
    Ok(AppModule {
        spec,
        routes: Box::new(move |engine, _| {
            engine
                .tend_store(APP_NAME, store_db)
                .map_err(|e| format!("spawning the payments store's threads: {e}"))?;
            let settler = Arc::new(Settler::new(
                engine.clone(),
                keyring.clone(),
                reference.clone(),
                settlement_dir,
            ));
            spawn_reload_on_hangup(reference.clone());
            if let Some(period) = settle_every {
                spawn_settlements(settler.clone(), period);
            }
            Ok(http::routes(Arc::new(http::Payments {
                engine,
                keyring,
                reference,
                model,
                settler,
            })))
        }),
        access: ROUTE_ACCESS,
        message_only_error_paths: &[],
    })
}

pub fn new_state() -> state::PaymentsState {
    state::PaymentsState::new(
        Arc::new(CaseStudyRules),
        spate_cards::history::ENTRIES_PER_CARD_DEFAULT,
    )
}

fn spawn_reload_on_hangup(reference: Arc<Reference>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP; reload with POST /admin/reload");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            match reference.reload() {
                Ok(data) => tracing::info!(
                    version = data.version,
                    "SIGHUP: payments reference data reloaded"
                ),
                Err(error) => {
                    tracing::error!(%error, "SIGHUP: reload failed; the previous reference data stays in force")
                }
            }
        }
    });
}

fn spawn_settlements(settler: Arc<Settler>, period: Duration) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(period);
        interval.tick().await;
        loop {
            interval.tick().await;
            match settler.run().await {
                Ok(report) => {
                    tracing::info!(batches = report.batches.len(), "scheduled settlement done")
                }
                Err(error) => {
                    tracing::error!(%error, "scheduled settlement failed; the next run finishes it")
                }
            }
        }
    });
}
