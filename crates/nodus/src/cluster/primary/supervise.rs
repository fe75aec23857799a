//! Supervision: worker exits and restarts, "going down" notices, rolling reload, graceful
//! shutdown and giving up; the signals and systemd notifications that drive and report them.
//!
//! Invariants:
//! - Restarts spend the primary's one budget (`State::budget`); a reload's failed attempts
//!   spend a budget of the reload's own, so a bad deploy fails the reload, never the primary.
//! - A reload switches one slot at a time: the new worker must be ready before the slot's old
//!   worker is asked to drain; the old one then drains on its own schedule while the next slot
//!   starts. Each switch is one log line naming the reload's generation (old pid → new pid, how
//!   long the new one took to be ready); a new worker not ready in time is the reload's to
//!   report (one line: `proc`'s generic warning leaves it out). Once every slot has switched,
//!   `reload_done`, `READY=1` (what `systemctl reload` waits for) and the "reload done" line
//!   come together: the new generation serves; the line names the old workers still draining.
//!   The reload stays under way (`State::reload_running`) until those have exited (one more
//!   line; the kill timer bounds the wait), a failed one until the old workers of the slots it
//!   switched have: a SIGHUP meanwhile queues one more reload (at most one), started only then,
//!   so every line of reload N comes before the first of reload N+1 and at most two
//!   generations run at once (as PM2's reload, done once the old processes are gone).
//! - A reload that ends is counted, done or failed (`State::reloads_done`/`reloads_failed`,
//!   the failure's reason kept until a reload is done), and ends with `READY=1` either way: a
//!   failed one's `STATUS=` says so. One a shutdown cut short is neither.
//! - Once shutdown (or give-up) begins, nothing is started again; `run` returns when the last
//!   worker has exited and every exit has settled (below). The primary accepts connections
//!   through `shutdown_delay` and stops when the drain begins (`server::stop_accepting`), or when
//!   a second signal kills the workers.
//! - A SIGHUP that is the primary's terminal hanging up (`signal::sighup`: the kernel's, or any
//!   while a standard fd that was a terminal is a hung-up one, as when an interactive shell
//!   forwards the hangup to its jobs) is a graceful stop, as SIGTERM's, with its own reason
//!   (`hung_up`); during a stop, nothing. Under `nohup` (SIGHUP ignored when the primary began
//!   to catch it) a hangup changes nothing: one INFO line. Any other SIGHUP (`kill -HUP`,
//!   `systemctl reload`) is a reload.
//! - SIGUSR1 and SIGUSR2 change nothing, at any phase (a stop's included): one WARN line each,
//!   naming the workers' pids; they are not passed on (`no_use_for`). A process's SIGHUP once a
//!   stop began starts no reload: one INFO line says so (`no_reload_while_stopping`).
//! - An exit's consequences (the replacement, a backoff) happen at once; its log line waits for
//!   the worker's output to end ([`Proc::output_ended`]), so it follows the worker's last lines,
//!   and so do the lines about what the exit led to (not restarted, giving up, a replacement
//!   that could not be started: its report and decision wait for the slot's pending exit lines,
//!   `Slot::failed_spawn`; a backoff wait, one line, and the replacement started after it,
//!   `Slot::restarted_line`). Until then the exit is "settling"
//!   (`State::exits_settling`). "No worker left to run" waits for every settling exit: it
//!   follows the exit lines of every worker, not only of the one whose exit found the slots
//!   empty.
//! - A worker that cannot be started for want of fds (`EMFILE`, `ENFILE`: the primary's trouble,
//!   not the worker's; the primary keeps fds for its spawns, `fd_reserve`, but the system's
//!   limit or a spawn beside a reload's can still run out) or of processes (`EAGAIN` from the
//!   fork: the process limit, a cgroup's `pids.max`) spends no restart budget and does not
//!   back off: it is tried again every [`SPAWN_RETRY`] while its restart stays pending, one WARN
//!   line per burst (`handoff::Floods`); a reload's new worker is tried so within the ready
//!   timeout, not spending the reload's budget either.
//! - A plain program's worker whose launcher could not execute the program says so
//!   ([`report_exec_failure`](super::report_exec_failure)): its exit line carries the reason.
//!   While no worker has run the program (`State::program_ran`), such a failure for want of the
//!   program (not there, not executable) stops the run with exit code 1 and one error line, as
//!   a first spawn that fails does; after that it is a crash like any other.
//! - The exit code is 0 after a graceful stop. A stop that had to kill workers (a second
//!   SIGTERM/SIGINT, the kill timeout during the shutdown, or the kill signal past a worker's
//!   drain deadline that the worker did not answer with exit code 0: it died of it, cutting what
//!   it held), or in which a worker exited with [`FORCED_STOP_EXIT_CODE`] (a nodus worker whose
//!   drain deadline cut requests) or died of a signal the primary did not send while it drained
//!   (below), sets its code unless one is set already: 128 + the second signal's number, or
//!   [`FORCED_STOP_EXIT_CODE`]; the give-up code and 1 (a worker left after a crash) are kept.
//!   The kill signal past a deadline is a warning, and so is the exit it led to. That exit's
//!   line says what ended the worker by its wait status (`termed_late_line`): the SIGKILL at the
//!   kill timeout (or of a second signal) races the worker's own exit (one that ends between the
//!   kill timer's look and its signal), and a worker whose status is an exit code (a nodus
//!   worker's 124) was already ending when the SIGKILL was sent.
//! - A worker asked to stop (a reload's old one, a shutdown's) that dies of a signal the primary
//!   did not send it (`Proc::signal` records each one it sends: a crash's SIGSEGV or SIGABRT,
//!   the OOM killer's or an operator's SIGKILL are not) did not stop as asked: what it still
//!   held was cut. Its exit's reason (event, stats, metrics) is `killed by signal N while
//!   draining`, not `stopped as asked`, with one WARN line, whatever the phase; it is still no
//!   crash for the restart decision (its slot has its replacement, or was asked to empty).
//! - A "going down" notice (the worker's word, or a Node worker closing the last listener it holds
//!   while the primary did not ask it to stop, once it serves) is no exit and no crash
//!   (`ExitReason::GoingDown`: it invents no exit code). The primary hands it no new
//!   connection, and one line names it and its pid. A `permanent` worker that serves (ready and
//!   up `min_uptime`) leaves its slot at once: the replacement starts (no backoff; the restart
//!   spends the budget, and the line names its pid) and the old worker gets the kill timeout to
//!   go; its exit, no slot's by then, is one line with its status and is not decided on again.
//!   A replacement that cannot be started, or the give-up, is told after that line. Any other (a
//!   `transient` or `temporary` worker, or one not serving yet) stays its slot's worker and is
//!   not stopped: its real exit decides, as any exit's; it gets the kill timeout to exit (out of
//!   routing, a worker that stays would hold its slot for good), its signals then an exit that
//!   decides. Either way a worker going down that stays is stopped as a stop escalates: the
//!   kill signal past its drain deadline (a Node worker's sooner, by the rule below), SIGKILL at
//!   the kill timeout. A worker the primary asked to stop
//!   (`Proc::drained`: a reload's, `Primary::stop_worker`'s), or one closing its listeners
//!   during a shutdown, is not going down.
//! - A stop asks the worker alone: a worker with a channel gets `disconnect` (with the drain
//!   deadline), then the kill signal ([`Config::kill_signal`](super::Config::kill_signal),
//!   SIGTERM by default) if it is still there `DRAIN_GRACE` after that deadline (a Node worker
//!   kept alive by a timer or a connection: Node's `worker.kill()` sends SIGTERM too), a Node
//!   worker sooner, a second after its channel ended, once it holds no inbound connection and no
//!   output it could not write yet (`conns`); a plain program gets the kill signal at once;
//!   whatever is left at the kill timeout gets SIGKILL.
//!   That signal is one the primary sent (`Proc::signal`): a worker that dies of it stopped as
//!   asked, whichever signal it is.
//!   A worker that has exited by either expiry is left alone (no signal, no line, no forced
//!   stop), reaped or not: its exit and the timer can come in one loop turn, whose timers run
//!   before the poll phase that reaps it, so the kill timer asks `Child::has_exited` (a zombie
//!   has) rather than taking its unfinished wait for a running worker.
//! - No process of a worker's group outlives the worker (systemd's `KillMode=mixed`): a stop asks
//!   the worker alone (`disconnect`, or the kill signal to its pid); the kill timeout and a
//!   second signal SIGKILL its whole group; and once it has exited, for any reason (a crash, its
//!   own exit, a stop, a give-up, a reload's old generation), what is left of its group is
//!   SIGKILLed before it is reaped (see `Proc::spawn`). So when `run` returns, every worker's group is empty or
//!   dying of SIGKILL; `run` then stops what the workers left that this process adopted (with
//!   [`Config::subreaper`](super::Config::subreaper): the kill signal, then SIGKILL after the
//!   kill timeout, or at once after a second signal, one during the workers' drain included; the
//!   exit code stays what the workers' stop made it), closes the orphan guard (which remembers
//!   no group by then, so kills nothing) and reaps it, and ends the reaping, before returning.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use super::proc::{Proc, ProcState};
use super::{EventKind, LastExit, Phase, Readiness, State, count};
use super::{captured, conns, handoff, server, stats};
use crate::cluster::protocol::{Disconnect, NODE_CLUSTER, Nodus};
use crate::cluster::supervision::{
    Decision, ExitReason, FORCED_STOP_EXIT_CODE, GIVE_UP_EXIT_CODE, RestartBudget,
};
use crate::process::{ExitStatus, Reaper};
use crate::signal::{SIGHUP, SIGKILL, SIGUSR1, SIGUSR2, Sighup, Signals};

