//! The payments scenarios of `spate load payments ...`: authorizations (optionally captured at once) and
//! a mix of authorizations, partial captures and partial refunds.

use super::common::mix64;
use anyhow::{Context, bail};
use serde_json::{Value, json};
use spate_load::{Request, Scenario};

/// The built-in merchants with a tax line each, taken in turn.
const MERCHANTS: [(&str, &str, &str); 5] = [
    ("acme_shop", "general", "US-CA"),
    ("corner_grocer", "food", "DE"),
    ("harbor_hotel", "lodging", "FR"),
    ("sky_air", "general", "GB"),
    ("pixel_apps", "general", "JP"),
];

/// An authorization body, written directly (a JSON value per request would cost the load generator more
/// than the server spends on it, on the same cores).
fn authorization_body(n: u64, cards: u64, amount: u64, capture: bool) -> Vec<u8> {
    let (merchant, category, jurisdiction) = MERCHANTS[(n % MERCHANTS.len() as u64) as usize];
    let card = spate_payments::card::test_number(mix64(n) % cards);
    let method = if capture { "automatic" } else { "manual" };
    format!(
        r#"{{"amount":{amount},"currency":"usd","merchant":"{merchant}","card":{{"number":"{card}","exp_month":12,"exp_year":2030,"cvc":"123"}},"tax":{{"category":"{category}","jurisdiction":"{jurisdiction}"}},"capture_method":"{method}"}}"#
    )
    .into_bytes()
}

pub struct PaymentsAuthorize {
    pub seed: u64,
    pub cards: u64,
    pub capture: bool,
    /// Makes idempotency keys unique per run, so a second run against the same server is new work.
    pub run: u64,
}

impl PaymentsAuthorize {
    fn request_for(&self, worker: u32, seq: u64) -> Request {
        let n = mix64(self.seed ^ (u64::from(worker) << 40) ^ seq);
        let amount = 100 + n % 50_000;
        Request::post_json(
            "/v1/payments",
            authorization_body(n, self.cards, amount, self.capture),
        )
        .with_header(
            "idempotency-key",
            format!("load-{}-{worker}-{seq}", self.run),
        )
        .also_ok(&[402])
    }
}

impl Scenario for PaymentsAuthorize {
    fn name(&self) -> String {
        if self.capture {
            "payments authorizations captured at once".into()
        } else {
            "payments authorizations".into()
        }
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        self.request_for(worker, seq)
    }
}

/// 70 % authorizations, 20 % one-cent captures and 10 % one-cent refunds of prepared payments.
pub struct PaymentsMix {
    pub authorize: PaymentsAuthorize,
    /// Authorized for 99,999,999, half of it captured and settled.
    pub prepared: Vec<String>,
}

impl Scenario for PaymentsMix {
    fn name(&self) -> String {
        "payments mix (70% authorize, 20% capture, 10% refund)".into()
    }

    fn request(&self, worker: u32, seq: u64) -> Request {
        let n = mix64(self.authorize.seed ^ (u64::from(worker) << 40) ^ seq ^ 0x5eed);
        let key = format!("mix-{}-{worker}-{seq}", self.authorize.run);
        let payment = &self.prepared[(n / 10 % self.prepared.len() as u64) as usize];
        match n % 10 {
            0..7 => self.authorize.request_for(worker, seq),
            7..9 => Request::post_json(
                format!("/v1/payments/{payment}/capture"),
                br#"{"amount":1,"final_capture":false}"#.to_vec(),
            )
            .with_header("idempotency-key", key),
            _ => Request::post_json(
                format!("/v1/payments/{payment}/refunds"),
                br#"{"amount":1}"#.to_vec(),
            )
            .with_header("idempotency-key", key),
        }
    }
}

fn post(agent: &ureq::Agent, url: &str, key: &str, body: &[u8]) -> anyhow::Result<Value> {
    let mut response = agent
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .send(body)
        .with_context(|| format!("POST {url}"))?;
    let status = response.status().as_u16();
    let value: Value = response.body_mut().read_json().unwrap_or(Value::Null);
    if status != 200 {
        bail!("POST {url} answered {status}: {value}");
    }
    Ok(value)
}

/// Authorizes `count` payments of 9,999 on cards outside the scenario's range, captures half of each
/// and settles, so the mix can capture and refund them (1 at a time); returns their ids. Under 10,000,
/// which fraud rule 9 declines at night: a larger amount made the mix fail from 01:00 to 03:59.
pub fn prepare_mix(target: &str, count: usize, run: u64) -> anyhow::Result<Vec<String>> {
    let base = target.trim_end_matches('/');
    let threads = 8;
    let ids: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> anyhow::Result<Vec<String>> {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .into();
                    let mut ids = Vec::new();
                    for index in (thread..count).step_by(threads) {
                        let (merchant, category, jurisdiction) = MERCHANTS[index % MERCHANTS.len()];
                        let body = json!({
                            "amount": 9_999, "currency": "usd", "merchant": merchant,
                            "card": {"number": spate_payments::card::test_number(90_000_000_000_000 + index as u64), "exp_month": 12, "exp_year": 2030, "cvc": "123"},
                            "tax": {"category": category, "jurisdiction": jurisdiction},
                        });
                        let key = format!("prepare-{run}-{index}");
                        let payment = post(&agent, &format!("{base}/v1/payments"), &key, &serde_json::to_vec(&body)?)?;
                        let id = payment["id"].as_str().context("a payment has an id")?.to_string();
                        post(
                            &agent,
                            &format!("{base}/v1/payments/{id}/capture"),
                            &format!("{key}-capture"),
                            br#"{"amount":5000,"final_capture":false}"#,
                        )?;
                        ids.push(id);
                    }
                    Ok(ids)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a preparing thread panicked"))
            .collect::<anyhow::Result<Vec<Vec<String>>>>()
            .map(|all| all.into_iter().flatten().collect())
    })?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .post(format!("{base}/admin/settlements"))
        .send_empty()
        .context("settling the prepared captures")?;
    if response.status().as_u16() != 200 {
        bail!(
            "settling the prepared captures answered {}: {}",
            response.status(),
            response.body_mut().read_to_string()?
        );
    }
    Ok(ids)
}
