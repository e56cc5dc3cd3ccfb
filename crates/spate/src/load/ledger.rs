//! `spate load ledger transfers|batch|reads`: the Mojaloop PoC's prepare and fulfil, singly or in
//! batches, and reads of transfers written before.

use super::common::mix64;
use anyhow::{Context, bail};
use serde_json::json;
use spate_load::{Request, Scenario};

/// Far enough ahead that no transfer of a load run expires.
const LEDGER_EXPIRATION: &str = "2100-01-01T00:00:00.000Z";

pub struct LedgerTransfers {
    pub seed: u64,
    pub participants: u32,
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
pub struct LedgerReads {
    pub transfers: LedgerTransfers,
    pub writers: u32,
    pub per_writer: u64,
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
pub struct LedgerBatch {
    pub transfers: LedgerTransfers,
    pub batch: u64,
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
pub fn create_ledger_participants(target: &str, count: u32) -> anyhow::Result<()> {
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
