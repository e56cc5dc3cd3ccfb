//! The ledger workload the crash tests share (one node and a cluster): FSPIOP request bodies, clients
//! that prepare then fulfil transfers and record each acknowledged state, and the check that the
//! ledger after a crash holds every acknowledged transfer in its state with positions summing to zero.

use super::{agent, eventually, get, retry_while_moving, send, timed_out};
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

pub fn fulfilment(n: u64) -> [u8; 32] {
    let mut bytes = [7u8; 32];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    bytes
}

pub fn transfer_id(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

/// An RFC 3339 time `offset_ms` from now.
pub fn at(offset_ms: i64) -> String {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let ms = now_ms + offset_ms;
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub fn prepare_body(n: u64, payer: &str, payee: &str, amount: &str, expires_in_ms: i64) -> Value {
    json!({
        "transferId": transfer_id(n),
        "payerFsp": payer,
        "payeeFsp": payee,
        "amount": {"currency": "USD", "amount": amount},
        "condition": b64(&Sha256::digest(fulfilment(n))),
        "expiration": at(expires_in_ms),
        "ilpPacket": "AYIBgQAAAAAAAASw",
    })
}

pub fn fulfil_body(n: u64) -> Value {
    json!({"transferState": "COMMITTED", "fulfilment": b64(&fulfilment(n)), "completedTimestamp": at(0)})
}

/// PUT with the FSPIOP-Source header; `Err` only when no HTTP answer came.
pub fn put_as(
    agent: &ureq::Agent,
    url: &str,
    source: &str,
    body: &Value,
) -> Result<(u16, Value), ureq::Error> {
    let mut response = agent
        .put(url)
        .header("content-type", "application/json")
        .header("FSPIOP-Source", source)
        .send(serde_json::to_vec(body).unwrap())?;
    let status = response.status().as_u16();
    Ok((
        status,
        response.body_mut().read_json().unwrap_or(Value::Null),
    ))
}

pub fn create(agent: &ureq::Agent, base: &str, name: &str, ndc: &str) {
    let body = json!({"name": name, "currency": "USD", "ndc": ndc});
    let url = format!("{base}/participants");
    let (status, body) =
        retry_while_moving(|| send(agent, "POST", &url, None, Some(&body)).expect("answered"));
    assert_eq!(status, 201, "{body}");
}

pub fn participant(agent: &ureq::Agent, base: &str, name: &str) -> Value {
    let (status, body) = retry_while_moving(|| get(agent, &format!("{base}/participants/{name}")));
    assert_eq!(status, 200, "{body}");
    body
}

/// The FSPs the crash clients move money between.
pub const FSPS: [&str; 4] = ["fsp0", "fsp1", "fsp2", "fsp3"];

/// A transfer a crash-test client had acknowledged: number, last acknowledged state, payer, payee, cents.
pub type AckedTransfer = (u64, &'static str, String, String, i64);

/// What a crash-test client had acknowledged.
#[derive(Default)]
pub struct Client {
    pub acked: Vec<AckedTransfer>,
}

/// True for the answer a cluster gives while a partition moves to another node.
fn moving(status: u16, body: &Value) -> bool {
    status == 503 && body["error"]["code"] == "partition_moving"
}

/// Prepares then fulfils transfers between [`FSPS`] until the server dies or `stop` is set; records each
/// acknowledged state. Transfer numbers start at `id << 32`. A prepare or fulfil answered
/// `partition_moving` (a cluster moving a partition) is left unacknowledged and the client goes on.
pub fn crash_client(base: &str, id: u64, state: &Mutex<Client>, stop: &AtomicBool) {
    let agent = agent();
    for k in 0u64.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let n = id << 32 | k;
        let payer = FSPS[(n % 4) as usize];
        let payee = FSPS[((n / 4 + 1 + n % 4) % 4) as usize];
        if payer == payee {
            continue;
        }
        let dollars = 1 + (n * 7919) % 50;
        let amount = dollars.to_string();
        let cents = dollars as i64 * 100;
        // No answer in time (a broker lost, say): the transfer is left as it is, maybe reserved, and
        // the client goes on with the next. No answer at all: the server is gone.
        let (status, body) = match send(
            &agent,
            "POST",
            &format!("{base}/transfers"),
            None,
            Some(&prepare_body(n, payer, payee, &amount, 600_000)),
        ) {
            Ok(answer) => answer,
            Err(error) if timed_out(&error) => continue,
            Err(_) => return,
        };
        // 202 RECEIVED: accepted, but its reservation (a follow-up to the payer's partition) did not
        // finish within the wait, as when a broker is lost; left as it is, like a timeout.
        if moving(status, &body) || status == 202 {
            continue;
        }
        assert_eq!(status, 201, "{body}");
        state
            .lock()
            .unwrap()
            .acked
            .push((n, "RESERVED", payer.into(), payee.into(), cents));
        let url = format!("{base}/transfers/{}", transfer_id(n));
        let (status, body) = match put_as(&agent, &url, payee, &fulfil_body(n)) {
            Ok(answer) => answer,
            Err(error) if timed_out(&error) => continue,
            Err(_) => return,
        };
        if moving(status, &body) {
            continue;
        }
        assert_eq!(status, 200, "{body}");
        state.lock().unwrap().acked.last_mut().unwrap().1 = "COMMITTED";
    }
}

/// Amount text such as "-12.5" in cents.
fn cents_of(text: &Value) -> i64 {
    let text = text.as_str().unwrap();
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let sign = if int.starts_with('-') { -1 } else { 1 };
    let int: i64 = int.trim_start_matches('-').parse().unwrap();
    let frac: i64 = format!("{frac:0<2}").parse().unwrap();
    sign * (int * 100 + frac)
}

/// Checks the ledger at `base` after a crash: every acknowledged transfer is in its acknowledged state
/// (or further along) and a second prepare of it is refused, and once every follow-up has landed, each FSP's position is exactly its
/// committed transfers, its reservations at least its acknowledged reserved ones, and positions sum
/// to zero. `label` names the run.
pub fn check_transfers(base: &str, acked: &[AckedTransfer], label: &str) {
    let agent = agent();
    let mut states = std::collections::HashMap::new();
    for (n, state, payer, payee, cents) in acked {
        let url = format!("{base}/transfers/{}", transfer_id(*n));
        let (status, body) = retry_while_moving(|| get(&agent, &url));
        assert_eq!(status, 200, "{label}: transfer {n}: {body}");
        let now = body["transferState"].clone();
        match *state {
            "COMMITTED" => assert_eq!(now, "COMMITTED", "{label}: {n}: {body}"),
            _ => assert!(
                now == "RESERVED" || now == "COMMITTED",
                "{label}: {n}: {body}"
            ),
        }
        states.insert(*n, now);
        // A second prepare of the same id (its expiration differs, so its content does) is refused
        // as a modified duplicate, however long ago the first left memory: never a second transfer.
        let dollars = (*cents / 100).to_string();
        let again = prepare_body(*n, payer, payee, &dollars, 600_000);
        let url = format!("{base}/transfers");
        let (status, body) = retry_while_moving(|| {
            send(&agent, "POST", &url, None, Some(&again)).expect("answered")
        });
        assert_eq!(
            (status, &body["error"]["code"]),
            (409, &json!("3106")),
            "{label}: a second prepare of transfer {n}: {body}"
        );
    }
    // Positions move in follow-ups on the payee's partition: wait until they sum to zero.
    let summed = eventually(Duration::from_secs(30), || {
        let url = format!("{base}/participants");
        retry_while_moving(|| get(&agent, &url)).1["positionSums"]["USD"] == "0"
    });
    assert!(summed, "{label}: positions do not sum to zero");
    for fsp in FSPS {
        let (mut position, mut reserved) = (0i64, 0i64);
        for (n, _, payer, payee, cents) in acked {
            match states[n].as_str() {
                Some("COMMITTED") if payer == fsp => position += cents,
                Some("COMMITTED") if payee == fsp => position -= cents,
                Some("RESERVED") if payer == fsp => reserved += cents,
                _ => {}
            }
        }
        let body = participant(&agent, base, fsp);
        assert_eq!(
            cents_of(&body["position"]),
            position,
            "{label}: {fsp}: {body}"
        );
        // Transfers prepared but not acknowledged before the kill may hold reservations too.
        assert!(
            cents_of(&body["reserved"]) >= reserved,
            "{label}: {fsp}: {body}"
        );
    }
}
