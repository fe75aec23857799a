//! Restart decisions for supervised workers: what to do when a worker exits.
//!
//! - **One budget per primary** (OTP's intensity/period): more than `max_restarts` restarts within
//!   `window`, across all workers, and the primary gives up: it stops every worker, logs one line
//!   and exits with [`GIVE_UP_EXIT_CODE`], so systemd or Kubernetes can act. A worker that exits at
//!   once therefore causes at most `max_restarts` forks per window, never a fork storm. The
//!   default ([`default_max_restarts`]) grows with the workers, so that one event restarting every
//!   worker once (a database restart) never spends it.
//! - **Per-slot backoff**: a slot's first restart is immediate; the restart after its n-th bad
//!   exit in a row (n ≥ 2) waits `initial × factor^(n−2)`, capped. A bad exit is a crash, or an
//!   exit of any status, a clean one too, of a worker up less than `min_uptime` (supervisord's
//!   `startsecs`, PM2's `min_uptime`): a program that exits 0 at once (`/bin/true`, one that
//!   daemonizes by mistake) is paced as a crash loop is, not restarted as fast as it can fork.
//!   A worker that stayed up `min_uptime` resets its slot (its own exit counts if it crashed).
//! - **Restart types** (OTP's): `permanent` workers always come back, `transient` ones only after
//!   an abnormal exit, `temporary` ones never. An exit the primary asked for (a drain, a reload)
//!   is never a crash and never restarts the old worker. A "going down" notice
//!   ([`ExitReason::GoingDown`]) is no exit and no crash: it restarts (at once, no backoff) a
//!   `permanent` worker's slot only; a `transient` or `temporary` worker's real exit decides.
//!
//! Invariants: decisions depend only on the recorded history and the `now` passed in (no clock
//! reads here), so they are deterministic and testable; the history holds at most
//! `max_restarts + 1` instants.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// The exit code of a primary that gave up because its restart budget ran out (`EX_TEMPFAIL`:
/// "try again later"; a systemd unit can match it with `RestartForceExitStatus=75`).
pub const GIVE_UP_EXIT_CODE: i32 = 75;

/// The exit code of a primary whose shutdown had to SIGKILL workers still running at the kill
/// timeout, so requests may have been lost (`timeout(1)`'s "timed out" code). A stop forced by a
/// second SIGTERM/SIGINT exits with 128 + that signal's number instead, as a shell reports it.
pub const FORCED_STOP_EXIT_CODE: i32 = 124;

/// The default restart budget of `workers` workers within one window: 5, or twice the workers
/// when that is more, so one event that restarts every worker once (a database they all lost)
/// leaves room for as many more restarts.
pub fn default_max_restarts(workers: usize) -> u32 {
    u32::try_from(workers.saturating_mul(2))
        .unwrap_or(u32::MAX)
        .max(5)
}

/// How a worker process ended, or, [`GoingDown`](ExitReason::GoingDown), is about to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// Exit code 0.
    Normal,
    /// A non-zero exit code.
    Failed(i32),
    /// Killed by a signal it did not ask for.
    Signaled(i32),
    /// The primary asked it to stop (drain, reload, shutdown), whatever the code.
    Requested,
    /// It could not be started at all (fork or exec failed): a crash for the budget and backoff.
    NotStarted,
    /// It said it is going down (`STOPPING=1`, a "going down" notice) and still runs: no crash,
    /// no exit code. Only a `permanent` worker's slot is restarted for it (its replacement
    /// starts before it exits); its exit, later, is not decided on again.
    GoingDown,
}

impl ExitReason {
    /// OTP's "abnormal": anything but a normal or requested exit.
    pub fn is_crash(self) -> bool {
        matches!(
            self,
            ExitReason::Failed(_) | ExitReason::Signaled(_) | ExitReason::NotStarted
        )
    }
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitReason::Normal => f.write_str("exited with code 0"),
            ExitReason::Failed(code) => write!(f, "exited with code {code}"),
            ExitReason::Signaled(sig) => write!(f, "killed by signal {sig}"),
            ExitReason::Requested => f.write_str("stopped as asked"),
            ExitReason::NotStarted => f.write_str("could not be started"),
            ExitReason::GoingDown => f.write_str("said it was going down"),
        }
    }
}

