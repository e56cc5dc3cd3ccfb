//! What the payments crash tests (one node and a cluster) read back: the settlement files.

use std::collections::HashMap;
use std::path::Path;

/// Every capture in the settlement files under `dir` with its amount, after checking each file's
/// trailer and MAC with `keyring`; a capture in two records fails.
pub fn settled(dir: &Path, keyring: &spate_payments::keys::Keyring) -> HashMap<String, u64> {
    let mut in_files = HashMap::new();
    for file in spate_payments::settle::files_under(dir) {
        let bytes = std::fs::read(&file).unwrap();
        spate_payments::settle::verify(&bytes, keyring)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let text = String::from_utf8(bytes).unwrap();
        for line in text.lines().filter(|l| l.starts_with("D|")) {
            let fields: Vec<&str> = line.split('|').collect();
            let previous = in_files.insert(fields[2].to_string(), fields[3].parse().unwrap());
            assert!(previous.is_none(), "{} settled twice", fields[2]);
        }
    }
    in_files
}
