//! The cluster: a primary that supervises worker processes (issue in progress).
//!
//! Present so far: `supervision`, the restart policy every supervisor of nodus uses (`nodus run`,
//! `nodus serve --workers N`): OTP's restart intensity over one budget per primary, per-slot
//! exponential backoff, and restart types. It decides; the process code acts.

pub mod supervision;

pub use supervision::{
    Backoff, Decision, ExitReason, GIVE_UP_EXIT_CODE, RestartBudget, RestartPolicy, RestartType,
    SlotHistory,
};
