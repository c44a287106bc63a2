//! Every bound the engine enforces, in one place, each with the reason for its value.
//!
//! Exceeding one of these is never a panic: the operation returns
//! [`Error::LimitExceeded`](crate::Error::LimitExceeded) naming the limit, and the transaction
//! is left exactly as it was before the call.

/// Keys are compared, hashed and copied on every access; 64 KiB is far above any sane key and
/// keeps a key comfortably inside one log record header's `u32` length.
pub const KEY_BYTES_MAX: usize = 64 * 1024;

/// A value must fit in one log record without splitting, and a reader copies it whole.
/// Redis allows 512 MiB; keel is stricter because every version is held in memory.
pub const VALUE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The buffered writes of one transaction (keys plus values) are held in memory until commit
/// and written as one log frame, which must fit in the log's 64 MiB in-memory ring.
pub const TXN_WRITE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Distinct keys one transaction may write. Each is locked at commit; more than this would
/// hold locks long enough to starve everyone else.
pub const TXN_WRITE_KEYS_MAX: usize = 1 << 16;

/// Point reads plus scanned ranges one transaction may remember for validation.
pub const TXN_READS_MAX: usize = 1 << 24;

/// Transactions and snapshots open at the same time. Each holds one slot in the snapshot
/// registry, which garbage collection scans to find the oldest visible timestamp.
pub const OPEN_TXNS_MAX: usize = 4096;

/// Attempts [`Db::transact`](crate::Db::transact) makes before reporting the conflict.
pub const TRANSACT_ATTEMPTS_MAX: u32 = 64;
/// How long [`Db::transact`](crate::Db::transact) waits, each time, for the decision of a
/// prepared transaction that holds a key it needs before it tries again.
pub const DECISION_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Top-k lists keep at most this many members; the whole list is one value.
pub const TOP_K_MAX: u32 = 4096;

/// The metadata a prepared transaction keeps with its writes ([`Txn::prepare`]).
///
/// [`Txn::prepare`]: crate::Txn::prepare
pub const PREPARE_META_BYTES_MAX: usize = 1 << 20;

const _: () = assert!(KEY_BYTES_MAX < VALUE_BYTES_MAX);
const _: () = assert!(KEY_BYTES_MAX + VALUE_BYTES_MAX <= TXN_WRITE_BYTES_MAX);
const _: () = assert!(TXN_WRITE_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(OPEN_TXNS_MAX.is_power_of_two());
