//! Latency control (NVSwap Ch. 4): the SSD queue size of Eq. 1, the device assignment of
//! Algorithm 1, and the per-process tail monitor.
//!
//! Once per window the evictor calls [`Controller::step`] with the window's SSD page-in tail
//! (`Lat_observed`) and every bounded tenant's own tail. Tenants are regions (a process's
//! regions share its bound). Algorithm 1 walks the bounds in ascending order, computing
//! `S(t+1) = (1-γ)·S(t) + γ·S(t)·ls_k/Lat_observed` for each; while that is below `S_min` the
//! tenant is moved to NS (served by the NVM buffer) and the walk goes on, else it stops. `S` is
//! clamped to `S_max`, and `S_reserve` slots are added for best-effort tenants. The monitor adds
//! to NS, for the next window, every tenant whose own tail exceeded its bound in this one.
//!
//! γ, `S_reserve` and the window are not given by the paper: 0.5, 4 and 1 s by default.
//!
//! Both aim below each bound, at `goal_frac` of it (0.9): the bound is a percentile of a whole
//! run, the controller sees one window at a time, and windows whose tails sit at the bound
//! leave the run's just over it (measured on the full bench run, goal = bound: 580.6 µs
//! against a 565.2 µs bound).

use std::time::Duration;

/// Parameters of the controller ([`crate::PagerOptions::control`]).
#[derive(Clone, Debug)]
pub struct ControlParams {
    /// Run the controller; off, the queue is fixed at `fixed_queue` and every page goes through
    /// the buffer when there is one (the paper's "without latency control").
    pub enabled: bool,
    /// Smoothing factor γ of Eq. 1 (0 < γ ≤ 1).
    pub gamma: f64,
    /// Smallest queue before tenants move to the buffer (the device's parallelism).
    pub s_min: usize,
    /// Largest queue (the paper's 1024).
    pub s_max: usize,
    /// Slots added for best-effort tenants.
    pub s_reserve: usize,
    /// Queue size with the controller off (Linux's default 128).
    pub fixed_queue: usize,
    /// Length of a control window.
    pub window: Duration,
    /// Fraction of each bound the controller aims at: Eq. 1's `Lat_goal` and the monitor's
    /// threshold (0 < goal_frac ≤ 1; 1 is the paper's).
    pub goal_frac: f64,
}

impl Default for ControlParams {
    fn default() -> Self {
        ControlParams {
            enabled: true,
            gamma: 0.5,
            s_min: 4,
            s_max: 1024,
            s_reserve: 4,
            fixed_queue: 128,
            window: Duration::from_secs(1),
            goal_frac: 0.9,
        }
    }
}

/// One bounded tenant as the controller sees it in a window.
#[derive(Clone, Copy, Debug)]
pub struct TenantWindow {
    /// Tenant id (the region key).
    pub id: u64,
    /// Its bound in ns.
    pub bound_ns: u64,
    /// Its observed tail in this window (its percentile), if it paged in at all.
    pub observed_ns: Option<u64>,
}

/// What a control step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Queue size for the next window, reserve included.
    pub queue: usize,
    /// Tenants served by the buffer in the next window (Algorithm 1's NS plus the monitor's).
    pub ns: Vec<u64>,
    /// Of those, the ones the monitor caught over their bound (their pages are prefetched).
    pub over: Vec<u64>,
}

/// Algorithm 1 on one window: `tenants` in any order, `s` the current core queue size (reserve
/// excluded), `observed` the window's SSD page-in tail. Returns the new core size and NS.
pub fn algorithm1(
    tenants: &[TenantWindow],
    s: f64,
    observed_ns: u64,
    p: &ControlParams,
) -> (f64, Vec<u64>) {
    let mut ls: Vec<&TenantWindow> = tenants.iter().collect();
    ls.sort_by_key(|t| t.bound_ns);
    let obs = observed_ns.max(1) as f64;
    let eq1 = |bound: u64| (1.0 - p.gamma) * s + p.gamma * s * goal(bound, p) / obs;
    let mut ns = Vec::new();
    let mut next = s;
    if ls.is_empty() {
        // No bound to hold: the queue may grow to its largest.
        next = (1.0 - p.gamma) * s + p.gamma * p.s_max as f64;
    }
    for t in ls {
        next = eq1(t.bound_ns);
        if next < p.s_min as f64 {
            ns.push(t.id);
        } else {
            break;
        }
    }
    (next.clamp(1.0, p.s_max as f64), ns)
}