/// systemd's watchdog: with `WATCHDOG_USEC` set (for this process), sends `WATCHDOG=1` every
/// half period while the primary's loop runs and every nodus worker's loop answers within a
/// quarter period (the workers asked for snapshots: Node workers and plain programs have no loop
/// figures to give); a stalled worker loop (or primary) makes the pings stop, so systemd acts.
fn start_watchdog(st: &Rc<State>) {
    let Some(period) = crate::notify::watchdog_period() else {
        return;
    };
    let s = st.clone();
    crate::task::spawn_named("cluster:watchdog", async move {
        loop {
            crate::time::sleep(period / 2).await;
            if s.phase.get() != Phase::Running {
                return;
            }
            if stats::ask_all(&s, period / 4).await {
                notify("WATCHDOG=1");
            } else {
                tracing::warn!(target: "nodus::cluster", "a worker loop did not answer within {:?}: no WATCHDOG=1 this period", period / 4);
            }
        }
    })
    .detach();
}

/// Serves signals until the run is over; returns the exit code.
pub(super) async fn run(st: &Rc<State>) -> i32 {
    start_watchdog(st);
    let mut signals = st.signals.borrow_mut().take();
    loop {
        let next = poll_fn(|cx| {
            if let Some(code) = st.exit_code.get() {
                return Poll::Ready(Err(code));
            }
            *st.done.borrow_mut() = Some(cx.waker().clone());
            match signals.as_mut().map(|s| s.poll_recv_from(cx)) {
                Some(Poll::Ready(sig)) => Poll::Ready(Ok(sig)),
                _ => Poll::Pending,
            }
        })
        .await;
        match next {
            Err(code) => {
                // Every worker is gone: what they left behind that this process adopted is
                // stopped now (the kill signal, SIGKILL after the kill timeout).
                if let Some(reaper) = &st.reaper {
                    stop_adopted(st, reaper, signals.as_mut()).await;
                }
                // Every worker has been reaped, so the guard remembers no group: it exits, and
                // is reaped here, killing nothing.
                if let Some(guard) = &st.guard {
                    guard.close().await;
                }
                if let Some(reaper) = &st.reaper {
                    reaper.close();
                }
                // The workers' last output, still being copied after their exit lines (a
                // slow reader of ours, a process they left writing to their pipes): read to
                // end of file and handed on before the exit, within the stop's bound.
                captured::drain_left(st).await;
                if st.phase.get() == Phase::Stopping {
                    tracing::info!(
                        target: "nodus::cluster",
                        "every worker has stopped: exit code {code}"
                    );
                }
                return code;
            }
            Ok((SIGHUP, origin)) => match crate::signal::sighup(origin) {
                Sighup::Hangup => hung_up(st),
                Sighup::HangupIgnored => hangup_ignored(),
                Sighup::Request if st.phase.get() == Phase::Stopping => {
                    no_reload_while_stopping();
                }
                Sighup::Request => start_reload(st),
            },
            Ok((sig @ (SIGUSR1 | SIGUSR2), _)) => no_use_for(st, sig),
            Ok((sig, _)) => {
                request_shutdown(st, crate::signal::name(sig), 128 + sig);
            }
        }
    }
}

/// A SIGHUP of the primary's terminal hanging up (an SSH session dropped, a terminal closed:
/// the kernel's, or a shell's forwarding it), not an operator's `kill -HUP` (a reload). A
/// foreground primary whose terminal is gone stops, as pm2-runtime and foreman do, rather than
/// serve on detached, holding its ports, its output lost: a graceful stop, as SIGTERM's. During
/// a stop, nothing.
fn hung_up(st: &Rc<State>) {
    if st.phase.get() == Phase::Running {
        start_shutdown(
            st,
            "SIGHUP: the terminal hung up (a stop, not a reload; kill -HUP reloads)",
        );
    }
}

/// A hangup's SIGHUP under `nohup` (SIGHUP ignored when the primary began to catch it): asked
/// to outlive its terminal, the primary serves on; one line says so.
fn hangup_ignored() {
    tracing::info!(
        target: "nodus::cluster",
        "SIGHUP: the terminal hung up; SIGHUP was ignored at start (nohup): serving on, no \
         reload (kill -HUP reloads)"
    );
}

/// A SIGHUP (`kill -HUP`, `systemctl reload`) once a stop began: no reload then, said in one
/// line so that a reload racing a stop is not lost without a word.
fn no_reload_while_stopping() {
    tracing::info!(
        target: "nodus::cluster",
        "SIGHUP during the stop: no reload (the stop goes on)"
    );
}

/// Stops the adopted processes still running once every worker is gone
/// ([`Reaper::stop_adopted`]); a SIGTERM or SIGINT meanwhile SIGKILLs them at once. The exit
/// code is not changed: what the workers' stop lost decides it.
async fn stop_adopted(st: &State, reaper: &Reaper, mut signals: Option<&mut Signals>) {
    let mut stop = pin!(reaper.stop_adopted(st.config.kill_signal, st.config.kill_timeout));
    poll_fn(|cx| {
        if let Some(signals) = signals.as_deref_mut() {
            while let Poll::Ready(sig) = signals.poll_recv(cx) {
                match sig {
                    SIGHUP => no_reload_while_stopping(),
                    SIGUSR1 | SIGUSR2 => no_use_for(st, sig),
                    _ => reaper.hurry(),
                }
            }
        }
        stop.as_mut().poll(cx)
    })
    .await;
}

/// SIGUSR1 or SIGUSR2 to the primary: one line, nothing else. Their default action would end
/// the primary with no drain, and a worker that does not catch one would die of it, so neither
/// happens; the line names the workers' pids, where such a signal is meant to go (Node's
/// inspector on SIGUSR1, a heap snapshot on SIGUSR2). `pkill -f 'node app.js'` matches the
/// primary's command line and reaches the workers itself.
fn no_use_for(st: &State, sig: i32) {
    let mut workers: Vec<(u32, u32)> = st
        .procs
        .borrow()
        .values()
        .map(|p| (p.slot, p.pid))
        .collect();
    workers.sort_unstable();
    let pids = if workers.is_empty() {
        "no worker runs now".to_owned()
    } else {
        let each: Vec<String> = workers
            .iter()
            .map(|(slot, pid)| format!("worker {slot} pid {pid}"))
            .collect();
        format!("send it to a worker: {}", each.join(", "))
    };
    tracing::warn!(
        target: "nodus::cluster",
        "{} to the cluster primary (pid {}): ignored, it has no use for it and serves on; not \
         passed to the workers ({pids})",
        crate::signal::name(sig),
        std::process::id()
    );
}

