//! Who may call a node's internal routes: only the nodes of its cluster, which share a secret.
//!
//! A node signs every request it sends another node (forwarded commands, follow-ups, reads) with
//! HMAC-SHA256 over the time, the method, the path and the body, keyed by the cluster's secret; the
//! receiving node refuses a request whose signature is missing, wrong or older than
//! [`SIGNATURE_AGE_MAX`]. Without it, anyone who could reach a node's port could put commands into the
//! journal past every app's HTTP validation. What it does not do: hide the traffic (a request can be read
//! on the wire, and replayed within the age limit; commands with an idempotency key and follow-ups are
//! applied once anyway). Nodes belong on a private network until the cluster's traffic is encrypted.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The header that carries a signature: `t=<unix ms>,v=<hex HMAC>`.
pub const SIGNATURE_HEADER: &str = "x-spate-signature";
/// How far a signature's time may be from the receiver's clock, either way: the delay of a request
/// plus the clock skew between nodes.
pub const SIGNATURE_AGE_MAX: Duration = Duration::from_secs(60);
/// A shorter secret is refused: 32 random bytes are as strong as the HMAC.
pub const SECRET_BYTES_MIN: usize = 32;
/// Separates these signatures from any other use of the same secret.
const CONTEXT: &[u8] = b"spate internal v1";

type HmacSha256 = Hmac<Sha256>;

