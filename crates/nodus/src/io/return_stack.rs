//! The return-stack refill after a syscall on a hot path ([`after_syscall`]).
//!
//! Where the kernel mitigates AMD's Speculative Return Stack Overflow with "Safe RET" (its
//! report: `/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow`), the CPU's return
//! stack holds the kernel's return addresses when a syscall comes back. A user-space `ret` that
//! takes its prediction from one of them (any `ret` of a function that called before the
//! syscall: every libc wrapper, every function that makes a syscall and returns) makes the next
//! syscall's kernel work slower in every kernel function: a response-sized `send` and its `recv`
//! on 127.0.0.1 cost 6.6 µs instead of 5.3 (`examples/loopback_floor` in nodus-http). A chain of
//! 32 calls, each returned from, made right after the syscall, leaves only this process's
//! addresses in the return stack (32 entries on the affected CPUs; the kernel's own refill,
//! `RSB_CLEAR_LOOPS`, is 32 deep too), and the next kernel entry runs at full speed again.
//!
//! Invariants:
//! - The refill is balanced: each call is returned from, so the stack pointer, a CET shadow
//!   stack and every register but `rcx` and the flags are as they were. It uses at most 256 bytes
//!   below the stack pointer, which the compiler keeps free across it (the asm is not `nostack`).
//! - It is made only where it pays: on x86-64 when the kernel reports "Safe RET", decided once
//!   per process. `NODUS_RSB_REFILL=on` or `off` overrides that (`auto`, the default, reads the
//!   kernel's report); any other value is reported and taken as `auto`. Elsewhere
//!   [`after_syscall`] is a load and a branch.
//! - It follows the syscalls a request makes that rustix makes inline (its `linux_raw` backend:
//!   the `syscall` instruction in the caller, no wrapper): nodus-http's socket reads and writes
//!   and the `recv`, `send` and `sendmsg` of `nodus::net` streams. Made after a libc wrapper it
//!   would come too late: the wrapper's own `ret` has already done the harm (a C loop of glibc's
//!   `send`/`recv` with the refill after each call stays at 6.6 µs). So the loop's `epoll_wait`
//!   (mio, through libc), std's vectored reads of `nodus::net` streams and accepts have none;
//!   nor have syscalls off a request's path (files, processes, IPC).

use std::sync::atomic::{AtomicU8, Ordering};

/// The kernel's report on the Speculative Return Stack Overflow mitigation.
const SRSO_REPORT: &str = "/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow";
/// The override: `on`, `off` or `auto`.
const OVERRIDE: &str = "NODUS_RSB_REFILL";

/// Not decided yet, off, on.
const UNDECIDED: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Refills the return stack if this process does (see the module docs). Call it right after a
/// syscall on a path that repeats per request, before the function that made the syscall returns.
#[inline]
pub fn after_syscall() {
    if refills_return_stack() {
        refill_return_stack();
    }
}

/// Whether this process refills the return stack after its hot syscalls, deciding it if that
/// was not done yet (a runtime's start does it, so that no request pays for reading the report).
#[inline]
pub fn refills_return_stack() -> bool {
    match STATE.load(Ordering::Relaxed) {
        UNDECIDED => decide(),
        state => state == ON,
    }
}

#[cold]
fn decide() -> bool {
    let setting = std::env::var(OVERRIDE).ok();
    let report = std::fs::read_to_string(SRSO_REPORT).ok();
    let (on, not_understood) = choose(setting.as_deref(), report.as_deref());
    if let Some(value) = not_understood {
        tracing::warn!(
            target: "nodus::io",
            "ignoring {OVERRIDE}={value:?}: not on, off or auto; taking auto"
        );
    }
    STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
    tracing::debug!(
        target: "nodus::io",
        "return-stack refill after hot syscalls: {} (kernel's report: {:?})",
        if on { "on" } else { "off" },
        report.as_deref().map(str::trim)
    );
    on
}