fn finish(st: &State, code: i32) {
    st.exit_code.set(Some(code));
    if let Some(w) = st.done.borrow_mut().take() {
        w.wake();
    }
}

fn notify(state: &str) {
    if let Err(e) = crate::notify::notify(state) {
        tracing::warn!(target: "nodus::cluster", "cannot notify the service manager ({state:?}): {e}");
    }
}

fn exit_reason(status: &std::io::Result<ExitStatus>) -> ExitReason {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(0), _) => ExitReason::Normal,
            (Some(c), _) => ExitReason::Failed(c),
            (None, Some(sig)) => ExitReason::Signaled(sig),
            (None, None) => ExitReason::Failed(-1),
        },
        Err(_) => ExitReason::Failed(-1),
    }
}

/// A worker process ended.
pub(super) fn on_exit(st: &Rc<State>, proc: &Rc<Proc>, status: std::io::Result<ExitStatus>) {
    proc.advance(ProcState::Dead);
    if let Ok(s) = &status {
        proc.exit_status.set(Some(*s));
    }
    st.procs.borrow_mut().remove(&proc.unique);
    server::leave_all(st, proc);
    server::exited(st, proc);
    handoff::after_exit(st, proc);
    let mut reason = exit_reason(&status);
    if proc.drained.get() {
        reason = ExitReason::Requested;
    } else if proc.exited_after_disconnect.get() && reason.is_crash() {
        // The worker disconnected on its own first: a voluntary exit, not a crash.
        reason = ExitReason::Normal;
    }
    let (code, signal) = match &status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    // Asked to stop, it died of a signal the primary did not send (a crash, the OOM killer, an
    // operator's `kill`): not the stop it was asked for, so not said as one. What it still held
    // was cut: a line, and during a shutdown a forced stop (below). The restart decision stays
    // an asked-for exit's.
    let killed_draining = signal.filter(|&sig| proc.drained.get() && !proc.was_sent(sig));
    let told = match killed_draining {
        Some(sig) => format!("killed by signal {sig} while draining"),
        None => reason.to_string(),
    };
    if code == Some(FORCED_STOP_EXIT_CODE) && st.phase.get() == Phase::Stopping {
        // The worker's own drain deadline cut requests (a nodus worker says so with this code).
        tracing::warn!(
            target: "nodus::cluster",
            "worker {} (pid {}) cut requests at its drain deadline (exit code {FORCED_STOP_EXIT_CODE})",
            proc.slot, proc.pid
        );
        force(st, FORCED_STOP_EXIT_CODE);
    }
    let last = LastExit {
        worker: proc.slot,
        pid: Some(proc.pid),
        reason: told.clone(),
    };
    let exec_failed = proc.exec_failed.take();
    let text = match &exec_failed {
        // Its launcher said why instead of writing a line of its own.
        Some((_, message)) => format!(
            "worker {} (pid {}) could not run the program: {message} ({reason})",
            proc.slot, proc.pid
        ),
        None => last.text(),
    };
    *st.last_exit.borrow_mut() = Some(last);
    st.emit(
        Some(proc),
        EventKind::Exit {
            code,
            signal,
            exited_after_disconnect: proc.exited_after_disconnect.get() || proc.drained.get(),
            reason: told,
            group_killed: proc.group_killed.get(),
        },
    );
    let is_current = st
        .current(proc.slot)
        .is_some_and(|c| c.unique == proc.unique);
    let running = st.phase.get() == Phase::Running;
    match &exec_failed {
        None => st.program_ran.set(true),
        Some((errno, message)) if is_current && running && !st.program_ran.get() => {
            if program_missing(*errno) {
                // No worker has run the program, and it is not there to run (a deploy race
                // past `nodus run`'s own check, a missing ELF interpreter): as when the first
                // workers cannot be spawned, exit code 1, not a restart budget spent.
                st.slots.borrow_mut()[proc.slot as usize - 1].current = None;
                tracing::error!(
                    target: "nodus::cluster",
                    "{message}: no worker could run it; exiting with code 1"
                );
                st.final_code.set(1);
                start_shutdown(st, "the program cannot be run");
            }
        }
        // Not a slot's current worker (a reload's new one, an old one): no exit line follows.
        Some(_) if running && !is_current => tracing::warn!(target: "nodus::cluster", "{text}"),
        Some(_) => {}
    }
    // The exit of a slot's current worker while running is logged and restarts the slot (at
    // once); the rest of the decision and the log line wait for the worker's output to end.
    let decision = (is_current && st.phase.get() == Phase::Running).then(|| {
        let uptime = proc.started.elapsed();
        {
            let mut slots = st.slots.borrow_mut();
            let slot = &mut slots[proc.slot as usize - 1];
            slot.current = None;
            slot.exit_lines_pending += 1;
        }
        decide_and_restart(st, proc.slot, Some(proc.pid), uptime, reason, false)
    });
    st.exits_settling.set(st.exits_settling.get() + 1);
    // What it held and no one holds now waits for its slot's next worker to ask for it again
    // (with a ready one already, a reload's old worker's case, for the rest of its grace).
    server::release_orphans(st);
    // A worker sent the kill signal past its drain deadline is not a slot's current one (no
    // exit line below): its end, and what ended it, get a line of their own. Unless it still
    // exited 0 (a nodus worker that kept its deadline a little late, a handler of that signal
    // that finished the work), what it was doing was cut: during a stop, a forced one.
    let termed_late = (decision.is_none() && proc.termed_past_deadline.get()).then(|| {
        let line = termed_late_line(
            proc.slot,
            proc.pid,
            st.config.kill_signal,
            (code, signal),
            proc.was_sent(SIGKILL),
        );
        (line, code != Some(0))
    });
    // Killed while draining, by a signal the primary did not send: the slot's current worker
    // (asked to stop by `Primary::stop_worker`) says so in its exit line; any other gets a line.
    let killed_line = killed_draining.is_some() && decision.is_none();
    // A worker that went down and was replaced then is no slot's: its exit gets a line of its
    // own, with its status, and is not decided on again.
    let went_down_line = decision.is_none() && proc.going_down.get() && !proc.drained.get();
    let (s, p) = (st.clone(), proc.clone());
    crate::task::spawn_named("cluster:exit-settle", async move {
        p.output_ended(&s).await;
        s.exits_settling.set(s.exits_settling.get() - 1);
        if let Some((line, cut)) = termed_late {
            tracing::warn!(target: "nodus::cluster", "{line}");
            if cut && s.phase.get() == Phase::Stopping {
                force(&s, FORCED_STOP_EXIT_CODE);
            }
        }
        if killed_line {
            tracing::warn!(target: "nodus::cluster", "{text}: what it still held was cut");
        }
        if went_down_line && reason.is_crash() {
            tracing::warn!(target: "nodus::cluster", "{text}, after going down");
        } else if went_down_line {
            tracing::info!(target: "nodus::cluster", "{text}, after going down");
        }
        if killed_draining.is_some() && s.phase.get() == Phase::Stopping {
            force(&s, FORCED_STOP_EXIT_CODE);
        }
        if let Some(decision) = decision {
            if reason.is_crash() || killed_draining.is_some() {
                tracing::warn!(target: "nodus::cluster", "{text}");
            } else {
                tracing::info!(target: "nodus::cluster", "{text}");
            }
            settle(&s, p.slot, reason, decision);
            exit_line_written(&s, p.slot);
        }
        if s.phase.get() == Phase::Stopping {
            check_all_gone(&s);
        } else {
            // The last exit to settle: "no worker left to run" comes after every exit line.
            exit_if_nothing_left(&s);
        }
    })
    .detach();
}

