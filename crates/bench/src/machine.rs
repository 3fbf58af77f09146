//! Facts about the machine a report was measured on, printed by every benchmark and by `doctor`.

use serde::Serialize;
use std::fs;

/// What a benchmark ran on: enough to tell two reports' machines apart.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub hypervisor: bool,
}

/// The running kernel's release string (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; uname fills it and we read NUL-terminated fields only.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// Describe this machine from /proc (no external commands).
pub fn describe() -> Machine {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let hypervisor = cpuinfo
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"));
    let memory_kib: u64 = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    Machine {
        kernel: kernel_release(),
        cpu_model,
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        memory_gib: (memory_kib as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0,
        hypervisor,
    }
}

impl Machine {
    /// One line for human-readable reports.
    pub fn one_line(&self) -> String {
        format!(
            "{} · {} CPUs · {:.1} GiB · Linux {}{}",
            self.cpu_model,
            self.cpus,
            self.memory_gib,
            self.kernel,
            if self.hypervisor { " · VM" } else { "" }
        )
    }
}
