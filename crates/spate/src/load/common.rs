//! What every load scenario and run shares: the key mix (`mix64`), the target's address, and writing a
//! report's JSON and SVG.

use anyhow::Context;
use spate_load::Report;

/// A 64-bit mix (splitmix64's finaliser): spreads keys reproducibly.
pub fn mix64(mut n: u64) -> u64 {
    n = (n ^ (n >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    n = (n ^ (n >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    n ^ (n >> 31)
}

pub fn host_port(target: &str) -> anyhow::Result<String> {
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("redis://"))
        .context("--target must start with http:// or redis:// (TLS is not supported)")?;
    Ok(rest.trim_end_matches('/').to_string())
}

pub fn write_outputs(report: &Report, out: &std::path::Path, stem: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(
        out.join(format!("{stem}.json")),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(
        out.join(format!("{stem}.svg")),
        spate_load::write_svg(report),
    )?;
    Ok(())
}