/// The line of a worker that was sent the kill signal `term` past its drain deadline, once it
/// has ended: what ended it, by its wait status (`code`, `signal`). When the primary sent it
/// SIGKILL too (`sigkilled`: the kill timeout, a second signal), that SIGKILL and the worker's
/// own exit race, and only the status says which won: killed by signal 9 is the SIGKILL's doing;
/// an exit code (or another signal) means the worker was already ending when the SIGKILL was
/// sent, so the SIGKILL line before it named a worker that was no longer running its work.
fn termed_late_line(
    slot: u32,
    pid: u32,
    term: i32,
    (code, signal): (Option<i32>, Option<i32>),
    sigkilled: bool,
) -> String {
    let term = crate::signal::name(term);
    let status = match (code, signal) {
        (Some(c), _) => ExitReason::Failed(c),
        (None, Some(sig)) => ExitReason::Signaled(sig),
        (None, None) => ExitReason::Failed(-1),
    };
    match (signal, sigkilled) {
        (Some(SIGKILL), true) => format!(
            "worker {slot} (pid {pid}) killed by the primary's SIGKILL: still running after its \
             {term} past the drain deadline"
        ),
        (_, true) => format!(
            "worker {slot} (pid {pid}) {status} after its {term} past the drain deadline, by \
             itself: it was already ending when the primary sent SIGKILL"
        ),
        (_, false) => {
            format!("worker {slot} (pid {pid}) {status} after its {term} past the drain deadline")
        }
    }
}

/// Whether an exec failure's `errno` says the program is not there or cannot be executed at
/// all (no passing cause such as `ETXTBSY`, a deploy still writing it, or a lack of memory).
fn program_missing(errno: i32) -> bool {
    [
        libc::ENOENT,
        libc::ENOTDIR,
        libc::EACCES,
        libc::EPERM,
        libc::ENOEXEC,
        libc::ELOOP,
        libc::ENAMETOOLONG,
        libc::EISDIR,
        libc::ELIBBAD,
    ]
    .contains(&errno)
}

/// What [`decide_and_restart`] decided, for [`settle`]: the decision (a restart's `after` is the
/// wait it got, none after a "going down" notice) and the slot's consecutive bad exits then.
struct Decided {
    decision: Decision,
    bad_exits: u32,
    /// The pid of the worker decided about (none for a start that failed).
    pid: Option<u32>,
    /// The pid of the replacement started at once (no backoff), if it could be started.
    replacement: Option<u32>,
}

/// Applies the restart policy to slot `id`, whose worker (`pid`, when it ran) was up for
/// `uptime`; `at_once` skips the backoff (a "going down" notice). A restart is started (or its
/// backoff) now; the decision is returned for [`settle`] to carry out the rest.
fn decide_and_restart(
    st: &Rc<State>,
    id: u32,
    pid: Option<u32>,
    uptime: Duration,
    reason: ExitReason,
    at_once: bool,
) -> Decided {
    let now = Instant::now();
    let (mut decision, bad_exits) = {
        let mut slots = st.slots.borrow_mut();
        let slot = &mut slots[id as usize - 1];
        let decision = st.config.restart.decide(
            &mut slot.history,
            &mut st.budget.borrow_mut(),
            reason,
            uptime,
            now,
        );
        (decision, slot.history.bad_exits)
    };
    let mut replacement = None;
    if let Decision::Restart { after } = &mut decision {
        if at_once {
            *after = Duration::ZERO;
        }
        let after = *after;
        {
            let mut slots = st.slots.borrow_mut();
            let slot = &mut slots[id as usize - 1];
            slot.restarts += 1;
            slot.pending_restart = true;
        }
        st.restarts.set(st.restarts.get() + 1);
        st.emit_for(
            Some(id),
            pid,
            EventKind::Restart {
                delay_ms: after.as_millis() as u64,
            },
        );
        let s = st.clone();
        if after.is_zero() {
            replacement = restart_slot(&s, id);
        } else {
            crate::task::spawn_named("cluster:backoff", async move {
                crate::time::sleep(after).await;
                if let Some(pid) = restart_slot(&s, id) {
                    let line = format!("worker {id} restarted after {}: pid {pid}", ms(after));
                    let mut slots = s.slots.borrow_mut();
                    let slot = &mut slots[id as usize - 1];
                    if slot.exit_lines_pending > 0 {
                        // The exit that led here is not logged yet: this line follows it.
                        slot.restarted_line = Some(line);
                    } else {
                        drop(slots);
                        tracing::info!(target: "nodus::cluster", "{line}");
                    }
                }
            })
            .detach();
        }
    }
    Decided {
        decision,
        bad_exits,
        pid,
        replacement,
    }
}

/// Carries out what [`decide_and_restart`] left: an empty slot (exiting if no worker is left to
/// run) or giving up; a backoff is said once, here (after the exit line that led to it), and so
/// is a restart at once (but a going-down worker's replacement: its line, `go_down`'s, says it).
fn settle(st: &Rc<State>, id: u32, reason: ExitReason, decided: Decided) {
    let Decided {
        decision,
        bad_exits,
        pid,
        replacement,
    } = decided;
    match decision {
        Decision::Leave => {
            if reason.is_crash() {
                st.left_after_crash.set(true);
            }
            tracing::info!(
                target: "nodus::cluster",
                "worker {id} is not restarted (restart type {})", st.config.restart.restart
            );
            // Nobody of this slot will ask for what its worker held.
            server::release_orphans(st);
            exit_if_nothing_left(st);
        }
        Decision::GiveUp => {
            let last = LastExit {
                worker: id,
                pid,
                reason: reason.to_string(),
            };
            give_up(
                st,
                format!(
                    "more than {} within {:?} (last: {})",
                    count(st.config.max_restarts as usize, "restart"),
                    st.config.restart_window,
                    last.text()
                ),
            );
        }
        Decision::Restart { after } if !after.is_zero() => {
            // A wait follows a bad exit (a crash, or any exit before the min uptime) that is
            // not the slot's first in a row.
            let min_uptime = st.config.restart.min_uptime;
            let hint = if reason == ExitReason::Normal {
                "; it exited with code 0 that soon: a server that puts itself in the background \
                 (daemonizes) must stay in the foreground; a program meant to run briefly and \
                 often is paced so unless --min-uptime is lowered"
            } else {
                ""
            };
            tracing::info!(
                target: "nodus::cluster",
                "worker {id} restarts in {} ms (exit {bad_exits} in a row that crashed or came \
                 less than {min_uptime:?} after its start{hint})",
                after.as_millis()
            );
        }
        Decision::Restart { .. } => {
            if let Some(pid) = replacement.filter(|_| reason != ExitReason::GoingDown) {
                tracing::info!(target: "nodus::cluster", "worker {id} restarted at once: pid {pid}");
            }
        }
    }
}

/// Starts slot `id`'s replacement. A spawn that fails (the program was removed or made
/// unexecutable by a deploy, the process table is full) counts as a crash of the slot: it spends
/// the budget and backs off like one, so a passing failure costs a retry, not the service; one
/// for want of fds is retried without either ([`spawn_later`]).
/// Returns the replacement's pid when one was started.
fn restart_slot(st: &Rc<State>, id: u32) -> Option<u32> {
    st.slots.borrow_mut()[id as usize - 1].pending_restart = false;
    if st.phase.get() != Phase::Running || st.current(id).is_some() {
        return None;
    }
    match Proc::spawn(st, id, st.generation.get()) {
        Ok(p) => {
            let pid = p.pid;
            st.slots.borrow_mut()[id as usize - 1].current = Some(p);
            Some(pid)
        }
        Err(e) => {
            {
                let mut slots = st.slots.borrow_mut();
                let slot = &mut slots[id as usize - 1];
                if slot.exit_lines_pending > 0 {
                    // The exit that led here is not logged yet: this failure follows its line.
                    slot.failed_spawn = Some(e);
                    slot.pending_restart = true;
                    return None;
                }
            }
            spawn_failed(st, id, e);
            None
        }
    }
}

