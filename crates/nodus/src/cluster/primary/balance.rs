//! Choosing the worker for a new connection (round-robin and least-loaded), pure and testable.
//!
//! Round-robin: a rotation over the eligible workers, handing a worker more than one connection
//! it has not taken only while it keeps up. A worker whose loop says what it is doing (a nodus
//! worker's board mirrors its loop's hold) keeps up while its loop is in no hold of
//! [`HOLD_LIMIT`] or more, its process is not stopped, and its oldest untaken connection has
//! waited less than [`PIPELINE_WINDOW`]. A worker whose connection has waited [`HOLD_LIMIT`] is
//! looked at (`/proc`): a stopped one (`SIGSTOP`, a debugger) takes nothing, and judged by its
//! wait alone it soaked up every connection of a client pool until the handoff deadline; one
//! that only waits for a CPU on a busy host takes them as soon as it runs, and the burst it
//! misses a share of stays where it landed (its wait alone, at 2 ms, gave a worker 9 of 64
//! under CI's load). Such workers and the free ones (nothing handed and not yet taken) are handed
//! connections strictly in turn, so a burst (a keep-alive pool opening its connections at once)
//! is spread evenly, even over a worker that has not run since the burst began. One whose loop
//! is in a long hold (a long synchronous request, a busy loop) gets no more than the one it is
//! handed while free, as under Node's round-robin, which hands a connection only to a worker
//! that answered its last.
//! A worker that says nothing of its loop (a Node worker, an older nodus build, or one built
//! without measurements) is judged by its takes alone: first the free workers, in turn; with
//! none free, the one with the fewest untaken (of those, the one seen taking some last; exact
//! ties in turn), but only while its queue moves: it was seen taking some within
//! [`PIPELINE_WINDOW`] (`Candidate::quiet_ns`). Such a worker, idle when a burst comes, gets one
//! connection, and more once it has taken that one (its loop may be busy with the connection it
//! took last): a burst goes mostly to the workers that run first. With no worker free or keeping
//! up, a connection waits in the primary for the first to take its handoffs (`handoff`); each
//! worker takes at most its cap untaken (`Candidate::cap`), and `handoff` gives a worker that
//! takes nothing now (stalled: the primary has waited the handoff deadline for its loop; pausing
//! after a refusal; not ready) the cap.
//!
//! Least: the worker with the fewest estimated open connections, where the estimate is what the
//! worker last reported plus the connections handed since that report (a Node worker reports
//! nothing: its estimate is its untaken handoffs, which grow while its loop is busy). Ties rotate.
//! Any worker under the cap takes.

use std::time::Duration;

/// Connections a worker may have handed and not yet taken before it is skipped, unless it asked
/// for fewer (its window: [`Candidate::cap`]).
pub(crate) const MAX_IN_FLIGHT: u64 = 64;

/// How long a worker with connections handed and not taken may go without being seen taking any
/// and still be handed more under round-robin (when none is free). A worker that keeps up takes
/// a handoff in the loop turn after it arrives; one whose loop is busy for longer gets nothing
/// more until it takes what it has, and the connection waits in the primary for the first
/// worker that does instead (what a worker that was only slow costs is that wait). Under load
/// a healthy worker's turn (up to 64 connections to serve) plus its wait for a core on a busy
/// host runs to several ms, and the primary sees a take only at its next look: at 2 ms a
/// quarter of the connections of a 2-worker cluster under `wrk -c32 -H 'Connection: close'`
/// waited in the primary, and p99 went from 3.5 to 16–32 ms; at 20 ms about one in a thousand
/// waits. A request that holds a loop for longer than this is the busy worker the rule is for.
pub(crate) const PIPELINE_WINDOW: Duration = Duration::from_millis(20);

/// [`PIPELINE_WINDOW`] in ns.
const WINDOW_NS: u64 = PIPELINE_WINDOW.as_nanos() as u64;

/// How long a worker's loop may have been in one hold (a callback and the drain after it) and
/// still be handed connections on top of those it has not taken, under round-robin. A loop
/// that serves a turn of 64 keep-alive requests holds for about half a millisecond on the
/// 2-core machine of BENCHMARKS.md, a few with its thread preempted; one in a hold this long
/// or longer gets nothing more until it is out (its share goes to the others), so a loop that
/// blocks is handed at most its turns of the first 2 ms. A loop in no hold takes a handoff as
/// soon as its process runs: once its oldest untaken connection has waited this long, the
/// primary looks whether its process is stopped ([`Candidate::stopped`]).
pub(crate) const HOLD_LIMIT: Duration = Duration::from_millis(2);

