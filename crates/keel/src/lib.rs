//! keel: a serializable, multi-version, transactional key-value store.
//!
//! ```
//! let db = keel::Db::in_memory();
//! let mut txn = db.begin()?;
//! txn.put(b"alice", b"10")?;
//! txn.add(b"likes:42", 1)?;
//! assert_eq!(txn.get(b"likes:42")?, Some(b"1".to_vec()));
//! match txn.commit()? {
//!     Ok(commit_ts) => println!("committed at {commit_ts:?}"),
//!     Err(conflict) => println!("retry: {conflict}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Guarantees: read-write transactions are strictly serializable; range reads are
//! phantom-safe; read-only [`Snapshot`]s never block and never abort; commutative operations
//! ([`Txn::add`], [`Txn::max`], [`Txn::min`], [`Txn::put_ordered`], [`Txn::top_k_insert`],
//! [`Txn::score_add`]) never conflict with each other; nothing uncommitted is ever visible.
//! Every bound is in [`limits`].
//! See `ARCHITECTURE.md` for how.

mod check;
mod checkpoint;
mod commutative;
mod concurrency;
mod db;
mod error;
mod gc;
mod index;
mod io;
pub mod limits;
mod memory;
mod mvcc;
mod replay;
mod split;
mod store;
mod txn;
mod wal;

pub use check::{CheckReport, check};
pub use commutative::{
    decode_ordered, decode_score, decode_score_value, decode_top_k, encode_ordered, encode_score,
    parse_int,
};
pub use db::{
    CheckpointError, CheckpointInfo, CloseError, Db, Options, Recovery, Stats, VisibleAt,
};
pub use error::{
    BeginError, CommitError, Conflict, ConflictReason, Error, Limit, OpenError, TransactError,
};
pub use io::{AppendFile, Disk, Fault, FileBytes, OsDisk, SimDisk};
pub use split::{Joined, SplitMode};
pub use txn::{
    CommitFuture, Committed, PrepareFuture, Prepared, Range, Resolved, Scan, Snapshot, Ticket, Txn,
};
pub use wal::{Durability, LogFailed, LogFlush, LogWritten};

/// A commit timestamp. Commits are totally ordered by it, and that order is a serial order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ts(pub u64);