/// Slot `id`'s replacement could not be started (`e`): logged, and counted as a crash; but for
/// want of fds, the primary's own trouble ([`spawn_later`]).
fn spawn_failed(st: &Rc<State>, id: u32, e: std::io::Error) {
    if host_shortage(&e) {
        spawn_later(st, id, e);
        return;
    }
    st.slots.borrow_mut()[id as usize - 1].pending_restart = false;
    let last = LastExit {
        worker: id,
        pid: None,
        reason: format!("could not be started: {e}"),
    };
    let text = last.text();
    tracing::warn!(target: "nodus::cluster", "{text}");
    *st.last_exit.borrow_mut() = Some(last);
    st.emit_for(
        Some(id),
        None,
        EventKind::SpawnFailed {
            error: e.to_string(),
        },
    );
    let reason = ExitReason::NotStarted;
    let decision = decide_and_restart(st, id, None, Duration::ZERO, reason, false);
    settle(st, id, reason, decision);
}

/// How long a worker's start that failed for want of fds waits to be tried again.
const SPAWN_RETRY: Duration = Duration::from_millis(200);

/// Whether `e` (a spawn's error, or what it wraps) is the host's shortage, which says nothing
/// about the worker: `EMFILE` or `ENFILE` (the primary, or the system, is out of fds), or
/// `EAGAIN` (a fork refused by the process limit: `RLIMIT_NPROC`, a cgroup's `pids.max`).
fn host_shortage(e: &std::io::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let io = c.downcast_ref::<std::io::Error>();
        let errno = io.and_then(|e| e.raw_os_error());
        if matches!(errno, Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN)) {
            return true;
        }
        // An `io::Error` wrapping another error says its inner one's source, not the inner one.
        cause = match io.and_then(|e| e.get_ref()) {
            Some(inner) => Some(inner),
            None => c.source(),
        };
    }
    false
}

/// Slot `id`'s worker could not be started for want of fds (`e`): no crash, so no restart
/// budget spent and no backoff; it is tried again after [`SPAWN_RETRY`], for as long as it
/// takes (its slot's restart stays pending). One WARN line (and `spawn_failed` event) per burst,
/// then a count per `log_limit::WINDOW` (`handoff::Floods`).
fn spawn_later(st: &Rc<State>, id: u32, e: std::io::Error) {
    st.slots.borrow_mut()[id as usize - 1].pending_restart = true;
    if st.floods.spawn.first(|| format!("worker {id}: {e}")) {
        tracing::warn!(
            target: "nodus::cluster",
            "worker {id} could not be started: {e}: the primary is out of fds or processes, no \
             fault of the worker's; trying again every {SPAWN_RETRY:?} without spending the restart budget \
             (further failures are counted: one line per {:?})",
            crate::log_limit::WINDOW
        );
        st.emit_for(
            Some(id),
            None,
            EventKind::SpawnFailed {
                error: e.to_string(),
            },
        );
    }
    let s = st.clone();
    crate::task::spawn_named("cluster:spawn-retry", async move {
        crate::time::sleep(SPAWN_RETRY).await;
        if let Some(pid) = restart_slot(&s, id) {
            tracing::info!(target: "nodus::cluster", "worker {id} started: pid {pid}");
        }
    })
    .detach();
}

/// Once no worker is left and none will start (every slot's restart type said no), the primary
/// has nothing to supervise: it exits, 0 when every worker's last exit was clean (as Node's
/// primary does when its last worker is gone), 1 when one was not. Not before every exit has
/// settled: the line follows every worker's exit line (the last exit to settle looks again).
fn exit_if_nothing_left(st: &Rc<State>) {
    if st.phase.get() != Phase::Running || !st.nothing_left() || st.exits_settling.get() > 0 {
        return;
    }
    let code = i32::from(st.left_after_crash.get());
    tracing::info!(
        target: "nodus::cluster",
        "no worker left to run (restart type {}): exiting with code {code}",
        st.config.restart.restart
    );
    st.final_code.set(code);
    start_shutdown(st, "no worker left");
}

/// A worker became ready.
pub(super) fn on_ready(st: &Rc<State>, _proc: &Rc<Proc>) {
    // Under rr and least a worker not ready is passed over while another is: what was parked
    // meanwhile (every ready one stalled, say) may go to it now.
    super::handoff::wake_parked(st);
    // A listener whose holders left, this worker's slot among theirs: its grace starts now.
    server::release_orphans(st);
    if !st.announced_ready.get() && st.phase.get() == Phase::Running && st.all_ready() {
        st.announced_ready.set(true);
        tracing::info!(
            target: "nodus::cluster",
            "{} ready (policy {})",
            count(st.config.workers, "worker"),
            st.config.policy.name()
        );
        notify("READY=1\nSTATUS=serving");
        server::warn_unclaimed(st);
    }
}

/// The worker says it is about to exit (`STOPPING=1`, `{act: 'suicide'}`, a nodus worker's
/// `going_down`): see [`go_down`].
pub(super) fn going_down(st: &Rc<State>, proc: &Rc<Proc>) {
    if may_go_down(st, proc) {
        go_down(
            st,
            proc,
            "said it is going down",
            "after saying it was going down",
        );
    }
}

/// `proc`, a Node worker, closed the last listener it held (its `close` for it) without being
/// asked to stop: it is leaving on its own (Node's `cluster.worker.disconnect()` from inside the
/// worker, or a `server.close()` that recycles it), a "going down" notice in all but name, so its
/// replacement starts now rather than once it has drained and exited. A stop the primary asked
/// for (a reload's, a shutdown's, [`Primary::stop_worker`](super::Primary::stop_worker) and
/// `kill_worker`) closes listeners too: not taken so. Nor is a close before the worker is
/// ready and up `min_uptime`: a program that probes a port at its start (listen, close, then
/// its real `listen`, as `get-port` does) is starting, not leaving; taken for leaving, each
/// replacement would do the same, until the restart budget ran out.
pub(super) fn closed_last_listener(st: &Rc<State>, proc: &Rc<Proc>) {
    if !serves(st, proc) || proc.drained.get() || !may_go_down(st, proc) {
        return;
    }
    go_down(
        st,
        proc,
        "closed its last listener without being asked to stop: it is going down",
        "after closing its last listener",
    );
}

/// Whether `proc` serves: it is ready and has been up the restart policy's `min_uptime`.
fn serves(st: &State, proc: &Proc) -> bool {
    proc.is_ready() && proc.started.elapsed() >= st.config.restart.min_uptime
}

/// Whether `proc` going down would free its slot: it is the slot's current worker, the primary
/// runs (no shutdown) and it has not gone down already.
fn may_go_down(st: &State, proc: &Proc) -> bool {
    st.current(proc.slot)
        .is_some_and(|c| c.unique == proc.unique)
        && st.phase.get() == Phase::Running
        && !proc.going_down.get()
}

/// `proc` is going down (it `said` so; `why`, for the kill timer's line): no crash, no exit.
/// The primary hands it no new connection. A `permanent` worker that serves (ready and up
/// `min_uptime`) is replaced at once ([`replace_now`]). Otherwise it stays its slot's worker, is
/// not stopped, and its exit decides as any exit does (`transient`: a restart only after a
/// crash; a worker not serving yet has nothing to hand over, and an early replacement would skip
/// the backoff of a program that says it is going down as it starts); the kill timer bounds its
/// stay. One line.
fn go_down(st: &Rc<State>, proc: &Rc<Proc>, said: &str, why: &'static str) {
    proc.going_down.set(true);
    st.emit(Some(proc), EventKind::GoingDown);
    server::leave_all(st, proc);
    let (restart, kill) = (st.config.restart.restart, st.config.kill_timeout);
    if !restart.restarts_after(ExitReason::GoingDown) {
        tracing::info!(
            target: "nodus::cluster",
            "worker {} (pid {}) {said}: no replacement before it exits (restart type {restart}), \
             its exit decides; it has {kill:?} to exit",
            proc.slot, proc.pid
        );
    } else if !serves(st, proc) {
        tracing::info!(
            target: "nodus::cluster",
            "worker {} (pid {}) {said}: no replacement before it exits (it is not serving yet: \
             not ready, or up less than {:?}), its exit decides; it has {kill:?} to exit",
            proc.slot, proc.pid, st.config.restart.min_uptime
        );
    } else {
        replace_now(st, proc, said, why);
        return;
    }
    // Out of routing from now on: a worker that said it goes down and stays gets the kill
    // timeout, so its slot is not lost for good (its SIGKILL is then an exit that decides),
    // with the kill signal first, as a stop escalates.
    arm_kill_timer(st, proc, why, Some(kill_signal_at(st)));
}

