//! `tiermem pheap info|verify|rm`: the checkpoint files of persistent heaps (`tiermem-pheap`).
//!
//! `info` and `verify` are read-only (`tiermem_pheap::inspect`): the pool is opened read-only,
//! the views are not mapped and a committed redo log is reported, not replayed.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tiermem_pheap::inspect::{inspect, LogState, Report};

/// pheap subcommands.
#[derive(Subcommand)]
pub enum PheapCommand {
    /// Describe a heap's checkpoint file: header, epoch, capacity, views and their addresses,
    /// objects, named objects, bytes in use (read-only). Fails when the file is inconsistent.
    Info {
        /// The heap's checkpoint file (the path given to nvh_open).
        path: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Check a heap's checkpoint image for internal consistency: both header copies, the
    /// metadata journal CRC, the object table (within bounds, slot classes, non-overlapping,
    /// unique names), the redo log (empty, or committed with a valid CRC and in-range records)
    /// and every checkpointed object's bytes against their CRC-32. Read-only. Exit status: 0
    /// all good; 1 on any problem (the heap cannot be opened) and also on a warning (it opens,
    /// but one header copy is damaged: "WARNING" lines; in --json `ok` is true, `clean` false).
    Verify {
        /// The heap's checkpoint file.
        path: PathBuf,
        /// Print one JSON object (`ok`, `problems`, `notes`, ...).
        #[arg(long)]
        json: bool,
    },
    /// Remove a heap's checkpoint file (refuses a file that is not a persistent heap unless
    /// --force).
    Rm {
        /// The heap's checkpoint file.
        path: PathBuf,
        /// Remove it even when it is not recognised as a persistent heap.
        #[arg(long)]
        force: bool,
    },
}

/// Run one pheap subcommand.
pub fn run(cmd: PheapCommand) -> Result<()> {
    match cmd {
        PheapCommand::Info { path, json } => info(&path, json),
        PheapCommand::Verify { path, json } => verify(&path, json),
        PheapCommand::Rm { path, force } => rm(&path, force),
    }
}

fn load(path: &Path) -> Result<Report> {
    inspect(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn copy_json(r: &Report, i: usize) -> Value {
    match &r.copies[i].header {
        Ok(h) => json!({"copy": if i == 0 { "A" } else { "B" }, "valid": true, "seq": h.seq,
                        "epoch": h.epoch, "log_len": h.log_len}),
        Err(e) => json!({"copy": if i == 0 { "A" } else { "B" }, "valid": false, "error": e}),
    }
}

fn log_json(l: Option<LogState>) -> Value {
    match l {
        None => Value::Null,
        Some(LogState::Empty) => json!({"state": "empty"}),
        Some(LogState::Committed { records, bytes }) => {
            json!({"state": "committed", "records": records, "bytes": bytes})
        }
    }
}

fn report_json(r: &Report) -> Value {
    let h = r.header;
    let mut names: Vec<Value> = r
        .objects
        .iter()
        .filter_map(|(off, o)| {
            o.name
                .as_ref()
                .map(|n| json!({"name": n, "offset": off, "size": o.size}))
        })
        .collect();
    names.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    json!({
        "path": r.path,
        "ok": r.problems.is_empty(),
        "clean": r.problems.is_empty() && r.warnings.is_empty(),
        "warnings": r.warnings,
        "checksummed_pages": r.checksummed_pages,
        "file_size": r.file_size,
        "header_copies": [copy_json(r, 0), copy_json(r, 1)],
        "active_copy": r.active_copy.map(|i| if i == 0 { "A" } else { "B" }),
        "version": h.map(|h| h.version),
        "epoch": h.map(|h| h.epoch),
        "seq": h.map(|h| h.seq),
        "capacity": h.map(|h| h.capacity),
        "sb_size": h.map(|h| h.sb_size),
        "views": h.map(|h| h.views),
        "lib_view": h.map(|h| format!("{:#x}", h.lib_base)),
        "user_views": h.map(|h| h.view_base[..(h.views as usize).min(8)]
            .iter().map(|b| format!("{b:#x}")).collect::<Vec<_>>()),
        "meta_area": h.map(|h| h.meta_active),
        "meta_len": h.map(|h| h.meta_len),
        "log": log_json(r.log),
        "objects": r.objects.len(),
        "named_objects": r.named(),
        "names": names,
        "bytes_in_use": r.bytes_in_use(),
        "slot_bytes": r.slot_bytes(),
        "pages_in_use": r.pages_in_use,
        "problems": r.problems,
        "notes": r.notes,
    })
}

fn print_problems(r: &Report) {
    for n in &r.notes {
        println!("note: {n}");
    }
    for w in &r.warnings {
        println!("WARNING: {w}");
    }
    for p in &r.problems {
        println!("PROBLEM: {p}");
    }
}

fn info(path: &Path, as_json: bool) -> Result<()> {
    let r = load(path)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report_json(&r))?);
    } else {
        println!("heap       {}", r.path.display());
        println!("file size  {} bytes", r.file_size);
        if let Some(h) = r.header {
            let copy = if r.active_copy == Some(0) { 'A' } else { 'B' };
            println!(
                "header     version {}, copy {copy} in force (seq {})",
                h.version, h.seq
            );
            println!("epoch      {} complete checkpoints", h.epoch);
            println!(
                "capacity   {} bytes ({} MiB), superblocks of {} KiB",
                h.capacity,
                h.capacity >> 20,
                h.sb_size >> 10
            );
            let mode = if h.views == 1 {
                "PGCK: whole pages"
            } else {
                "FGCK: object parts"
            };
            println!("views      {} user views ({mode})", h.views);
            println!("  library  {:#x}", h.lib_base);
            for (i, b) in h.view_base[..(h.views as usize).min(8)].iter().enumerate() {
                println!("  user {i}   {b:#x}");
            }
            match r.log {
                Some(LogState::Empty) => println!("redo log   empty"),
                Some(LogState::Committed { records, bytes }) => {
                    println!("redo log   committed, not applied: {records} records, {bytes} bytes")
                }
                None => {}
            }
        }
        println!(
            "objects    {} ({} named), {} bytes in use ({} in slots), {} pages in use",
            r.objects.len(),
            r.named(),
            r.bytes_in_use(),
            r.slot_bytes(),
            r.pages_in_use
        );
        let mut named: Vec<_> = r
            .objects
            .iter()
            .filter_map(|(off, o)| o.name.as_ref().map(|n| (n, *off, o.size)))
            .collect();
        named.sort();
        for (n, off, size) in named {
            println!("  {n:<24} offset {off:#x}, {size} bytes");
        }
        print_problems(&r);
    }
    if !r.problems.is_empty() {
        bail!(
            "{}: {} problem(s): {}",
            path.display(),
            r.problems.len(),
            r.problems.join("; ")
        );
    }
    Ok(())
}