/// Whether a worker comes back after it exits (OTP's child restart types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartType {
    /// Always restarted (unless the primary asked it to stop).
    #[default]
    Permanent,
    /// Restarted only after a crash (not for a "going down" notice: its exit decides).
    Transient,
    /// Never restarted.
    Temporary,
}

impl fmt::Display for RestartType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RestartType::Permanent => "permanent",
            RestartType::Transient => "transient",
            RestartType::Temporary => "temporary",
        })
    }
}

impl RestartType {
    /// Whether a worker of this type that ended (or is going down) for `reason` is restarted.
    pub fn restarts_after(self, reason: ExitReason) -> bool {
        match (self, reason) {
            (_, ExitReason::Requested) => false,
            (RestartType::Permanent, _) => true,
            (RestartType::Transient, r) => r.is_crash(),
            (RestartType::Temporary, _) => false,
        }
    }
}

/// OTP's restart intensity: at most `max_restarts` restarts within any `window`.
#[derive(Debug, Clone)]
pub struct RestartBudget {
    max_restarts: u32,
    window: Duration,
    recent: VecDeque<Instant>,
}

impl RestartBudget {
    pub fn new(max_restarts: u32, window: Duration) -> RestartBudget {
        RestartBudget {
            max_restarts,
            window,
            recent: VecDeque::new(),
        }
    }

    /// Records a restart at `now`; `false` if it is one too many within the window (give up).
    pub fn try_spend(&mut self, now: Instant) -> bool {
        self.forget_before(now);
        self.recent.push_back(now);
        self.recent.len() as u32 <= self.max_restarts
    }

    /// Restarts still allowed in the window ending at `now`.
    pub fn left(&mut self, now: Instant) -> u32 {
        self.forget_before(now);
        self.max_restarts.saturating_sub(self.recent.len() as u32)
    }

    fn forget_before(&mut self, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > self.window)
        {
            self.recent.pop_front();
        }
    }
}

/// Exponential backoff for consecutive bad exits of one slot (crashes, and exits before
/// `min_uptime`: [`SlotHistory`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub factor: f64,
    pub cap: Duration,
}

impl Default for Backoff {
    /// 100 ms, ×2, capped at 10 s.
    fn default() -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            factor: 2.0,
            cap: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The wait before restarting after the `bad_exits`-th consecutive bad exit (the first is
    /// free).
    pub fn delay(&self, bad_exits: u32) -> Duration {
        if bad_exits <= 1 {
            return Duration::ZERO;
        }
        let exponent = i32::try_from(bad_exits - 2).unwrap_or(i32::MAX);
        let scaled = self.initial.as_secs_f64() * self.factor.powi(exponent);
        // A factor below 0 or NaN (a Backoff built in code) waits nothing instead of panicking.
        Duration::from_secs_f64(scaled.max(0.0).min(self.cap.as_secs_f64()))
    }
}

/// A supervisor's restart rules.
#[derive(Debug, Clone)]
pub struct RestartPolicy {
    pub restart: RestartType,
    pub backoff: Backoff,
    /// A worker up at least this long resets its slot's count of bad exits; one that exits
    /// sooner, with any status, counts as a bad exit.
    pub min_uptime: Duration,
}

impl Default for RestartPolicy {
    fn default() -> RestartPolicy {
        RestartPolicy {
            restart: RestartType::Permanent,
            backoff: Backoff::default(),
            min_uptime: Duration::from_secs(1),
        }
    }
}

/// What happened to one worker slot recently.
#[derive(Debug, Clone, Default)]
pub struct SlotHistory {
    /// Consecutive bad exits that restarted the slot: crashes, and exits of any status of
    /// workers up less than `min_uptime`. A worker up `min_uptime` starts the count afresh (its
    /// own exit counted only if it crashed).
    pub bad_exits: u32,
}

/// What to do about an exited worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start a replacement after this long.
    Restart { after: Duration },
    /// Leave the slot empty (it finished, or its type says so).
    Leave,
    /// The budget is spent: stop everything and exit with [`GIVE_UP_EXIT_CODE`].
    GiveUp,
}

