//! Integration tests of the engine: one binary, one module per concern.

mod bank;
mod basics;
mod concurrent;
mod gc;
mod history;
mod index_growth;
mod limits;
mod model;
mod prepare;
mod presence;
mod reclaim;
mod score;
mod split;
mod track;
mod write_skew;

/// Sets the flag when dropped, so that a failing assertion stops the threads that run until
/// it is set instead of leaving the test hanging on them.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