/// The secret every node of a cluster shares.
#[derive(Clone)]
pub struct ClusterSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret in `bytes` (a trailing newline is not part of it, so that `echo` and editors agree).
    pub fn new(bytes: &[u8]) -> Result<Self, String> {
        let key = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let key = key.strip_suffix(b"\r").unwrap_or(key);
        if key.len() < SECRET_BYTES_MIN {
            let newline = if key.len() < bytes.len() {
                ", not counting the newline it ends with"
            } else {
                ""
            };
            return Err(format!(
                "the cluster secret has {} bytes{newline}; it needs at least {SECRET_BYTES_MIN} (for \
                 example `head -c 32 /dev/urandom | base64 > FILE`, the same file on every node)",
                key.len()
            ));
        }
        Ok(Self { key: key.to_vec() })
    }

    pub fn read(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read the cluster secret {}: {e}", path.display()))?;
        Self::new(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The header value that signs a request now.
    pub fn sign(&self, method: &str, path: &str, body: &[u8]) -> String {
        self.sign_at(unix_ms(SystemTime::now()), method, path, body)
    }

    fn sign_at(&self, time_ms: u64, method: &str, path: &str, body: &[u8]) -> String {
        let tag = self
            .mac(time_ms, method, path, body)
            .finalize()
            .into_bytes();
        format!("t={time_ms},v={}", hex::encode(tag))
    }

    /// Checks `header` (the value of [`SIGNATURE_HEADER`], if any) against the request; the error says
    /// what is wrong, never what the right signature would be.
    pub fn verify(
        &self,
        header: Option<&str>,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(), String> {
        self.verify_at(SystemTime::now(), header, method, path, body)
    }

    fn verify_at(
        &self,
        now: SystemTime,
        header: Option<&str>,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(), String> {
        let header = header.ok_or(format!(
            "a request between nodes needs the {SIGNATURE_HEADER} header (nodes of one cluster sign \
             with the same --cluster-secret-file)"
        ))?;
        let malformed = || format!("{SIGNATURE_HEADER} is not t=<unix ms>,v=<64 hex digits>");
        let (time, tag) = header.split_once(',').ok_or_else(malformed)?;
        let time_ms: u64 = time
            .strip_prefix("t=")
            .and_then(|t| t.parse().ok())
            .ok_or_else(malformed)?;
        let tag = tag
            .strip_prefix("v=")
            .and_then(unhex)
            .ok_or_else(malformed)?;
        let age_ms = unix_ms(now).abs_diff(time_ms);
        if age_ms > SIGNATURE_AGE_MAX.as_millis() as u64 {
            return Err(format!(
                "the request was signed {age_ms} ms away from this node's clock (at most {} ms): \
                 old, replayed, or the nodes' clocks disagree",
                SIGNATURE_AGE_MAX.as_millis()
            ));
        }
        self.mac(time_ms, method, path, body)
            .verify_slice(&tag)
            .map_err(|_| {
                "the request's signature is wrong: it was not signed with this cluster's secret"
                    .to_string()
            })
    }

    fn mac(&self, time_ms: u64, method: &str, path: &str, body: &[u8]) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        for part in [
            CONTEXT,
            time_ms.to_string().as_bytes(),
            method.as_bytes(),
            path.as_bytes(),
        ] {
            // Lengths first, so that no two different requests sign the same bytes.
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.update(body);
        mac
    }
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A signature's 64 hex digits.
fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut tag = [0; 32];
    hex::decode_to_slice(text, &mut tag).ok()?;
    Some(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(fill: u8) -> ClusterSecret {
        ClusterSecret::new(&[fill; 32]).unwrap()
    }

    #[test]
    fn a_signed_request_verifies_and_any_change_to_it_does_not() {
        let secret = secret(7);
        let now = SystemTime::now();
        let signed = secret.sign_at(
            unix_ms(now),
            "POST",
            "/internal/v1/partitions/0/commands",
            b"body",
        );
        let verify = |header: &str, method: &str, path: &str, body: &[u8]| {
            secret.verify_at(now, Some(header), method, path, body)
        };
        assert_eq!(
            verify(
                &signed,
                "POST",
                "/internal/v1/partitions/0/commands",
                b"body"
            ),
            Ok(())
        );
        for (method, path, body) in [
            ("GET", "/internal/v1/partitions/0/commands", &b"body"[..]),
            ("POST", "/internal/v1/partitions/1/commands", b"body"),
            ("POST", "/internal/v1/partitions/0/commands", b"bodY"),
            ("POST", "/internal/v1/partitions/0/commands", b""),
        ] {
            let refused = verify(&signed, method, path, body).unwrap_err();
            assert!(refused.contains("signature is wrong"), "{refused}");
        }
        let other = super::tests::secret(8).sign_at(
            unix_ms(now),
            "POST",
            "/internal/v1/partitions/0/commands",
            b"body",
        );
        assert!(
            verify(
                &other,
                "POST",
                "/internal/v1/partitions/0/commands",
                b"body"
            )
            .is_err()
        );
    }

    #[test]
    fn old_missing_and_malformed_signatures_are_refused_with_the_reason() {
        let secret = secret(1);
        let now = SystemTime::now();
        let old = unix_ms(now) - SIGNATURE_AGE_MAX.as_millis() as u64 - 1;
        let stale = secret.sign_at(old, "POST", "/p", b"");
        let refused = secret
            .verify_at(now, Some(&stale), "POST", "/p", b"")
            .unwrap_err();
        assert!(
            refused.contains("ms away from this node's clock"),
            "{refused}"
        );
        let missing = secret.verify_at(now, None, "POST", "/p", b"").unwrap_err();
        assert!(missing.contains(SIGNATURE_HEADER), "{missing}");
        for header in [
            "",
            "t=1",
            "t=x,v=00",
            "v=00,t=1",
            "t=1,v=zz",
            &format!("t=1,v={}", "é".repeat(32)),
            // Digits with a sign, which `u8::from_str_radix` would have read as hex.
            &format!("t=1,v={}", "+f".repeat(32)),
        ] {
            let refused = secret
                .verify_at(now, Some(header), "POST", "/p", b"")
                .unwrap_err();
            assert!(refused.contains("is not t="), "{header}: {refused}");
        }
    }

    #[test]
    fn a_short_secret_is_refused_and_a_trailing_newline_is_not_part_of_it() {
        assert!(
            ClusterSecret::new(&[0; 31])
                .unwrap_err()
                .contains("at least 32")
        );
        // 32 random bytes may end in a newline: refused, saying why.
        let refused = ClusterSecret::new(&[[5u8; 31].as_slice(), b"\n"].concat()).unwrap_err();
        assert!(
            refused.contains("31 bytes, not counting the newline"),
            "{refused}"
        );
        let with_newline = ClusterSecret::new(&[[5u8; 32].as_slice(), b"\n"].concat()).unwrap();
        let signed = with_newline.sign_at(1, "POST", "/p", b"");
        assert_eq!(secret(5).sign_at(1, "POST", "/p", b""), signed);
    }
}