impl RestartPolicy {
    /// Decides about a worker of `slot` that ran for `uptime` and ended for `reason` at `now`.
    pub fn decide(
        &self,
        slot: &mut SlotHistory,
        budget: &mut RestartBudget,
        reason: ExitReason,
        uptime: Duration,
        now: Instant,
    ) -> Decision {
        let short = uptime < self.min_uptime;
        if !short {
            slot.bad_exits = 0;
        }
        if !self.restart.restarts_after(reason) {
            return Decision::Leave;
        }
        if reason.is_crash() || short {
            slot.bad_exits = slot.bad_exits.saturating_add(1);
        }
        if !budget.try_spend(now) {
            return Decision::GiveUp;
        }
        Decision::Restart {
            after: self.backoff.delay(slot.bad_exits),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_outlasts_one_restart_of_every_worker() {
        for (workers, budget) in [
            (1, 5),
            (2, 5),
            (3, 6),
            (8, 16),
            (1024, 2048),
            (usize::MAX, u32::MAX),
        ] {
            assert_eq!(default_max_restarts(workers), budget, "{workers} workers");
        }
    }

    #[test]
    fn a_backoff_with_a_nonsense_factor_never_panics() {
        for factor in [-2.0, f64::NAN, f64::INFINITY, 0.0] {
            let b = Backoff {
                initial: Duration::from_millis(100),
                factor,
                cap: Duration::from_secs(10),
            };
            for crashes in [0, 1, 2, 3, 4, u32::MAX] {
                assert!(
                    b.delay(crashes) <= Duration::from_secs(10),
                    "{factor} {crashes}"
                );
            }
        }
    }

    const CRASH: ExitReason = ExitReason::Failed(1);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_crash_every_second_never_spends_a_budget_of_3_in_2_seconds() {
        let policy = RestartPolicy::default();
        let mut budget = RestartBudget::new(3, secs(2.0));
        let mut slot = SlotHistory::default();
        let t0 = Instant::now();
        for i in 1..=100 {
            let d = policy.decide(
                &mut slot,
                &mut budget,
                CRASH,
                secs(1.0),
                t0 + secs(i as f64),
            );
            assert!(matches!(d, Decision::Restart { .. }), "crash {i}: {d:?}");
        }
    }

    #[test]
    fn a_crash_every_tenth_of_a_second_gives_up_at_the_fourth_restart() {
        let policy = RestartPolicy::default();
        let mut budget = RestartBudget::new(3, secs(2.0));
        let mut slot = SlotHistory::default();
        let t0 = Instant::now();
        let decisions: Vec<Decision> = (1..=4)
            .map(|i| {
                policy.decide(
                    &mut slot,
                    &mut budget,
                    CRASH,
                    secs(0.1),
                    t0 + secs(0.1 * i as f64),
                )
            })
            .collect();
        assert!(
            decisions[..3]
                .iter()
                .all(|d| matches!(d, Decision::Restart { .. })),
            "{decisions:?}"
        );
        assert_eq!(decisions[3], Decision::GiveUp);
    }

    #[test]
    fn the_budget_is_shared_across_slots() {
        let policy = RestartPolicy::default();
        let mut budget = RestartBudget::new(2, secs(10.0));
        let (mut a, mut b) = (SlotHistory::default(), SlotHistory::default());
        let t = Instant::now();
        assert!(matches!(
            policy.decide(&mut a, &mut budget, CRASH, secs(5.0), t),
            Decision::Restart { .. }
        ));
        assert!(matches!(
            policy.decide(&mut b, &mut budget, CRASH, secs(5.0), t),
            Decision::Restart { .. }
        ));
        assert_eq!(budget.left(t), 0);
        assert_eq!(
            policy.decide(&mut a, &mut budget, CRASH, secs(5.0), t),
            Decision::GiveUp
        );
        assert_eq!(
            budget.left(t + secs(11.0)),
            2,
            "restarts older than the window are forgotten"
        );
    }

    #[test]
    fn first_restart_is_immediate_then_backoff_grows_to_its_cap_and_uptime_resets_it() {
        let policy = RestartPolicy {
            backoff: Backoff {
                initial: secs(0.1),
                factor: 2.0,
                cap: secs(0.5),
            },
            ..RestartPolicy::default()
        };
        let mut budget = RestartBudget::new(u32::MAX, secs(1.0));
        let mut slot = SlotHistory::default();
        let t = Instant::now();
        let delays: Vec<Duration> = (0..6)
            .map(
                |_| match policy.decide(&mut slot, &mut budget, CRASH, secs(0.01), t) {
                    Decision::Restart { after } => after,
                    d => panic!("{d:?}"),
                },
            )
            .collect();
        assert_eq!(
            delays,
            [
                secs(0.0),
                secs(0.1),
                secs(0.2),
                secs(0.4),
                secs(0.5),
                secs(0.5)
            ]
        );
        // A worker that stayed up min_uptime starts its slot afresh.
        assert_eq!(
            policy.decide(&mut slot, &mut budget, CRASH, secs(2.0), t),
            Decision::Restart {
                after: Duration::ZERO
            }
        );
    }

    #[test]
    fn exits_of_any_status_before_min_uptime_back_off_and_a_worker_that_stayed_up_resets_it() {
        let policy = RestartPolicy {
            backoff: Backoff {
                initial: secs(0.1),
                factor: 2.0,
                cap: secs(10.0),
            },
            ..RestartPolicy::default()
        };
        let mut budget = RestartBudget::new(u32::MAX, secs(1.0));
        let mut slot = SlotHistory::default();
        let t = Instant::now();
        let mut delay =
            |reason, uptime| match policy.decide(&mut slot, &mut budget, reason, secs(uptime), t) {
                Decision::Restart { after } => after,
                d => panic!("{d:?}"),
            };
        // `/bin/true`: exit code 0 at once, again and again, paced as a crash loop is.
        let quick: Vec<Duration> = (0..4).map(|_| delay(ExitReason::Normal, 0.01)).collect();
        assert_eq!(quick, [secs(0.0), secs(0.1), secs(0.2), secs(0.4)]);
        // Mixed with crashes, one row.
        assert_eq!(delay(CRASH, 0.01), secs(0.8));
        // A clean exit after min_uptime is no bad exit: at once, and the row starts afresh.
        assert_eq!(delay(ExitReason::Normal, 2.0), Duration::ZERO);
        assert_eq!(delay(ExitReason::Normal, 0.01), Duration::ZERO);
        assert_eq!(delay(ExitReason::Normal, 0.01), secs(0.1));
        // A crash after min_uptime counts as the first of a new row, as it always did.
        assert_eq!(delay(CRASH, 2.0), Duration::ZERO);
        assert_eq!(delay(CRASH, 0.01), secs(0.1));
        // A going-down notice of a worker that served starts the row afresh too.
        assert_eq!(delay(ExitReason::GoingDown, 2.0), Duration::ZERO);
        assert_eq!(delay(ExitReason::Normal, 0.01), Duration::ZERO);
    }

    #[test]
    fn restart_types() {
        use ExitReason::*;
        use RestartType::*;
        assert!(Permanent.restarts_after(Normal) && Permanent.restarts_after(Signaled(9)));
        assert!(!Transient.restarts_after(Normal) && Transient.restarts_after(Failed(2)));
        assert!(!Temporary.restarts_after(Failed(2)));
        for t in [Permanent, Transient, Temporary] {
            assert!(
                !t.restarts_after(Requested),
                "a requested stop never restarts ({t:?})"
            );
        }
        // A "going down" notice is no crash: only a permanent worker is replaced for it.
        assert!(!GoingDown.is_crash());
        assert!(Permanent.restarts_after(GoingDown));
        assert!(!Transient.restarts_after(GoingDown) && !Temporary.restarts_after(GoingDown));
        let policy = RestartPolicy {
            restart: Transient,
            ..RestartPolicy::default()
        };
        let mut budget = RestartBudget::new(1, secs(1.0));
        let t = Instant::now();
        assert_eq!(
            policy.decide(
                &mut SlotHistory::default(),
                &mut budget,
                Normal,
                secs(0.0),
                t
            ),
            Decision::Leave
        );
        assert_eq!(budget.left(t), 1, "leaving a slot empty spends nothing");
    }
}