/// [`HOLD_LIMIT`] in ns.
pub(crate) const HOLD_LIMIT_NS: u64 = HOLD_LIMIT.as_nanos() as u64;

/// What the balancer knows of one eligible worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Candidate {
    /// Connections handed and not yet taken.
    pub in_flight: u64,
    /// How long since it was last seen taking connections (ns).
    pub quiet_ns: u64,
    /// How long its oldest connection handed and not taken has waited (ns; 0 with none).
    pub waited_ns: u64,
    /// How long its loop has been in the hold it is in (ns; 0 when in none), if the worker says
    /// (its board mirrors its loop's holds).
    pub hold_ns: Option<u64>,
    /// Its process is stopped (`SIGSTOP`, a debugger). Looked at only for a worker that says
    /// what its loop is doing, once its oldest untaken connection has waited [`HOLD_LIMIT`]:
    /// false before.
    pub stopped: bool,
    /// Load estimate for `least` (see the module docs).
    pub load: u64,
    /// The most it may have in flight: [`MAX_IN_FLIGHT`], or the fewer its window asked.
    pub cap: u64,
}

/// Round-robin: the next candidate after `cursor` that is free or keeps up by its loop's word,
/// else, of those that say nothing of their loop and whose queue moves, the one with the fewest
/// in flight and, of those, the one seen taking some last (ties from `cursor`), else none (see
/// the module docs); advances the cursor.
pub(crate) fn round_robin(cands: &[Candidate], cursor: &mut usize) -> Option<usize> {
    let n = cands.len();
    let mut best: Option<usize> = None;
    for step in 0..n {
        let i = (*cursor + step) % n;
        let c = &cands[i];
        if c.in_flight == 0 || keeps_up(c) {
            best = Some(i);
            break;
        }
        let key = |c: &Candidate| (c.in_flight, c.quiet_ns);
        if moves(c) && best.is_none_or(|b| key(c) < key(&cands[b])) {
            best = Some(i);
        }
    }
    if let Some(b) = best {
        *cursor = (b + 1) % n;
    }
    best
}

/// Whether round-robin may hand `c` a connection now.
pub(crate) fn round_robin_takes(c: &Candidate) -> bool {
    c.in_flight == 0 || keeps_up(c) || moves(c)
}

/// Whether `c`, whose loop says what it is doing, may be handed connections on top of those it
/// has not taken: under its cap, its loop in no hold of [`HOLD_LIMIT`] or more, its process not
/// stopped, and its oldest untaken connection younger than [`PIPELINE_WINDOW`] (a process
/// starved of CPU for that long gets no more until it runs).
fn keeps_up(c: &Candidate) -> bool {
    c.hold_ns.is_some_and(|hold| hold < HOLD_LIMIT_NS)
        && c.in_flight < c.cap
        && !c.stopped
        && c.waited_ns < WINDOW_NS
}

/// Whether `c`, which says nothing of its loop, with connections in flight, may be handed more:
/// under its cap, and seen taking some within [`PIPELINE_WINDOW`].
fn moves(c: &Candidate) -> bool {
    c.hold_ns.is_none() && c.in_flight < c.cap && c.quiet_ns < WINDOW_NS
}

/// Whether least-loaded may hand `c` a connection now.
pub(crate) fn least_takes(c: &Candidate) -> bool {
    c.in_flight < c.cap
}