/// What `NODUS_RSB_REFILL` (if set) and the kernel's SRSO report (if it could be read) decide:
/// whether to refill, and the setting if it was not understood (then taken as `auto`).
fn choose<'a>(setting: Option<&'a str>, report: Option<&str>) -> (bool, Option<&'a str>) {
    let x86_64 = cfg!(target_arch = "x86_64");
    let auto = x86_64 && reports_safe_ret(report);
    match setting.map(str::trim) {
        None | Some("auto") => (auto, None),
        Some("on") => (x86_64, None),
        Some("off") => (false, None),
        Some(other) => (auto, Some(other)),
    }
}

/// Whether the kernel's SRSO report (the file's text, if it could be read) says the mitigation
/// is "Safe RET": "Mitigation: Safe RET", or "Vulnerable: Safe RET, no microcode".
fn reports_safe_ret(report: Option<&str>) -> bool {
    report.is_some_and(|text| text.contains("Safe RET"))
}

/// The refill itself, whatever the process decided: a balanced chain of 32 calls and returns
/// (nothing on other targets than x86-64). [`after_syscall`] is what a hot path calls.
#[inline(never)]
pub fn refill_return_stack() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the asm calls itself 32 deep and returns from every call: it writes only the 256
    // bytes below the stack pointer (allowed, as the block is not `nostack`: the compiler keeps
    // nothing there across it), leaves the stack pointer as it found it, and changes only `rcx`
    // (declared) and the flags (not `preserves_flags`). Each call is matched by its return, so a
    // CET shadow stack stays in step.
    unsafe {
        std::arch::asm!(
            "mov ecx, 32",
            "call 2f",
            "jmp 4f",
            "2:",
            "dec ecx",
            "jz 3f",
            "call 2b",
            "3:",
            "ret",
            "4:",
            out("rcx") _,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_ret_in_the_kernel_s_report_turns_the_refill_on() {
        assert!(reports_safe_ret(Some(
            "Vulnerable: Safe RET, no microcode\n"
        )));
        assert!(reports_safe_ret(Some("Mitigation: Safe RET\n")));
        assert!(!reports_safe_ret(Some("Not affected\n")));
        assert!(!reports_safe_ret(Some("Mitigation: IBPB\n")));
        assert!(!reports_safe_ret(Some("Vulnerable\n")));
        assert!(!reports_safe_ret(None));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_setting_overrides_the_kernel_s_report_and_a_bad_one_is_taken_as_auto() {
        let safe_ret = Some("Vulnerable: Safe RET, no microcode\n");
        let unaffected = Some("Not affected\n");
        assert_eq!(choose(None, safe_ret), (true, None));
        assert_eq!(choose(None, unaffected), (false, None));
        assert_eq!(choose(None, None), (false, None));
        assert_eq!(choose(Some(" auto "), safe_ret), (true, None));
        assert_eq!(choose(Some("off"), safe_ret), (false, None));
        assert_eq!(choose(Some("on"), unaffected), (true, None));
        assert_eq!(choose(Some("yes"), unaffected), (false, Some("yes")));
        assert_eq!(choose(Some("1"), safe_ret), (true, Some("1")));
    }

    /// Values live in registers and on the stack across many refills come back unchanged, and
    /// the refill returns to its caller every time (a chain that lost a return would not).
    #[test]
    fn the_refill_returns_with_the_caller_s_state_intact() {
        #[inline(never)]
        fn sum_with_refills(values: &[u64]) -> u64 {
            let mut sum = 0u64;
            let mut product = 1u64;
            for (i, &v) in values.iter().enumerate() {
                refill_return_stack();
                sum = sum.wrapping_add(v * i as u64);
                product = product.wrapping_mul(v | 1);
                refill_return_stack();
            }
            sum ^ product
        }
        let values: Vec<u64> = (1..=1000).map(|v| v * 2_654_435_761).collect();
        let expected = values
            .iter()
            .enumerate()
            .fold((0u64, 1u64), |(s, p), (i, &v)| {
                (s.wrapping_add(v * i as u64), p.wrapping_mul(v | 1))
            });
        assert_eq!(sum_with_refills(&values), expected.0 ^ expected.1);
    }
}
