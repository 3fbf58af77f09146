//! Snapshots of the volatile engine's heap: Redis's RDB persistence for tiermem-kv — `SAVE`,
//! `BGSAVE`, `LASTSAVE`, `save` points, `dir`/`dbfilename`, `snapshot-method`, the load at
//! start and the INFO persistence figures.
//!
//! The heap is one [`Memory`]; a snapshot of it is a `tiermem-snapshot` file (the heap's pages
//! with frames, and [`APP_MAGIC`] as application state). Where Redis forks, BGSAVE takes the
//! engine-wide write lock only for the snapshot's pause ([`begin_paused_owned`]: for `wp` the
//! scan and the write protection, for the fork methods the fork); the dump then runs while
//! commands go on, and a thread waits for it. SAVE holds the write lock to the end, as Redis
//! blocks. The point in time is a moment when no transaction is open: the file holds exactly
//! the writes committed before it, so a restart serves a prefix of every connection's writes.
//!
//! The file is written under a temporary name and renamed over `dir/dbfilename` only when
//! complete and durable: a failed or interrupted snapshot (kill -9 of the server or of a fork
//! child, a full disk) leaves the previous one, and a failure is reported in INFO
//! (`rdb_last_bgsave_status:err`, `snapshot_last_error`) and the log.

use crate::config::parse_size;
use parking_lot::{Mutex, RwLock};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tiermem_snapshot::{
    begin, begin_paused_owned, Memory, Method, Options, Report, SnapshotFile, Target,
};

/// The application state of a tiermem-kv snapshot: names what the one region holds.
pub const APP_MAGIC: &[u8] = b"tiermem-kv volatile heap v1";

/// The default `dbfilename` (not `dump.rdb`: the file is not in Redis's RDB format).
pub const DEFAULT_DBFILENAME: &str = "dump.tmsnap";

/// The refusal of a save while another runs (Redis's text).
const BUSY: &str = "ERR Background save already in progress";

/// Seconds before a save point retries after a failed background save (Redis's
/// `CONFIG_BGSAVE_RETRY_DELAY`).
const RETRY_AFTER_FAILURE_S: u64 = 5;

/// Where and how snapshots are taken (config keys `dir`, `dbfilename`, `snapshot-method`,
/// `snapshot-target`, `snapshot-staging-slots`, `save`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSettings {
    /// The directory of the snapshot file.
    pub dir: PathBuf,
    /// The file's name in `dir`.
    pub dbfilename: String,
    /// `wp`, `fork-mdc` or `fork`.
    pub method: Method,
    /// A file (`file`) or an NVM pool file (`nvm-pool`) at `dir/dbfilename`.
    pub target: Target,
    /// Staging slots of the `wp` method (0..=64).
    pub staging_slots: usize,
    /// `save` points: (seconds, changes): a background save starts when at least `changes`
    /// writes happened and `seconds` passed since the last save. Empty: none.
    pub save_points: Vec<(u64, u64)>,
}

impl SnapshotSettings {
    /// The snapshot file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.dbfilename)
    }
}

/// Parses a `save` value: empty (no points) or pairs `seconds changes`, blank-separated.
pub fn parse_save_points(v: &str) -> Option<Vec<(u64, u64)>> {
    let w: Vec<&str> = v.split_ascii_whitespace().collect();
    if w.len() % 2 != 0 {
        return None;
    }
    w.chunks(2)
        .map(|c| Some((c[0].parse().ok()?, c[1].parse().ok()?)))
        .collect()
}

