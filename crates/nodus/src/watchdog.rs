//! TEMPORARY STUB, replaced by the watchdog helper's file.
use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;
pub(crate) struct LoopSlot;
impl LoopSlot {
    pub(crate) fn new(_loop_id: u64, _t: Duration) -> Arc<LoopSlot> {
        Arc::new(LoopSlot)
    }
    pub(crate) fn begin(&self, _: u64, _: &'static str, _: &'static Location<'static>, _: u64) {}
    pub(crate) fn end(&self) {}
    pub(crate) fn enter_idle(&self) {}
    pub(crate) fn leave_idle(&self) {}
}
pub(crate) fn register(_slot: &Arc<LoopSlot>) {}
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StallReport {
    pub loop_id: u64,
    pub task_id: u64,
    pub task_name: String,
    pub location: String,
    pub elapsed_seconds: f64,
    pub class: String,
    pub on_cpu_share: f64,
    pub waiting_for_cpu_share: f64,
    pub at_unix_ms: u64,
    pub ongoing: bool,
}
pub fn recent_stalls() -> Vec<StallReport> {
    Vec::new()
}
pub fn recent_stalls_for(_: u64) -> Vec<StallReport> {
    Vec::new()
}
