//! Scoring without a server: the same store and rules over two record files, for checks and tooling.

use crate::history::{HistoryStore, UNSCORED};
use crate::record::{RECORD_BYTES, RecordError, parse_record};
use crate::rules::RuleSet;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error("{file}: record {index} (byte offset {offset}): {error}")]
    Record {
        file: String,
        index: u64,
        offset: u64,
        error: RecordError,
    },
    #[error("{file}: {error}")]
    Io { file: String, error: io::Error },
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OfflineSummary {
    pub history: u64,
    pub scored: u64,
    pub flagged_by_rule: Vec<u64>,
}

/// Calls `each` with every record of `input`, in order.
pub fn for_each_record(
    input: impl Read,
    file: &str,
    mut each: impl FnMut(u64, &[u8]) -> Result<(), OfflineError>,
) -> Result<(), OfflineError> {
    let mut reader = BufReader::with_capacity(1 << 20, input);
    let mut index = 0u64;
    loop {
        let buffer = reader.fill_buf().map_err(|error| OfflineError::Io {
            file: file.into(),
            error,
        })?;
        if buffer.is_empty() {
            return Ok(());
        }
        if buffer.len() < RECORD_BYTES {
            let mut record = Vec::with_capacity(RECORD_BYTES);
            reader
                .by_ref()
                .take(RECORD_BYTES as u64)
                .read_to_end(&mut record)
                .map_err(|error| OfflineError::Io {
                    file: file.into(),
                    error,
                })?;
            if record.len() < RECORD_BYTES {
                return Err(OfflineError::Record {
                    file: file.into(),
                    index,
                    offset: index * RECORD_BYTES as u64,
                    error: RecordError::WrongLength(record.len()),
                });
            }
            each(index, &record)?;
            index += 1;
            continue;
        }
        let whole = buffer.len() / RECORD_BYTES * RECORD_BYTES;
        for record in buffer[..whole].chunks(RECORD_BYTES) {
            each(index, record)?;
            index += 1;
        }
        reader.consume(whole);
    }
}

/// Loads `history`, then scores `txns` in order, writing `seq,card,fraud,rule` lines to `out`.
/// A malformed record stops the run with its position: offline input is expected to be clean.
pub fn score_files(
    history: impl Read,
    txns: impl Read,
    out: impl Write,
    rules: &dyn RuleSet,
    entries_per_card_max: usize,
) -> Result<OfflineSummary, OfflineError> {
    let mut store = HistoryStore::new(entries_per_card_max);
    let mut summary = OfflineSummary {
        flagged_by_rule: vec![0; usize::from(rules.rule_count()) + 1],
        ..OfflineSummary::default()
    };
    let parse = |file: &str, index: u64, record: &[u8]| {
        parse_record(record).map_err(|error| OfflineError::Record {
            file: file.into(),
            index,
            offset: index * RECORD_BYTES as u64,
            error,
        })
    };
    for_each_record(history, "history", |index, record| {
        store.store(&parse("history", index, record)?, UNSCORED);
        summary.history += 1;
        Ok(())
    })?;
    let mut out = BufWriter::new(out);
    let io_error = |error| OfflineError::Io {
        file: "output".into(),
        error,
    };
    writeln!(out, "seq,card,fraud,rule").map_err(io_error)?;
    let mut window = Vec::new();
    for_each_record(txns, "transactions", |index, record| {
        let txn = parse("transactions", index, record)?;
        let rule = store.score_and_store(&txn, rules, &mut window);
        summary.flagged_by_rule[usize::from(rule)] += 1;
        summary.scored += 1;
        writeln!(
            out,
            "{index},{:014},{},{rule}",
            txn.card,
            u8::from(rule != 0)
        )
        .map_err(io_error)
    })?;
    out.flush().map_err(io_error)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generator::{HistoryGenerator, Seeds, TxnGenerator};
    use crate::rules::CaseStudyRules;

    #[test]
    fn scores_generated_files_in_input_order() {
        let now_ms = 1_800_000_000_000;
        let mut history = Vec::new();
        for txn in HistoryGenerator::new(&Seeds::default(), 100, 20, now_ms) {
            txn.write_record(&mut history);
        }
        let mut txns = Vec::new();
        let mut generator = TxnGenerator::new(&Seeds::default(), 100);
        for i in 0..300 {
            generator.next_txn(now_ms + i).write_record(&mut txns);
        }
        let mut out = Vec::new();
        let summary = score_files(
            history.as_slice(),
            txns.as_slice(),
            &mut out,
            &CaseStudyRules,
            32,
        )
        .unwrap();
        assert_eq!((summary.history, summary.scored), (2000, 300));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "seq,card,fraud,rule");
        assert_eq!(lines.len(), 301);
        let flagged = lines[1..]
            .iter()
            .filter(|l| l.split(',').nth(2) == Some("1"))
            .count() as u64;
        assert_eq!(flagged, summary.scored - summary.flagged_by_rule[0]);
        assert!(lines[1].starts_with("0,000000000000"));
        // Rule 36 flags nearly everything against a real 20-entry history (specs/fraud.md §4 notes).
        assert!(
            summary.flagged_by_rule[36] > 200,
            "{:?}",
            summary.flagged_by_rule
        );
    }

    #[test]
    fn a_malformed_record_names_its_position() {
        let mut txns = vec![0u8; RECORD_BYTES];
        txns[99] = b'\n';
        let error =
            score_files(&[][..], txns.as_slice(), io::sink(), &CaseStudyRules, 32).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("transactions: record 0 (byte offset 0)"),
            "{error}"
        );
    }
}