/// `proc`, going down, leaves its slot now: the slot's restart is decided (a restart at once,
/// or the give-up), and `proc` gets the kill timeout to exit (its exit is then no slot's: not
/// decided on again). One line, with the replacement's pid; a replacement that could not be
/// started, or the give-up, is told after it.
fn replace_now(st: &Rc<State>, proc: &Rc<Proc>, said: &str, why: &'static str) {
    let (id, pid) = (proc.slot, proc.pid);
    arm_kill_timer(st, proc, why, Some(kill_signal_at(st)));
    {
        let mut slots = st.slots.borrow_mut();
        let slot = &mut slots[id as usize - 1];
        slot.current = None;
        // A replacement that cannot be started is told after this line (`Slot::failed_spawn`).
        slot.exit_lines_pending += 1;
    }
    let (uptime, reason) = (proc.started.elapsed(), ExitReason::GoingDown);
    let decided = decide_and_restart(st, id, Some(pid), uptime, reason, true);
    let kill = st.config.kill_timeout;
    match (decided.replacement, decided.decision) {
        (Some(new), _) => tracing::info!(
            target: "nodus::cluster",
            "worker {id} (pid {pid}) {said}: its replacement is pid {new}; pid {pid} has \
             {kill:?} to exit"
        ),
        // The give-up (its line follows) stops it with the others.
        (None, Decision::GiveUp) => {
            tracing::info!(target: "nodus::cluster", "worker {id} (pid {pid}) {said}");
        }
        // The replacement's start failed: said (and decided on) after this line.
        (None, _) => tracing::info!(
            target: "nodus::cluster",
            "worker {id} (pid {pid}) {said}: its replacement could not be started; pid {pid} \
             has {kill:?} to exit"
        ),
    }
    settle(st, id, reason, decided);
    exit_line_written(st, id);
}

/// One of slot `id`'s pending exit lines (and what [`settle`] said after it) was written: once
/// none is pending, what happened meanwhile is told after them, in the order things happened (a
/// replacement started after its backoff, one that could not be started).
fn exit_line_written(st: &Rc<State>, id: u32) {
    let (restarted, failed) = {
        let mut slots = st.slots.borrow_mut();
        let slot = &mut slots[id as usize - 1];
        slot.exit_lines_pending -= 1;
        if slot.exit_lines_pending > 0 {
            return;
        }
        (slot.restarted_line.take(), slot.failed_spawn.take())
    };
    if let Some(line) = restarted {
        tracing::info!(target: "nodus::cluster", "{line}");
    }
    if let Some(e) = failed {
        spawn_failed(st, id, e);
    }
}

/// Asks `proc` to stop: `disconnect` with the drain deadline (the kill signal for a plain
/// program), then SIGKILL after the kill timeout.
pub(super) fn drain(st: &Rc<State>, proc: &Rc<Proc>) {
    if proc.state.get() >= ProcState::Draining {
        return;
    }
    proc.advance(ProcState::Draining);
    proc.drained.set(true);
    server::leave_all(st, proc);
    st.emit(Some(proc), EventKind::Drain);
    let term_at = if proc.channel.is_some() {
        proc.send(&Disconnect {
            cmd: NODE_CLUSTER,
            act: "disconnect",
            seq: st.next_seq(),
            drain_ms: st.config.drain_timeout.as_millis() as u64,
        });
        Some(kill_signal_at(st))
    } else {
        let _ = proc.signal(st.config.kill_signal, false);
        None
    };
    arm_kill_timer(st, proc, "after being asked to stop", term_at);
}

/// How long after the drain deadline a worker with a channel that is still running gets the kill
/// signal (at most half the time from the deadline to the kill timeout).
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// When a worker that drains (asked to with a `disconnect`, or going down by itself) gets the
/// kill signal if it is still there: `DRAIN_GRACE` past its drain deadline. That signal
/// (SIGTERM by default, as from Node's `worker.kill()`) lets a Node worker that a timer or an
/// open connection keeps alive run its handler of it (or end) instead of waiting for the
/// SIGKILL. The worker times its deadline from when it reads the `disconnect`, a little after
/// it is sent: the signal waits `DRAIN_GRACE` more, so a worker that keeps its deadline exits
/// of its own accord, with its own code (a nodus worker's 124: its deadline cut requests),
/// instead of dying of the signal in the middle of its exit.
fn kill_signal_at(st: &State) -> Duration {
    let room = st
        .config
        .kill_timeout
        .saturating_sub(st.config.drain_timeout);
    st.config.drain_timeout + DRAIN_GRACE.min(room / 2)
}

/// Sends `proc` the kill signal if it still runs `term_at` from now (if given, and before the
/// kill timeout), and SIGKILLs it and its process group if it still runs after the kill timeout;
/// during the shutdown, that makes the stop a forced one. A zombie not yet reaped does not run.
fn arm_kill_timer(st: &Rc<State>, proc: &Rc<Proc>, why: &'static str, term_at: Option<Duration>) {
    let (s, p, limit) = (st.clone(), proc.clone(), st.config.kill_timeout);
    let (term, term_name) = (
        st.config.kill_signal,
        crate::signal::name(st.config.kill_signal),
    );
    let term_at = term_at.filter(|&t| t < limit);
    crate::task::spawn_named("cluster:kill-timer", async move {
        let started = Instant::now();
        if let Some(term_at) = term_at {
            // A Node worker that holds no inbound connection and no output it could not write,
            // a moment after its channel ended, gets its kill signal then (`conns`): only a
            // timer or a pool keeps it alive.
            let mut exited = pin!(p.child.wait());
            let mut idle = pin!(conns::until_idle(&s, &p));
            let ended = poll_fn(|cx| {
                if exited.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                idle.as_mut().poll(cx).map(|()| true)
            });
            match crate::time::timeout(term_at, ended).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::debug!(
                        target: "nodus::cluster",
                        "worker {} (pid {}) disconnected, holds no connection and has written its \
                         output: {term_name}",
                        p.slot, p.pid
                    );
                    let _ = p.signal(term, false);
                }
                // Exited as its deadline passed: a zombie this turn's poll phase reaps (see
                // the module doc). Nothing is left to stop.
                Err(_) if p.child.has_exited() => return,
                Err(_) => {
                    // Still busy past its deadline: what it was doing (a request in flight,
                    // connections handed to it and not taken) is cut.
                    tracing::warn!(
                        target: "nodus::cluster",
                        "worker {} (pid {}) still running {} {why} (past its deadline): \
                         {term_name}",
                        p.slot,
                        p.pid,
                        ms(term_at)
                    );
                    p.termed_past_deadline.set(true);
                    let _ = p.signal(term, false);
                }
            }
        }
        let left = limit.saturating_sub(started.elapsed());
        let expired = crate::time::timeout(left, p.child.wait()).await.is_err();
        if expired && !p.child.has_exited() {
            tracing::warn!(
                target: "nodus::cluster",
                "worker {} (pid {}) still running {limit:?} {why}: SIGKILL",
                p.slot, p.pid
            );
            let _ = p.signal(SIGKILL, true);
            let _ = p.signal(SIGKILL, false);
            if s.phase.get() == Phase::Stopping {
                force(&s, FORCED_STOP_EXIT_CODE);
            }
        }
    })
    .detach();
}

/// The stop had to kill workers, so requests may have been lost: the exit code becomes `code`
/// unless one is set already (see the module doc).
fn force(st: &State, code: i32) {
    if st.final_code.get() == 0 {
        st.final_code.set(code);
        tracing::warn!(
            target: "nodus::cluster",
            "the stop was forced: exiting with code {code} once every worker is gone"
        );
    }
}

