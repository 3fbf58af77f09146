//! Tour step `pheap`: an unmodified `sqlite3 :memory:` whose whole heap lives in a persistent
//! heap (`LD_PRELOAD=libtiermem_pheap_preload.so`) with incremental checkpoints every 2000
//! allocator calls and at exit; its output must equal a run without the library, and the
//! checkpoint file it leaves must pass `tiermem pheap verify`. Skipped when sqlite3 or the
//! preload library (built next to the `tiermem` binary) is missing.

use super::{which, Ctx, Outcome};
use anyhow::{ensure, Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// The library's file name; the tour looks for it next to the `tiermem` binary
/// (`target/release/` after the build).
const PRELOAD: &str = "libtiermem_pheap_preload.so";

/// What sqlite3 runs: tables, an index, updates, deletes and aggregates that exercise malloc,
/// realloc and free; the last queries print results that depend on all of it.
const SCRIPT: &str = "\
CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, note TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 12000)
INSERT INTO item SELECT i, 'item-' || ((i * 4099) % 12000), (i * 17) % 250, substr(hex(randomblob(40)), 1, i % 80) FROM n;
CREATE INDEX item_name ON item(name);
UPDATE item SET qty = qty * 2 WHERE id % 7 = 0;
DELETE FROM item WHERE id % 13 = 0;
CREATE TABLE totals AS SELECT qty % 10 AS bucket, count(*) AS n, sum(qty) AS s FROM item GROUP BY bucket;
SELECT count(*), sum(qty), min(name), max(name), sum(length(note)) FROM item;
SELECT bucket, n, s FROM totals ORDER BY bucket;
SELECT name, qty FROM item WHERE name BETWEEN 'item-100' AND 'item-1005' ORDER BY name;
";

/// Run the step; the heap file and the stats file are removed before it returns.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    let Some(sqlite3) = which("sqlite3") else {
        return Ok(Outcome::Skipped(
            "sqlite3 is not installed (Debian package sqlite3; scripts/setup.sh installs it)"
                .into(),
        ));
    };
    let lib = match ctx.exe.parent() {
        Some(d) => d.join(PRELOAD),
        None => return Ok(Outcome::Skipped(format!("{PRELOAD} not found"))),
    };
    if !lib.is_file() {
        return Ok(Outcome::Skipped(format!(
            "{} is not built (cargo build --release -p tiermem-pheap-preload)",
            lib.display()
        )));
    }
    let heap = ctx.file("sqlite3.heap");
    let stats = ctx.file("sqlite3-stats.json");
    let _cleanup = super::RemoveOnDrop::files(&[&heap, &stats]);

    // randomblob's bytes differ between runs, but the script prints only lengths: the output
    // of a run without the library is the reference.
    let plain = sqlite(&sqlite3, &[])?;
    let t = Instant::now();
    let preloaded = sqlite(
        &sqlite3,
        &[
            ("LD_PRELOAD", lib.as_os_str()),
            ("TIERMEM_PHEAP_PATH", heap.as_os_str()),
            ("TIERMEM_PHEAP_CAPACITY", "32M".as_ref()),
            ("TIERMEM_PHEAP_VIEWS", "2".as_ref()),
            ("TIERMEM_CKPT_CALLS", "2000".as_ref()),
            ("TIERMEM_PHEAP_STATS", stats.as_os_str()),
        ],
    )?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    ensure!(
        preloaded == plain,
        "sqlite3 printed something else under the preload library:\n{preloaded}\nwithout it:\n{plain}"
    );
    let text = std::fs::read_to_string(&stats)
        .with_context(|| format!("the library wrote no stats file {}", stats.display()))?;
    let s: serde_json::Value = serde_json::from_str(&text).context("the library's stats file")?;
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    ensure!(
        n("allocs") > 0 && n("checkpoints") >= 2 && n("bytes_copied") > 0,
        "sqlite3 ran but the heap was not used or not checkpointed: {text}"
    );
    ensure!(
        n("fallback_allocs") == 0,
        "the persistent heap was too small ({} allocations went to glibc)",
        n("fallback_allocs")
    );
    say!(
        "sqlite3 :memory: under LD_PRELOAD={PRELOAD} ({ms:.0} ms): output identical to a plain run; {} allocations in the persistent heap, {} incremental checkpoints (2 views, every 2000 allocator calls and at exit) copied {:.1} MiB",
        n("allocs"),
        n("checkpoints"),
        n("bytes_copied") as f64 / (1u64 << 20) as f64
    );

    let out = Command::new(&ctx.exe)
        .args(["pheap", "verify", "--json"])
        .arg(&heap)
        .stdin(Stdio::null())
        .output()
        .context("running tiermem pheap verify")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "tiermem pheap verify printed no JSON ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    ensure!(
        out.status.success() && v["ok"] == true && v["clean"] == true,
        "tiermem pheap verify {} found problems: {}",
        heap.display(),
        v["problems"]
    );
    say!(
        "tiermem pheap verify {}: both header copies valid, epoch {}, {} objects, {} checkpointed chunks match their CRC-32, redo log {}",
        heap.display(),
        v["epoch"],
        v["objects"],
        v["checksummed_chunks"],
        v["log"]["state"].as_str().unwrap_or("?")
    );
    Ok(Outcome::Ok(format!(
        "unmodified sqlite3 ran on a persistent heap ({} checkpoints, same output as without it); `tiermem pheap verify` found the checkpoint consistent",
        n("checkpoints")
    )))
}

/// sqlite3 on `:memory:` running [`SCRIPT`] with `env` added; its stdout.
fn sqlite(sqlite3: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Result<String> {
    let mut c = Command::new(sqlite3);
    c.arg(":memory:")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().context("starting sqlite3")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(SCRIPT.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success() && out.stderr.is_empty(),
        "sqlite3 failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
