//! Choosing the worker for a new connection (round-robin and least-loaded), pure and testable.
//!
//! Round-robin: strict rotation over the eligible workers, skipping any with
//! [`MAX_IN_FLIGHT`] handed connections not yet taken (a stuck or slow worker stops receiving;
//! the others keep the rotation; `handoff` gives a worker that takes nothing now, stalled (the
//! primary has waited the handoff deadline for its loop), pausing or not ready, the cap too).
//! Node's primary allows one unaccepted handoff per worker, so a single slow ACK stalls that
//! worker's share; nodus pipelines up to the cap.
//!
//! Least: the worker with the fewest estimated open connections, where the estimate is what the
//! worker last reported plus the connections handed since that report (a Node worker reports
//! nothing: its estimate is its untaken handoffs, which grow while its loop is busy). Ties rotate.

/// Connections a worker may have handed and not yet taken before it is skipped.
pub(crate) const MAX_IN_FLIGHT: u64 = 64;

/// What the balancer knows of one eligible worker.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Candidate {
    /// Connections handed and not yet taken.
    pub in_flight: u64,
    /// Load estimate for `least` (see the module docs).
    pub load: u64,
}

/// Round-robin: the next candidate after `cursor` with room; advances the cursor.
pub(crate) fn round_robin(cands: &[Candidate], cursor: &mut usize) -> Option<usize> {
    let n = cands.len();
    for step in 0..n {
        let i = (*cursor + step) % n;
        if cands[i].in_flight < MAX_IN_FLIGHT {
            *cursor = (i + 1) % n;
            return Some(i);
        }
    }
    None
}

/// Least-loaded: the candidate with the smallest load and room, ties broken from `cursor`.
pub(crate) fn least(cands: &[Candidate], cursor: &mut usize) -> Option<usize> {
    let n = cands.len();
    let mut best: Option<usize> = None;
    for step in 0..n {
        let i = (*cursor + step) % n;
        if cands[i].in_flight >= MAX_IN_FLIGHT {
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
        Candidate { in_flight, load }
    }

    #[test]
    fn round_robin_rotates_and_skips_full_workers() {
        let mut cursor = 0;
        let cands = [c(0, 0), c(0, 0), c(0, 0)];
        let picks: Vec<_> = (0..6)
            .map(|_| round_robin(&cands, &mut cursor).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        let cands = [c(0, 0), c(MAX_IN_FLIGHT, 0), c(3, 0)];
        let picks: Vec<_> = (0..4)
            .map(|_| round_robin(&cands, &mut cursor).unwrap())
            .collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        assert_eq!(round_robin(&[c(MAX_IN_FLIGHT, 0)], &mut cursor), None);
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
    }
}