/// A shutdown request (SIGTERM, SIGINT, [`Primary::shutdown`](super::Primary::shutdown)): the
/// first starts a graceful shutdown; one during it kills what is left, and the exit code is then
/// `forced_code`.
pub(super) fn request_shutdown(st: &Rc<State>, why: &str, forced_code: i32) {
    if st.phase.get() == Phase::Running {
        start_shutdown(st, why);
        return;
    }
    let procs: Vec<Rc<Proc>> = st.procs.borrow().values().cloned().collect();
    tracing::warn!(
        target: "nodus::cluster",
        "{why} again: killing the remaining {}",
        count(procs.len(), "worker")
    );
    server::stop_accepting(st);
    if !procs.is_empty() {
        force(st, forced_code);
    }
    // What the workers left behind gets SIGKILL too, at once, when the workers are gone: a
    // second signal means now, not after another kill timeout.
    if let Some(reaper) = &st.reaper {
        reaper.hurry();
    }
    for p in procs {
        let _ = p.signal(SIGKILL, true);
        let _ = p.signal(SIGKILL, false);
    }
}

/// Starts a graceful shutdown (once).
fn start_shutdown(st: &Rc<State>, why: &str) {
    if st.phase.replace(Phase::Stopping) == Phase::Stopping {
        return;
    }
    st.stop_began.set(Some(Instant::now()));
    let procs: Vec<Rc<Proc>> = st.procs.borrow().values().cloned().collect();
    // A give-up (or another code already set) stops at once.
    let delay = if st.final_code.get() == 0 {
        st.config.shutdown_delay
    } else {
        Duration::ZERO
    };
    let after = if delay.is_zero() {
        String::new()
    } else {
        format!(" in {delay:?}")
    };
    let (n, kill) = (count(procs.len(), "worker"), st.config.kill_timeout);
    if !procs.is_empty() && st.config.command.ipc {
        let deadline = st.config.drain_timeout;
        tracing::info!(
            target: "nodus::cluster",
            "{why}: draining {n}{after} (deadline {deadline:?}, SIGKILL after {kill:?})"
        );
    } else if !procs.is_empty() {
        // A plain program has no drain deadline: it gets the kill signal, then the kill timeout.
        let term = crate::signal::name(st.config.kill_signal);
        tracing::info!(
            target: "nodus::cluster",
            "{why}: {term} to {n}{after}, SIGKILL after {kill:?} if still running"
        );
    } else {
        // Every worker had exited (a crash loop waiting out a backoff): the stop is still said,
        // with the restarts it cancels.
        let pending = st
            .slots
            .borrow()
            .iter()
            .filter(|s| s.pending_restart)
            .count();
        let cancelled = if pending == 0 {
            String::new()
        } else {
            format!(
                "; {} waiting out a backoff not started",
                count(pending, "restart")
            )
        };
        tracing::info!(target: "nodus::cluster", "{why}: no worker running{cancelled}");
    }
    notify("STOPPING=1\nSTATUS=draining");
    st.emit(
        None,
        EventKind::Shutdown {
            why: why.to_owned(),
        },
    );
    if delay.is_zero() {
        drain_all(st);
        return;
    }
    for p in &procs {
        p.send(&Nodus::act("stopping"));
    }
    let s = st.clone();
    crate::task::spawn_named("cluster:shutdown-delay", async move {
        crate::time::sleep(delay).await;
        drain_all(&s);
    })
    .detach();
}

fn drain_all(st: &Rc<State>) {
    server::stop_accepting(st);
    let procs: Vec<Rc<Proc>> = st.procs.borrow().values().cloned().collect();
    for p in &procs {
        drain(st, p);
    }
    check_all_gone(st);
}

fn check_all_gone(st: &Rc<State>) {
    if st.procs.borrow().is_empty() && st.exits_settling.get() == 0 {
        finish(st, st.final_code.get());
    }
}

/// The budget is spent: stop everything, say so in one line, exit with the give-up code.
fn give_up(st: &Rc<State>, why: String) {
    if st.phase.get() == Phase::Stopping {
        return;
    }
    tracing::error!(
        target: "nodus::cluster",
        "giving up: {why}; stopping every worker and exiting with code {GIVE_UP_EXIT_CODE}"
    );
    st.emit(None, EventKind::GiveUp { why: why.clone() });
    st.final_code.set(GIVE_UP_EXIT_CODE);
    start_shutdown(st, "restart budget spent");
}

/// Starts a rolling reload (SIGHUP); one during a reload (until the old workers it stopped have
/// exited) queues one more.
pub(super) fn start_reload(st: &Rc<State>) {
    if st.phase.get() != Phase::Running {
        return;
    }
    if st.reload_running.replace(true) {
        if !st.reload_again.replace(true) {
            tracing::info!(
                target: "nodus::cluster",
                "SIGHUP during the reload to generation {}: another reload follows once its old \
                 workers have exited",
                st.newest_generation.get()
            );
        }
        return;
    }
    st.reloading.set(true);
    let generation = st.newest_generation.get() + 1;
    st.newest_generation.set(generation);
    tracing::info!(target: "nodus::cluster", "reloading: generation {generation}, one worker at a time");
    notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading",
        crate::clock::now_ns() / 1000
    ));
    st.emit(None, EventKind::ReloadStart { generation });
    // The new generation's program is the file at the path now (`Config::pin_program`).
    super::proc::pin_program(st, generation);
    let s = st.clone();
    crate::task::spawn_named("cluster:reload", async move {
        let began = Instant::now();
        let mut stopped = Vec::new();
        let result = reload(&s, generation, &mut stopped).await;
        s.reloading.set(false);
        let left: Vec<Rc<Proc>> = stopped.into_iter().filter(|p| p.is_alive()).collect();
        // Only the serving generation starts workers from here on.
        let serving = if result.is_ok() {
            generation
        } else {
            s.generation.get()
        };
        super::proc::unpin(&s, |g| g == serving);
        // What the service manager hears when this reload is over (`READY=1`).
        let mut status = "serving".to_owned();
        match result {
            Ok(()) => {
                s.generation.set(generation);
                s.reloads_done.set(s.reloads_done.get() + 1);
                *s.last_reload_failure.borrow_mut() = None;
                s.emit(None, EventKind::ReloadDone { generation });
                reload_done(generation, began, &left);
            }
            Err(why) if s.phase.get() == Phase::Stopping => {
                // Not a failure of the new workers: the stop ends every worker anyway.
                tracing::info!(
                    target: "nodus::cluster",
                    "reload to generation {generation} abandoned: a shutdown began"
                );
                s.emit(None, EventKind::ReloadFailed { generation, why });
            }
            Err(why) => {
                tracing::error!(
                    target: "nodus::cluster",
                    "reload to generation {generation} failed: {why}; the running workers keep serving"
                );
                s.reloads_failed.set(s.reloads_failed.get() + 1);
                *s.last_reload_failure.borrow_mut() = Some(why.clone());
                // Still serving (`READY=1`), but `systemctl status` and a deploy script reading
                // the status see that the reload did not happen. One line: a status is one.
                status = format!(
                    "reload failed: {}; generation {} still serving",
                    why.replace('\n', " "),
                    s.generation.get()
                );
                s.emit(None, EventKind::ReloadFailed { generation, why });
            }
        }
        if s.phase.get() == Phase::Running {
            notify(&format!("READY=1\nSTATUS={status}"));
        }
        // The reload is under way until the old workers it stopped have exited (the kill timer
        // bounds that): so every line of a reload comes before the next one's first, and no
        // more than two generations run at once.
        if !left.is_empty() {
            for p in &left {
                // Its exit handled (`on_exit`: its `exit` event), not only reaped.
                while p.wait_for(ProcState::Dead, Duration::from_secs(60)).await != ProcState::Dead
                {}
            }
            if s.phase.get() == Phase::Running {
                tracing::info!(
                    target: "nodus::cluster",
                    "reload to generation {generation}: the old workers have exited (in {})",
                    ms(began.elapsed())
                );
            }
        }
        s.reload_running.set(false);
        if s.phase.get() != Phase::Running {
            return;
        }
        if s.reload_again.take() {
            // The program may have changed again since this reload started it: start it anew.
            start_reload(&s);
            return;
        }
        exit_if_nothing_left(&s);
    })
    .detach();
}

