//! Every fuzz target of `fuzz/` runs for a few seconds (`scripts/fuzz.sh`, which installs cargo-fuzz;
//! it needs the nightly toolchain), built for a short run (`SPATE_FUZZ_BUILD=smoke`: unoptimized,
//! without a sanitizer, since building is most of the time): a crash fails this test, and the input
//! that caused it is left in `fuzz/artifacts/<target>`. `SPATE_FUZZ_SECONDS` sets the time per target (default 5). Longer runs
//! and their findings: `docs/fuzzing.md`.

#[test]
fn every_fuzz_target_runs_without_a_crash() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let seconds = std::env::var("SPATE_FUZZ_SECONDS").unwrap_or_else(|_| "5".into());
    let status = std::process::Command::new("bash")
        .arg(root.join("scripts/fuzz.sh"))
        .arg(&seconds)
        .env("SPATE_FUZZ_BUILD", "smoke")
        .status()
        .expect("scripts/fuzz.sh runs");
    assert!(status.success(), "a fuzz target failed: {status}");
}
