//! Integration tests of `keel-cluster`: the deterministic simulation of two-phase commit
//! (`sim`), checked with the engine's serializability checker (`history`).

#[path = "../../../keel/tests/it/history.rs"]
#[allow(
    dead_code,
    reason = "the engine's checker; its other helpers serve the engine tests"
)]
mod history;
mod sim;