/// Every slot has its new worker (`reload_done`, `READY=1`): "reload done", with the old
/// workers the reload stopped that have not exited yet (`left`).
fn reload_done(generation: u64, began: Instant, left: &[Rc<Proc>]) {
    let took = ms(began.elapsed());
    if left.is_empty() {
        tracing::info!(
            target: "nodus::cluster",
            "reload done: generation {generation} serving, no old worker left (in {took})"
        );
        return;
    }
    tracing::info!(
        target: "nodus::cluster",
        "reload done: generation {generation} serving (in {took}); waiting for {} to exit \
         (pid {})",
        count(left.len(), "old worker"),
        left.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(", ")
    );
}

/// A measured duration for a log line, in whole milliseconds (`0 ms`, `2503 ms`), as the
/// backoff lines say theirs: `Debug` would print `0ns` or `2.503s`.
fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Replaces every slot's worker with one of `generation`, one at a time; the old workers it
/// asks to drain are pushed to `stopped` (those of the slots switched before a failure too).
async fn reload(
    st: &Rc<State>,
    generation: u64,
    stopped: &mut Vec<Rc<Proc>>,
) -> Result<(), String> {
    let mut budget = RestartBudget::new(st.config.max_restarts, st.config.restart_window);
    let ids: Vec<u32> = st.slots.borrow().iter().map(|s| s.id).collect();
    for id in ids {
        let mut attempts = 0u32;
        // Since when this slot's new worker could not be started for want of fds.
        let mut short_since: Option<Instant> = None;
        let new = loop {
            if st.phase.get() != Phase::Running {
                return Err("shutdown began".to_owned());
            }
            let new = match Proc::spawn(st, id, generation) {
                Ok(new) => new,
                // The primary's own shortage: tried again, within the ready timeout.
                Err(e)
                    if host_shortage(&e)
                        && short_since.get_or_insert_with(Instant::now).elapsed()
                            < st.config.ready_timeout =>
                {
                    if st.floods.spawn.first(|| format!("worker {id}: {e}")) {
                        tracing::warn!(
                            target: "nodus::cluster",
                            "reload to generation {generation}: cannot start worker {id} yet: \
                             {e}: the primary is out of fds; trying again every {SPAWN_RETRY:?} \
                             for up to {:?} (further failures are counted: one line per {:?})",
                            st.config.ready_timeout,
                            crate::log_limit::WINDOW
                        );
                    }
                    crate::time::sleep(SPAWN_RETRY).await;
                    continue;
                }
                Err(e) => return Err(format!("cannot start worker {id}: {e}")),
            };
            short_since = None;
            let mut state = new
                .wait_for(ProcState::Ready, st.config.ready_timeout)
                .await;
            if state < ProcState::Ready && new.child.has_exited() {
                // It exited as the timeout expired (its reap comes in this loop turn's poll
                // phase): said as an exit, not as lateness.
                state = new.wait_for(ProcState::Dead, Duration::from_secs(60)).await;
            }
            if state == ProcState::Ready {
                break new;
            }
            let why = match state {
                ProcState::Dead => format!(
                    "worker {id} of generation {generation} exited before it was ready ({})",
                    new.exit_status
                        .get()
                        .map_or_else(|| "unknown status".to_owned(), |s| s.to_string())
                ),
                _ => {
                    drain(st, &new);
                    // Ready at `listening` or at its word only: say so, a worker that never
                    // listens (or never says it is ready) never is.
                    let hint = match st.config.readiness {
                        Readiness::Listening => " (it never sent `listening`)",
                        Readiness::Message if st.config.command.ipc => {
                            " (it never said it was ready: a Node worker's \
                             `process.send('ready')` or `READY=1` to its NOTIFY_SOCKET, a nodus \
                             worker's ready message)"
                        }
                        Readiness::Message => " (it never sent `READY=1` to its NOTIFY_SOCKET)",
                        _ => "",
                    };
                    format!(
                        "worker {id} of generation {generation} was not ready within {:?}{hint}",
                        st.config.ready_timeout
                    )
                }
            };
            attempts += 1;
            if st.phase.get() != Phase::Running {
                return Err("shutdown began".to_owned());
            }
            if !budget.try_spend(Instant::now()) {
                let tries = if attempts == 1 { "try" } else { "tries" };
                return Err(format!(
                    "{why} ({attempts} {tries}: the reload's budget is spent)"
                ));
            }
            let wait = st.config.restart.backoff.delay(attempts + 1);
            tracing::warn!(
                target: "nodus::cluster",
                "{why}; trying again in {} ms",
                wait.as_millis()
            );
            crate::time::sleep(wait.max(Duration::from_millis(1))).await;
        };
        let ready_in = ms(new.started.elapsed());
        let old = st.slots.borrow_mut()[id as usize - 1]
            .current
            .replace(new.clone());
        match old {
            Some(old) => {
                tracing::info!(
                    target: "nodus::cluster",
                    "reload to generation {generation}: worker {id} pid {} → pid {} (ready \
                     {ready_in} after its start); pid {} asked to stop",
                    old.pid,
                    new.pid,
                    old.pid
                );
                drain(st, &old);
                stopped.push(old);
            }
            None => tracing::info!(
                target: "nodus::cluster",
                "reload to generation {generation}: worker {id} is pid {} (ready {ready_in} \
                 after its start); its old worker had already exited",
                new.pid
            ),
        }
        // A slot whose old worker had died meanwhile may have a restart pending: the new worker
        // fills it.
        st.slots.borrow_mut()[id as usize - 1].pending_restart = false;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A spawn refused for the host's want of fds or processes, however deep in its error's
    /// sources, is the host's shortage; any other failure is the worker's.
    #[test]
    fn a_spawn_refused_for_want_of_fds_or_processes_is_the_hosts_shortage() {
        use std::io::Error;
        for errno in [libc::EMFILE, libc::ENFILE, libc::EAGAIN] {
            assert!(super::host_shortage(&Error::from_raw_os_error(errno)));
            let wrapped = Error::other(Error::from_raw_os_error(errno));
            assert!(super::host_shortage(&wrapped), "{errno} wrapped");
        }
        for errno in [libc::ENOENT, libc::EACCES, libc::ENOMEM] {
            assert!(!super::host_shortage(&Error::from_raw_os_error(errno)));
        }
    }

    use super::*;
    use crate::signal::SIGTERM;

    #[test]
    fn a_late_workers_line_says_what_its_wait_status_says() {
        let line = |status, sigkilled| termed_late_line(1, 4242, SIGTERM, status, sigkilled);
        // The kill timeout's SIGKILL ended it.
        assert_eq!(
            line((None, Some(SIGKILL)), true),
            "worker 1 (pid 4242) killed by the primary's SIGKILL: still running after its \
             SIGTERM past the drain deadline"
        );
        // The SIGKILL was sent, but the worker's own exit (124: its drain cut requests) won the
        // race: the status is an exit code, so it was not the SIGKILL that ended it.
        assert_eq!(
            line((Some(FORCED_STOP_EXIT_CODE), None), true),
            "worker 1 (pid 4242) exited with code 124 after its SIGTERM past the drain deadline, \
             by itself: it was already ending when the primary sent SIGKILL"
        );
        assert_eq!(
            line((None, Some(SIGTERM)), true),
            "worker 1 (pid 4242) killed by signal 15 after its SIGTERM past the drain deadline, \
             by itself: it was already ending when the primary sent SIGKILL"
        );
        // No SIGKILL sent: the status alone.
        assert_eq!(
            line((Some(FORCED_STOP_EXIT_CODE), None), false),
            "worker 1 (pid 4242) exited with code 124 after its SIGTERM past the drain deadline"
        );
        assert_eq!(
            line((Some(0), None), false),
            "worker 1 (pid 4242) exited with code 0 after its SIGTERM past the drain deadline"
        );
        // A SIGKILL the primary did not send (the OOM killer) is not said to be the primary's.
        assert_eq!(
            line((None, Some(SIGKILL)), false),
            "worker 1 (pid 4242) killed by signal 9 after its SIGTERM past the drain deadline"
        );
    }
}
