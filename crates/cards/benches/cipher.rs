//! Card data's two ciphers on 1 MiB of data, one core: journal payloads (AES-256-GCM-SIV, deterministic)
//! and snapshot chunks (AES-256-GCM from ring, through `SealingWriter` and `OpeningReader`).
//! `cargo bench -p spate-fraud --bench cipher`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spate_cards::cipher::{CardCipher, KEY_BYTES, OpeningReader, SealingWriter};
use std::hint::black_box;
use std::io::{Read, Write};

const BYTES: usize = 1 << 20;

fn ciphers(c: &mut Criterion) {
    let cipher = CardCipher::new(&[7; KEY_BYTES]);
    // Bytes like a snapshot's: not all equal, so nothing is special about them.
    let plaintext: Vec<u8> = (0..BYTES as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut group = c.benchmark_group("fraud_cipher");
    group.throughput(Throughput::Bytes(BYTES as u64));

    group.bench_function("journal_payload_seal_gcm_siv_1MiB", |b| {
        b.iter(|| black_box(cipher.seal(&plaintext)))
    });
    let payload = cipher.seal(&plaintext);
    group.bench_function("journal_payload_open_gcm_siv_1MiB", |b| {
        b.iter(|| black_box(cipher.open(&payload).expect("opens")))
    });

    let mut snapshot = Vec::new();
    let mut writer = SealingWriter::new(&mut snapshot, &cipher);
    writer.write_all(&plaintext).expect("write to a Vec");
    writer.finish().expect("write to a Vec");
    let mut opened = vec![0; BYTES];
    group.bench_function("snapshot_chunk_open_gcm_1MiB", |b| {
        b.iter(|| {
            let mut source = snapshot.as_slice();
            OpeningReader::new(&mut source, &cipher)
                .read_exact(&mut opened)
                .expect("opens");
            black_box(&opened);
        })
    });
    let mut sealed = Vec::with_capacity(BYTES + 64);
    group.bench_function("snapshot_chunk_seal_gcm_1MiB", |b| {
        b.iter(|| {
            sealed.clear();
            let mut writer = SealingWriter::new(&mut sealed, &cipher);
            writer.write_all(&plaintext).expect("write to a Vec");
            writer.finish().expect("write to a Vec");
            black_box(&sealed);
        })
    });
    group.finish();
}

criterion_group!(benches, ciphers);
criterion_main!(benches);