/// The latency the controller aims at for `bound_ns`: `goal_frac` of it.
fn goal(bound_ns: u64, p: &ControlParams) -> f64 {
    let f = if p.goal_frac > 0.0 && p.goal_frac <= 1.0 {
        p.goal_frac
    } else {
        1.0
    };
    bound_ns as f64 * f
}

/// The controller's state across windows.
pub(crate) struct Controller {
    pub(crate) params: ControlParams,
    /// `S(t)` without the reserve.
    s_core: f64,
    /// Window counter.
    now: u64,
    /// Monitor holds: tenant → (NS until this window, hold length in windows).
    holds: std::collections::HashMap<u64, (u64, u64)>,
}

impl Controller {
    pub(crate) fn new(params: ControlParams) -> Controller {
        // Start where Linux does, at the default queue of 128.
        let s_core = params.fixed_queue as f64;
        Controller {
            params,
            s_core,
            now: 0,
            holds: std::collections::HashMap::new(),
        }
    }

    /// `S(t)` without the reserve.
    pub(crate) fn core(&self) -> f64 {
        self.s_core
    }

    /// Continues from `S(t) = s` (a pool's new leader), clamped to `[1, S_max]`.
    pub(crate) fn set_core(&mut self, s: f64) {
        if s.is_finite() {
            self.s_core = s.clamp(1.0, self.params.s_max as f64);
        }
    }

    /// Queue size now (reserve included).
    pub(crate) fn queue(&self) -> usize {
        if self.params.enabled {
            self.s_core.round() as usize + self.params.s_reserve
        } else {
            self.params.fixed_queue
        }
    }

