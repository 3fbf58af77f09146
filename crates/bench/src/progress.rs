//! Progress of long work on stderr, one mechanism for every benchmark and long command: an
//! `indicatif` bar (steps done out of the planned total, elapsed time, an estimate, the step
//! running) or a spinner when the total is unknown — drawn only when stderr is a terminal, so
//! nothing extra is printed into a pipe or a log, and never into `--json` output on stdout.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

/// The bar of the work in progress (one per process: a command runs one long job at a time).
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn shown() -> bool {
    std::io::stderr().is_terminal()
}

/// Start showing the progress of `what`, planned as `total` steps (each [`step`] is one; `None`:
/// unknown, a spinner). Replaces a bar already shown. Nothing is drawn when stderr is not a
/// terminal.
pub fn plan(what: &str, total: Option<u64>) {
    let mut g = BAR.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = g.take() {
        b.finish_and_clear();
    }
    if !shown() {
        return;
    }
    let bar = match total {
        Some(n) => {
            let b = ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:24}] {pos}/{len} {elapsed_precise} (eta {eta}) {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b
        }
        None => {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{prefix} {spinner} {pos} done, {elapsed_precise} {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b
        }
    };
    bar.set_prefix(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    *g = Some(bar);
}

/// One step of the planned work: `msg` becomes the step shown, the count of steps done grows by
/// one (the previous step is done). Without a plan, a spinner starts.
pub fn step(msg: &str) {
    if !shown() {
        return;
    }
    let mut g = BAR.lock().unwrap_or_else(|p| p.into_inner());
    let bar = g.get_or_insert_with(|| {
        let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} {wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    });
    if bar.message().is_empty() {
        bar.set_message(msg.to_string());
    } else {
        bar.inc(1);
        bar.set_message(msg.to_string());
    }
}

/// The planned work grew by `n` steps (a plan's total known only once some steps ran).
pub fn grow(n: u64) {
    if let Some(b) = BAR.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        b.inc_length(n);
    }
}

/// A line that must stay visible (a warning, a failed step): printed above the bar on a
/// terminal, and as a plain line on stderr otherwise.
pub fn note(msg: &str) {
    let g = BAR.lock().unwrap_or_else(|p| p.into_inner());
    match g.as_ref() {
        Some(b) => b.println(msg),
        None => eprintln!("{msg}"),
    }
}

/// The work is over: the bar disappears.
pub fn done() {
    if let Some(b) = BAR.lock().unwrap_or_else(|p| p.into_inner()).take() {
        b.finish_and_clear();
    }
}

/// The progress of a job shown while this lives: [`plan`] with an unknown total on creation,
/// [`done`] when dropped, however the job ends.
pub struct Shown(());

/// Show the progress of `what` until the returned guard is dropped (a spinner with the step
/// running, see [`step`], the steps done and the elapsed time).
pub fn show(what: &str) -> Shown {
    plan(what, None);
    Shown(())
}

impl Drop for Shown {
    fn drop(&mut self) {
        done();
    }
}