/// The `save` value of `points`, as CONFIG GET shows it.
pub fn format_save_points(points: &[(u64, u64)]) -> String {
    points
        .iter()
        .map(|(s, c)| format!("{s} {c}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Checks one snapshot setting's value; `Ok(None)` if `key` is not one.
pub fn check_setting(key: &str, value: &str) -> Result<Option<()>, String> {
    match key {
        "dbfilename" => {
            if value.is_empty() || value.contains('/') {
                return Err(format!(
                    "bad value for 'dbfilename': '{value}' (expected a file name, no '/')"
                ));
            }
        }
        "snapshot-method" => {
            Method::parse(value).ok_or_else(|| {
                format!(
                    "bad value for 'snapshot-method': '{value}' (expected wp, fork-mdc or fork)"
                )
            })?;
        }
        "snapshot-target" => {
            Target::parse(value).ok_or_else(|| {
                format!("bad value for 'snapshot-target': '{value}' (expected file or nvm-pool)")
            })?;
        }
        "snapshot-staging-slots" => {
            parse_size(value)
                .filter(|&n| n <= tiermem_snapshot::MAX_SLOTS as u64)
                .ok_or_else(|| {
                    format!(
                        "bad value for 'snapshot-staging-slots': '{value}' (expected 0 to {})",
                        tiermem_snapshot::MAX_SLOTS
                    )
                })?;
        }
        "save" => {
            parse_save_points(value).ok_or_else(|| {
                format!(
                    "bad value for 'save': '{value}' (expected \"\" or pairs of seconds and \
                     changes, e.g. \"3600 1 300 100\")"
                )
            })?;
        }
        _ => return Ok(None),
    }
    Ok(Some(()))
}

#[derive(Debug)]
struct State {
    /// Unix time of the last successful save (or of the start).
    last_save_unix: u64,
    last_ok: bool,
    last_error: Option<String>,
    /// Seconds the last background save took (-1: none yet).
    last_bgsave_secs: i64,
    /// The running save's start.
    started: Option<Instant>,
    /// When a save was last started (for the retry delay after a failure).
    last_try: Option<Instant>,
    saves: u64,
    last: Option<(Method, Report)>,
    child_pid: Option<u32>,
}

/// What loading a snapshot at start did.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// The file.
    pub path: PathBuf,
    /// Its heap's length (the heap is made this long).
    pub heap_bytes: u64,
    /// Pages it stored.
    pub present_pages: u64,
    /// How it was taken.
    pub method: Method,
    /// Time to check and copy it in.
    pub millis: f64,
}

/// The heap length a snapshot at `path` holds: `Ok(None)` when there is no file, an error
/// naming the failed check when it is not a tiermem-kv snapshot.
pub fn snapshot_heap_len(path: &Path) -> Result<Option<u64>, String> {
    if !path.exists() {
        return Ok(None);
    }
    let f = SnapshotFile::open(path).map_err(|e| e.to_string())?;
    check_file(&f, path).map(Some)
}

fn check_file(f: &SnapshotFile, path: &Path) -> Result<u64, String> {
    let regions = f.layout().regions();
    if regions.len() != 1 || regions[0].name != "heap" {
        return Err(format!(
            "{}: a snapshot, but not of a tiermem-kv heap (regions {:?})",
            path.display(),
            regions.iter().map(|r| &r.name).collect::<Vec<_>>()
        ));
    }
    let app = f.app_state().map_err(|e| e.to_string())?;
    if app != APP_MAGIC {
        return Err(format!(
            "{}: a snapshot, but not of a tiermem-kv heap (application state {:?})",
            path.display(),
            String::from_utf8_lossy(&app[..app.len().min(64)])
        ));
    }
    Ok(regions[0].len)
}

/// Loads the snapshot at `path` into `mem` (fresh, all zeros, as long as the snapshot's heap):
/// every check of the file and every unit's CRC pass before the bytes are used.
pub fn load(path: &Path, mem: &Memory) -> Result<LoadReport, String> {
    let t0 = Instant::now();
    let f = SnapshotFile::open(path).map_err(|e| e.to_string())?;
    let len = check_file(&f, path)?;
    if len != mem.len() as u64 {
        return Err(format!(
            "{}: the snapshot's heap is {len} bytes, the memory {}",
            path.display(),
            mem.len()
        ));
    }
    // SAFETY: the memory is the caller's fresh heap, not yet shared with anything; `len`
    // bytes from its start.
    let dst = unsafe { std::slice::from_raw_parts_mut(mem.as_ptr(), mem.len()) };
    f.restore_into_zeroed(0, dst).map_err(|e| e.to_string())?;
    let info = f.info();
    Ok(LoadReport {
        path: path.to_path_buf(),
        heap_bytes: len,
        present_pages: info.present_pages,
        method: info.method,
        millis: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Removes temporary files of snapshots that never finished (`NAME.tmp-<uuid>` beside
/// `path`); returns their names.
pub fn remove_stale_temporaries(path: &Path) -> Vec<String> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.tmp-", name.to_string_lossy());
    let mut gone = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&prefix) && std::fs::remove_file(e.path()).is_ok() {
                gone.push(n);
            }
        }
    }
    gone
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Snapshots of one heap (see the module doc).
pub struct Persistence {
    mem: Arc<Memory>,
    settings: Mutex<SnapshotSettings>,
    state: Mutex<State>,
    in_progress: AtomicBool,
    /// The change counter at the point in time of the last good snapshot (or the load).
    changes_saved: AtomicU64,
}

impl Persistence {
    /// Snapshots of `mem` as `settings` say.
    pub fn new(mem: Arc<Memory>, settings: SnapshotSettings) -> Persistence {
        Persistence {
            mem,
            settings: Mutex::new(settings),
            state: Mutex::new(State {
                last_save_unix: now_unix(),
                last_ok: true,
                last_error: None,
                last_bgsave_secs: -1,
                started: None,
                last_try: None,
                saves: 0,
                last: None,
                child_pid: None,
            }),
            in_progress: AtomicBool::new(false),
            changes_saved: AtomicU64::new(0),
        }
    }

    /// The settings now.
    pub fn settings(&self) -> SnapshotSettings {
        self.settings.lock().clone()
    }

    /// CONFIG SET of a snapshot key (`dbfilename`, `snapshot-method`, `snapshot-target`,
    /// `snapshot-staging-slots`, `save`); `Ok(false)` if `key` is not one. Takes effect at
    /// the next snapshot.
    pub fn set(&self, key: &str, value: &str) -> Result<bool, String> {
        if check_setting(key, value)?.is_none() {
            return Ok(false);
        }
        let mut s = self.settings.lock();
        match key {
            "dbfilename" => s.dbfilename = value.to_string(),
            "snapshot-method" => s.method = Method::parse(value).expect("checked"),
            "snapshot-target" => s.target = Target::parse(value).expect("checked"),
            "snapshot-staging-slots" => {
                s.staging_slots = parse_size(value).expect("checked") as usize
            }
            "save" => s.save_points = parse_save_points(value).expect("checked"),
            _ => unreachable!("check_setting knows the same keys"),
        }
        Ok(true)
    }

    /// CONFIG GET's value of a snapshot key (`dir` too), `None` for other keys.
    pub fn get(&self, key: &str) -> Option<String> {
        let s = self.settings.lock();
        Some(match key {
            "dir" => s.dir.display().to_string(),
            "dbfilename" => s.dbfilename.clone(),
            "snapshot-method" => s.method.name().to_string(),
            "snapshot-target" => s.target.name().to_string(),
            "snapshot-staging-slots" => s.staging_slots.to_string(),
            "save" => format_save_points(&s.save_points),
            _ => return None,
        })
    }

    /// Whether a snapshot is being taken.
    pub fn in_progress(&self) -> bool {
        self.in_progress.load(SeqCst)
    }

    /// Unix time of the last successful save (LASTSAVE).
    pub fn last_save(&self) -> u64 {
        self.state.lock().last_save_unix
    }

    /// Records a load at start: the data equals the file, so nothing is unsaved.
    pub fn loaded(&self, changes_now: u64) {
        self.changes_saved.store(changes_now, SeqCst);
    }

    /// Writes since the last good snapshot's point in time.
    pub fn changes_since_save(&self, changes_now: u64) -> u64 {
        changes_now.saturating_sub(self.changes_saved.load(SeqCst))
    }

    fn options(s: &SnapshotSettings) -> Options {
        Options {
            staging_slots: s.staging_slots,
            method: s.method,
            target: s.target,
        }
    }

    fn claim(&self) -> Result<(), String> {
        if self.in_progress.swap(true, SeqCst) {
            return Err(BUSY.into());
        }
        // The directory is made on first use (the default one may not exist yet).
        let dir = self.settings.lock().dir.clone();
        if let Err(e) = std::fs::create_dir_all(&dir) {
            self.in_progress.store(false, SeqCst);
            return Err(format!(
                "ERR creating the snapshot directory {}: {e}",
                dir.display()
            ));
        }
        let mut st = self.state.lock();
        st.started = Some(Instant::now());
        st.last_try = Some(Instant::now());
        Ok(())
    }

    fn finish(&self, res: Result<Report, String>, method: Method, changes_at: u64, bg: bool) {
        let mut st = self.state.lock();
        let took = st.started.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
        st.child_pid = None;
        match res {
            Ok(rep) => {
                eprintln!(
                    "tiermem-kv: {} saved to {}: {} MiB in {:.0} ms (pause {:.2} ms, method {})",
                    if bg {
                        "background snapshot"
                    } else {
                        "snapshot"
                    },
                    self.settings.lock().path().display(),
                    rep.file_bytes >> 20,
                    rep.total.as_secs_f64() * 1e3,
                    rep.pause.as_secs_f64() * 1e3,
                    method.name()
                );
                st.last_ok = true;
                st.last_error = None;
                st.last_save_unix = now_unix();
                st.saves += 1;
                st.last = Some((method, rep));
                self.changes_saved.store(changes_at, SeqCst);
            }
            Err(e) => {
                eprintln!("tiermem-kv: snapshot failed: {e}");
                st.last_ok = false;
                st.last_error = Some(e);
            }
        }
        if bg {
            st.last_bgsave_secs = took.round() as i64;
        }
        drop(st);
        self.in_progress.store(false, SeqCst);
    }

    /// BGSAVE: pauses the writers (`lock`, exclusively) only for the snapshot's pause, then
    /// dumps in the background; `changes` is the write counter (read in the pause). Returns
    /// once the point in time is fixed, or the reason it could not be (a save in progress, a
    /// full disk, ...: nothing is left protected or half-written then).
    pub fn bgsave(self: &Arc<Self>, lock: &RwLock<()>, changes: &AtomicU64) -> Result<(), String> {
        self.claim()?;
        let s = self.settings();
        let mut at = 0;
        let job = begin_paused_owned(
            std::slice::from_ref(&self.mem),
            &s.path(),
            APP_MAGIC.to_vec(),
            Self::options(&s),
            || {
                let g = lock.write();
                at = changes.load(SeqCst);
                g
            },
        );
        let job = match job {
            Ok(j) => j,
            Err(e) => {
                let e = e.to_string();
                self.finish(Err(e.clone()), s.method, 0, true);
                return Err(format!("ERR {e}"));
            }
        };
        self.state.lock().child_pid = job.child_pid();
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("kv-bgsave".into())
            .spawn(move || {
                let r = job.wait().map_err(|e| e.to_string());
                me.finish(r, s.method, at, true);
            });
        if let Err(e) = spawned {
            // The job was moved into the closure the failed spawn dropped: it aborted.
            self.finish(
                Err(format!("starting the save thread: {e}")),
                s.method,
                0,
                true,
            );
            return Err(format!("ERR starting the save thread: {e}"));
        }
        Ok(())
    }

    /// SAVE: the writers stay paused (`lock`, exclusively) until the file is complete.
    pub fn save(&self, lock: &RwLock<()>, changes: &AtomicU64) -> Result<(), String> {
        self.claim()?;
        let s = self.settings();
        let g = lock.write();
        let at = changes.load(SeqCst);
        let r = begin(
            &[&*self.mem],
            &s.path(),
            APP_MAGIC.to_vec(),
            Self::options(&s),
        )
        .and_then(|j| j.wait())
        .map_err(|e| e.to_string());
        drop(g);
        let out = r.as_ref().map(|_| ()).map_err(|e| format!("ERR {e}"));
        self.finish(r, s.method, at, false);
        out
    }

    /// SAVE at shutdown: waits for a save that is running (a BGSAVE, a save point) to end,
    /// then saves.
    pub fn save_after_running(&self, lock: &RwLock<()>, changes: &AtomicU64) -> Result<(), String> {
        loop {
            match self.save(lock, changes) {
                Err(e) if e == BUSY => std::thread::sleep(std::time::Duration::from_millis(5)),
                r => return r,
            }
        }
    }

    /// Whether a save point is due (for a timer): at least one point's seconds passed since
    /// the last save and its changes happened, no save runs, and a failed save is at least
    /// [`RETRY_AFTER_FAILURE_S`] old. Returns the point.
    pub fn due(&self, changes_now: u64) -> Option<(u64, u64)> {
        if self.in_progress() {
            return None;
        }
        let points = self.settings.lock().save_points.clone();
        if points.is_empty() {
            return None;
        }
        let st = self.state.lock();
        if !st.last_ok
            && st
                .last_try
                .is_some_and(|t| t.elapsed().as_secs() < RETRY_AFTER_FAILURE_S)
        {
            return None;
        }
        let elapsed = now_unix().saturating_sub(st.last_save_unix);
        let dirty = self.changes_since_save(changes_now);
        points
            .into_iter()
            .find(|&(secs, n)| dirty >= n && n > 0 && elapsed >= secs)
    }

    /// Whether SHUTDOWN (without NOSAVE) saves first: save points are configured.
    pub fn saves_on_shutdown(&self) -> bool {
        !self.settings.lock().save_points.is_empty()
    }

    /// INFO persistence's figures.
    pub fn info(&self, changes_now: u64, add: &mut dyn FnMut(&str, String)) {
        let st = self.state.lock();
        let s = self.settings.lock();
        add(
            "rdb_changes_since_last_save",
            self.changes_since_save(changes_now).to_string(),
        );
        add(
            "rdb_bgsave_in_progress",
            (self.in_progress() as u8).to_string(),
        );
        add("rdb_last_save_time", st.last_save_unix.to_string());
        add(
            "rdb_last_bgsave_status",
            if st.last_ok { "ok" } else { "err" }.into(),
        );
        add("rdb_last_bgsave_time_sec", st.last_bgsave_secs.to_string());
        add(
            "rdb_current_bgsave_time_sec",
            st.started
                .map_or(-1, |t| t.elapsed().as_secs() as i64)
                .to_string(),
        );
        add("rdb_saves", st.saves.to_string());
        add("snapshot_file", s.path().display().to_string());
        add("snapshot_method", s.method.name().into());
        add("snapshot_target", s.target.name().into());
        add("snapshot_staging_slots", s.staging_slots.to_string());
        add(
            "snapshot_extra_bytes_bound",
            Self::options(&s)
                .extra_bytes_bound(tiermem_snapshot::format::units_of(self.mem.len() as u64))
                .to_string(),
        );
        add(
            "snapshot_child_pid",
            st.child_pid.map_or(String::new(), |p| p.to_string()),
        );
        add(
            "snapshot_last_error",
            st.last_error.clone().unwrap_or_default(),
        );
        let (m, r) = match &st.last {
            Some((m, r)) => (m.name(), r.clone()),
            None => ("", Report::default()),
        };
        add("snapshot_last_method", m.into());
        add("snapshot_last_pause_us", r.pause.as_micros().to_string());
        add(
            "snapshot_last_ms",
            format!("{:.1}", r.total.as_secs_f64() * 1e3),
        );
        add("snapshot_last_file_bytes", r.file_bytes.to_string());
        add("snapshot_last_present_pages", r.present_pages.to_string());
        add("snapshot_last_staged_units", r.staged_units.to_string());
        add(
            "snapshot_last_self_written_units",
            r.self_written_units.to_string(),
        );
        add("snapshot_last_spilled_pages", r.spilled_pages.to_string());
        add("snapshot_write_faults", self.mem.faults().to_string());
    }

    /// INFO stats' `latest_fork_usec`: the last fork method's pause (0 otherwise).
    pub fn latest_fork_usec(&self) -> u64 {
        match &self.state.lock().last {
            Some((m, r)) if *m != Method::Wp => r.pause.as_micros() as u64,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_points_parse_like_redis() {
        assert_eq!(parse_save_points(""), Some(vec![]));
        assert_eq!(
            parse_save_points("3600 1 300 100"),
            Some(vec![(3600, 1), (300, 100)])
        );
        assert_eq!(parse_save_points("3600"), None);
        assert_eq!(parse_save_points("a 1"), None);
        assert_eq!(
            format_save_points(&[(3600, 1), (60, 10000)]),
            "3600 1 60 10000"
        );
        assert!(check_setting("dbfilename", "a/b").is_err());
        assert!(check_setting("snapshot-method", "cow").is_err());
        assert!(check_setting("snapshot-staging-slots", "65").is_err());
        assert_eq!(check_setting("port", "1"), Ok(None));
    }
}