    /// One window: Algorithm 1 (when the SSD served page-ins in it) and the monitor.
    pub(crate) fn step(&mut self, tenants: &[TenantWindow], ssd_observed: Option<u64>) -> Decision {
        if !self.params.enabled {
            return Decision {
                queue: self.queue(),
                ns: Vec::new(),
                over: Vec::new(),
            };
        }
        let mut ns = match ssd_observed {
            Some(obs) => {
                let (s, ns) = algorithm1(tenants, self.s_core, obs, &self.params);
                self.s_core = s;
                ns
            }
            None => Vec::new(),
        };
        self.now += 1;
        let over: Vec<u64> = tenants
            .iter()
            .filter(|t| {
                t.observed_ns
                    .is_some_and(|o| o as f64 > goal(t.bound_ns, &self.params))
            })
            .map(|t| t.id)
            .collect();
        // The paper's monitor serves an offender from the buffer in the next window only; then
        // it pages out to the SSD again, misses again, and oscillates (measured: half its
        // page-ins from the SSD). Here it is held in NS for `hold` windows, 4 at first, doubled
        // (up to 64) when it is caught again within two holds of its release.
        for &id in &over {
            let (until, hold) = self.holds.get(&id).copied().unwrap_or((0, 0));
            let hold = if hold > 0 && self.now <= until + 2 * hold {
                (hold * 2).min(64)
            } else {
                4
            };
            self.holds.insert(id, (self.now + hold, hold));
        }
        let now = self.now;
        self.holds.retain(|id, (until, hold)| {
            tenants.iter().any(|t| t.id == *id) && now <= *until + 2 * *hold
        });
        for (&id, &(until, _)) in &self.holds {
            if now <= until && !ns.contains(&id) {
                ns.push(id);
            }
        }
        Decision {
            queue: self.queue(),
            ns,
            over,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, bound_us: u64) -> TenantWindow {
        TenantWindow {
            id,
            bound_ns: bound_us * 1000,
            observed_ns: None,
        }
    }

    #[test]
    fn eq1_shrinks_the_queue_when_the_ssd_is_slower_than_the_goal() {
        let p = ControlParams {
            goal_frac: 1.0,
            ..ControlParams::default()
        };
        // Goal 300 µs, observed 600 µs: S → 0.5·S + 0.5·S·0.5 = 0.75·S.
        let (s, ns) = algorithm1(&[t(1, 300)], 100.0, 600_000, &p);
        assert!((s - 75.0).abs() < 1e-9, "{s}");
        assert!(ns.is_empty());
        // Observed below the goal: it grows, up to S_max.
        let (s, _) = algorithm1(&[t(1, 300)], 1000.0, 100_000, &p);
        assert_eq!(s, 1024.0);
    }

    #[test]
    fn tenants_move_to_the_buffer_in_bound_order_while_the_queue_would_be_under_s_min() {
        let p = ControlParams {
            goal_frac: 1.0,
            ..ControlParams::default()
        };
        // S = 4, observed 10 ms: bound 100 µs gives 2.02 < 4 → NS; bound 1 ms gives 2.2 → NS;
        // bound 20 ms gives 6 ≥ 4 → stop, and the looser tenant after it stays on the SSD.
        let tenants = [t(3, 20_000), t(1, 100), t(2, 1000), t(4, 50_000)];
        let (s, ns) = algorithm1(&tenants, 4.0, 10_000_000, &p);
        assert_eq!(ns, vec![1, 2]);
        assert!((s - 6.0).abs() < 1e-9, "{s}");
    }

    #[test]
    fn the_controller_aims_at_a_fraction_of_each_bound() {
        let p = ControlParams::default();
        assert_eq!(p.goal_frac, 0.9);
        // Goal 0.9 × 300 µs = 270 µs, observed 540 µs: S → 0.5·S + 0.5·S·0.5 = 0.75·S.
        let (s, _) = algorithm1(&[t(1, 300)], 100.0, 540_000, &p);
        assert!((s - 75.0).abs() < 1e-9, "{s}");
        // The monitor catches a tail above 270 µs, under the bound itself.
        let mut c = Controller::new(p);
        let near = TenantWindow {
            observed_ns: Some(280_000),
            ..t(1, 300)
        };
        let under = TenantWindow {
            observed_ns: Some(260_000),
            ..t(2, 300)
        };
        assert_eq!(c.step(&[near, under], None).over, vec![1]);
        // A nonsensical fraction counts as 1.
        let odd = ControlParams {
            goal_frac: 0.0,
            ..ControlParams::default()
        };
        assert_eq!(goal(300_000, &odd), 300_000.0);
    }

    #[test]
    fn the_monitor_adds_tenants_over_their_bound_and_control_off_keeps_128() {
        let mut c = Controller::new(ControlParams::default());
        let mut a = t(1, 300);
        a.observed_ns = Some(400_000);
        let b = TenantWindow {
            observed_ns: Some(100_000),
            ..t(2, 300)
        };
        let d = c.step(&[a, b], None);
        assert_eq!(d.ns, vec![1]);
        assert_eq!(d.over, vec![1]);
        assert_eq!(d.queue, 128 + 4);
        // Held in NS for 4 windows while it meets its bound, then released.
        let mut met = a;
        met.observed_ns = Some(200_000);
        for _ in 0..4 {
            assert_eq!(c.step(&[met, b], None).ns, vec![1]);
        }
        assert!(c.step(&[met, b], None).ns.is_empty());
        // Caught again soon after: held twice as long.
        c.step(&[a, b], None);
        for _ in 0..8 {
            assert_eq!(c.step(&[met, b], None).ns, vec![1]);
        }
        assert!(c.step(&[met, b], None).ns.is_empty());
        let mut off = Controller::new(ControlParams {
            enabled: false,
            ..ControlParams::default()
        });
        let d = off.step(&[a, b], Some(10_000_000));
        assert_eq!((d.queue, d.ns.len()), (128, 0));
    }
}