fn verify(path: &Path, as_json: bool) -> Result<()> {
    let r = load(path)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report_json(&r))?);
    } else {
        for i in 0..2 {
            let c = if i == 0 { 'A' } else { 'B' };
            match &r.copies[i].header {
                Ok(h) => println!("header copy {c}: valid (seq {}, epoch {})", h.seq, h.epoch),
                Err(e) => println!("header copy {c}: INVALID ({e})"),
            }
        }
        if r.header.is_some() && r.problems.is_empty() {
            println!(
                "metadata journal: CRC ok; object table: {} objects within bounds, no overlaps",
                r.objects.len()
            );
            println!(
                "checkpoint image: the live bytes of {} pages match their CRC-32",
                r.checksummed_pages
            );
            match r.log {
                Some(LogState::Empty) => println!("redo log: empty (last checkpoint applied)"),
                Some(LogState::Committed { records, bytes }) => println!(
                    "redo log: committed, {records} records / {bytes} bytes, CRC ok (replayed on next open)"
                ),
                None => {}
            }
        }
        print_problems(&r);
    }
    if !r.problems.is_empty() {
        bail!(
            "{}: checkpoint image is inconsistent: {}",
            path.display(),
            r.problems.join("; ")
        );
    }
    if !r.warnings.is_empty() {
        bail!(
            "{}: the heap opens to its last checkpoint, but it is damaged: {}",
            path.display(),
            r.warnings.join("; ")
        );
    }
    if !as_json {
        println!("OK: {} is consistent", path.display());
    }
    Ok(())
}

fn rm(path: &Path, force: bool) -> Result<()> {
    if !path.exists() {
        bail!("{}: no such file", path.display());
    }
    if !force {
        let r = load(path).with_context(|| "not removed (use --force to remove it anyway)")?;
        if r.header.is_none() {
            bail!(
                "{}: not recognised as a persistent heap ({}); not removed (use --force)",
                path.display(),
                r.problems.join("; ")
            );
        }
    }
    std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    println!("removed {}", path.display());
    Ok(())
}