/// Least-loaded: the candidate with the smallest load and room, ties broken from `cursor`.
pub(crate) fn least(cands: &[Candidate], cursor: &mut usize) -> Option<usize> {
    let n = cands.len();
    let mut best: Option<usize> = None;
    for step in 0..n {
        let i = (*cursor + step) % n;
        if !least_takes(&cands[i]) {
            continue;
        }
        if best.is_none_or(|b| cands[i].load < cands[b].load) {
            best = Some(i);
        }
    }
    if let Some(b) = best {
        *cursor = (b + 1) % n;
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(in_flight: u64, load: u64) -> Candidate {
        Candidate {
            in_flight,
            quiet_ns: 0,
            waited_ns: 0,
            hold_ns: None,
            stopped: false,
            load,
            cap: MAX_IN_FLIGHT,
        }
    }

    /// `in_flight` untaken, and last seen taking some `quiet` ago; says nothing of its loop.
    fn w(in_flight: u64, quiet: Duration) -> Candidate {
        Candidate {
            in_flight,
            quiet_ns: quiet.as_nanos() as u64,
            waited_ns: 0,
            hold_ns: None,
            stopped: false,
            load: 0,
            cap: MAX_IN_FLIGHT,
        }
    }

    /// `in_flight` untaken, the oldest for `waited`, its loop in a hold for `hold` (zero: none),
    /// and not seen taking any for long.
    fn h(in_flight: u64, waited: Duration, hold: Duration) -> Candidate {
        Candidate {
            in_flight,
            quiet_ns: (PIPELINE_WINDOW * 100).as_nanos() as u64,
            waited_ns: waited.as_nanos() as u64,
            hold_ns: Some(hold.as_nanos() as u64),
            stopped: false,
            load: 0,
            cap: MAX_IN_FLIGHT,
        }
    }

    fn picks(cands: &mut [Candidate], cursor: &mut usize, n: usize) -> Vec<Option<usize>> {
        (0..n)
            .map(|_| {
                let pick = round_robin(cands, cursor);
                if let Some(i) = pick {
                    cands[i].in_flight += 1;
                }
                pick
            })
            .collect()
    }

    #[test]
    fn round_robin_rotates_over_free_workers_first() {
        let mut cursor = 0;
        let cands = [c(0, 0), c(0, 0), c(0, 0)];
        let got: Vec<_> = (0..6)
            .map(|_| round_robin(&cands, &mut cursor).unwrap())
            .collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
        // One with a connection in flight, however fresh, waits while another is free.
        let cands = [c(0, 0), c(1, 0), c(0, 0)];
        let got: Vec<_> = (0..4)
            .map(|_| round_robin(&cands, &mut cursor).unwrap())
            .collect();
        assert_eq!(got, [0, 2, 0, 2]);
    }

    #[test]
    fn a_burst_is_pipelined_over_workers_that_keep_up() {
        let mut cursor = 0;
        let mut cands = [c(0, 0), c(0, 0)];
        let got = picks(&mut cands, &mut cursor, 6);
        assert_eq!(got, [Some(0), Some(1), Some(0), Some(1), Some(0), Some(1)]);
        // Up to the cap each.
        let mut cands = [c(MAX_IN_FLIGHT - 1, 0), c(MAX_IN_FLIGHT - 1, 0)];
        let got = picks(&mut cands, &mut cursor, 3);
        assert_eq!(got.iter().filter(|p| p.is_some()).count(), 2, "{got:?}");
        assert_eq!(got[2], None);
    }

    #[test]
    fn a_burst_gives_a_worker_not_seen_taking_lately_one_connection() {
        let mut cursor = 0;
        let quiet = PIPELINE_WINDOW * 100;
        // Both idle: one each; the rest waits for the first to take its one.
        let mut cands = [w(0, quiet), w(0, quiet)];
        let got = picks(&mut cands, &mut cursor, 4);
        assert_eq!(got, [Some(0), Some(1), None, None]);
        // Free, but busy with what it took last (a long request): one, and the rest to the
        // worker that keeps up.
        let mut cands = [w(0, quiet), w(1, PIPELINE_WINDOW / 2)];
        let got = picks(&mut cands, &mut cursor, 5);
        assert_eq!(got.iter().filter(|&&p| p == Some(0)).count(), 1, "{got:?}");
        assert!(got.iter().all(Option::is_some), "{got:?}");
    }

    /// A burst over two idle workers whose loops say they hold nothing: strictly in turn, one
    /// each, however many the first has not taken yet (its process may not have run since the
    /// burst began), where workers that say nothing of their loop get one each and the rest
    /// waits for the first take.
    #[test]
    fn a_burst_is_spread_evenly_over_workers_whose_loops_hold_nothing() {
        let mut cursor = 0;
        let mut cands = [h(0, Duration::ZERO, Duration::ZERO); 2];
        let got = picks(&mut cands, &mut cursor, 64);
        let to_first = got.iter().filter(|&&p| p == Some(0)).count();
        assert_eq!(to_first, 32, "{got:?}");
        assert!(got.iter().all(Option::is_some), "{got:?}");
        // One of them took everything at once, the other nothing yet: still in turn.
        let mut cands = [
            h(20, HOLD_LIMIT / 2, Duration::ZERO),
            h(0, Duration::ZERO, HOLD_LIMIT / 4),
        ];
        let got = picks(&mut cands, &mut cursor, 10);
        assert_eq!(got.iter().filter(|&&p| p == Some(0)).count(), 5, "{got:?}");
    }

    /// A worker whose loop has been in one hold for [`HOLD_LIMIT`] (a long request, a busy loop)
    /// gets no connection on top of one it has not taken, nor does one whose process is stopped
    /// or has not run for [`PIPELINE_WINDOW`]; one that has only waited a few ms for a CPU keeps
    /// its turn; a free one still gets one in its turn.
    #[test]
    fn a_worker_in_a_long_hold_or_not_running_gets_no_more_than_one() {
        let mut cursor = 0;
        let busy = h(1, Duration::ZERO, HOLD_LIMIT);
        let mut cands = [busy, h(0, Duration::ZERO, Duration::ZERO)];
        let got = picks(&mut cands, &mut cursor, 6);
        assert_eq!(got, [Some(1); 6]);
        assert!(!round_robin_takes(&busy));
        let stopped = Candidate {
            stopped: true,
            ..h(1, HOLD_LIMIT, Duration::ZERO)
        };
        assert!(!round_robin_takes(&stopped));
        let starved = h(1, PIPELINE_WINDOW, Duration::ZERO);
        assert!(!round_robin_takes(&starved));
        assert_eq!(round_robin(&[busy, stopped, starved], &mut cursor), None);
        let waiting_for_a_cpu = h(6, HOLD_LIMIT * 3, Duration::ZERO);
        let mut cands = [waiting_for_a_cpu, h(6, Duration::ZERO, Duration::ZERO)];
        let got = picks(&mut cands, &mut cursor, 10);
        assert_eq!(got.iter().filter(|&&p| p == Some(0)).count(), 5, "{got:?}");
        let free_but_busy = h(0, Duration::ZERO, HOLD_LIMIT * 10);
        assert!(round_robin_takes(&free_but_busy));
        // At its cap, none, whatever its loop says.
        let full = h(MAX_IN_FLIGHT, Duration::ZERO, Duration::ZERO);
        assert!(!round_robin_takes(&full));
    }

    #[test]
    fn with_none_free_the_fewest_in_flight_among_those_whose_queue_moves() {
        let young = PIPELINE_WINDOW / 2;
        let mut cursor = 0;
        let cands = [w(3, young), w(1, young), w(1, PIPELINE_WINDOW)];
        assert_eq!(round_robin(&cands, &mut cursor), Some(1));
        // As many in flight: the one seen taking some last.
        let cands = [w(1, young), w(1, young / 2), w(1, young)];
        assert_eq!(round_robin(&cands, &mut cursor), Some(1));
        assert_eq!(round_robin(&cands, &mut cursor), Some(1));
        let ties = [w(2, young), w(2, young)];
        let a = round_robin(&ties, &mut cursor).unwrap();
        let b = round_robin(&ties, &mut cursor).unwrap();
        assert_ne!(a, b, "ties alternate");
    }

    #[test]
    fn a_worker_not_taking_its_connections_gets_none_while_another_takes() {
        let mut cursor = 0;
        // Worker 0 took nothing for the window (its loop is busy); worker 1 keeps up.
        let mut cands = [w(1, PIPELINE_WINDOW), c(0, 0)];
        let got = picks(&mut cands, &mut cursor, 5);
        assert_eq!(got, [Some(1); 5]);
        assert!(!round_robin_takes(&cands[0]));
        // With no worker free or moving, none: the connection waits in the primary.
        let stuck = [w(1, PIPELINE_WINDOW), w(MAX_IN_FLIGHT, Duration::ZERO)];
        assert_eq!(round_robin(&stuck, &mut cursor), None);
        assert!(!stuck.iter().any(round_robin_takes));
        assert_eq!(round_robin(&[], &mut cursor), None);
    }

    #[test]
    fn least_prefers_the_lightest_and_rotates_ties() {
        let mut cursor = 0;
        assert_eq!(least(&[c(0, 5), c(0, 1), c(0, 3)], &mut cursor), Some(1));
        let ties = [c(0, 2), c(0, 2)];
        let a = least(&ties, &mut cursor).unwrap();
        let b = least(&ties, &mut cursor).unwrap();
        assert_ne!(a, b, "ties alternate");
        assert_eq!(least(&[c(MAX_IN_FLIGHT, 0), c(0, 9)], &mut cursor), Some(1));
        // Its untaken connections' age is not its business.
        assert_eq!(
            least(&[w(1, PIPELINE_WINDOW * 100), c(0, 9)], &mut cursor),
            Some(0)
        );
    }
}
