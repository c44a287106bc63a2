//! Error types. A conflict is not an error: [`Txn::commit`](crate::Txn::commit) returns it as
//! the inner `Err` of `Ok(Result<Ts, Conflict>)`, so that `?` never swallows a retryable outcome.

use std::fmt;

/// Which limit from [`limits`](crate::limits) an operation would have exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// [`KEY_BYTES_MAX`](crate::limits::KEY_BYTES_MAX)
    KeyBytes,
    /// [`VALUE_BYTES_MAX`](crate::limits::VALUE_BYTES_MAX)
    ValueBytes,
    /// [`TXN_WRITE_BYTES_MAX`](crate::limits::TXN_WRITE_BYTES_MAX)
    TxnWriteBytes,
    /// [`TXN_WRITE_KEYS_MAX`](crate::limits::TXN_WRITE_KEYS_MAX)
    TxnWriteKeys,
    /// [`TXN_READS_MAX`](crate::limits::TXN_READS_MAX)
    TxnReads,
    /// [`OPEN_TXNS_MAX`](crate::limits::OPEN_TXNS_MAX)
    OpenTxns,
    /// [`TOP_K_MAX`](crate::limits::TOP_K_MAX)
    TopK,
    /// [`PREPARE_META_BYTES_MAX`](crate::limits::PREPARE_META_BYTES_MAX)
    PrepareMetaBytes,
}

impl Limit {
    /// The limit's value.
    pub fn max(self) -> usize {
        use crate::limits::*;
        match self {
            Limit::KeyBytes => KEY_BYTES_MAX,
            Limit::ValueBytes => VALUE_BYTES_MAX,
            Limit::TxnWriteBytes => TXN_WRITE_BYTES_MAX,
            Limit::TxnWriteKeys => TXN_WRITE_KEYS_MAX,
            Limit::TxnReads => TXN_READS_MAX,
            Limit::OpenTxns => OPEN_TXNS_MAX,
            Limit::TopK => TOP_K_MAX as usize,
            Limit::PrepareMetaBytes => PREPARE_META_BYTES_MAX,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Limit::KeyBytes => "key size",
            Limit::ValueBytes => "value size",
            Limit::TxnWriteBytes => "bytes written by one transaction",
            Limit::TxnWriteKeys => "keys written by one transaction",
            Limit::TxnReads => "reads remembered by one transaction",
            Limit::OpenTxns => "open transactions",
            Limit::TopK => "top-k list length",
            Limit::PrepareMetaBytes => "bytes of a prepared transaction's metadata",
        };
        write!(f, "{name} (at most {})", self.max())
    }
}

/// An operation inside a transaction failed. The transaction is unchanged by the failed call
/// and may go on, except where a variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operation would exceed a documented limit.
    #[error("limit exceeded: {limit}; the operation asked for {requested}")]
    LimitExceeded {
        /// Which limit.
        limit: Limit,
        /// What the operation needed.
        requested: usize,
    },
    /// An integer operation (`add`, `max`, `min`) met a value that is not a decimal `i64`.
    #[error("value of key {} is not an integer", crate::error::show_key(key))]
    NotAnInteger {
        /// The key whose value is not an integer.
        key: Vec<u8>,
    },
    /// `add` would overflow `i64`.
    #[error(
        "increment or decrement of key {} would overflow",
        crate::error::show_key(key)
    )]
    Overflow {
        /// The key whose value would overflow.
        key: Vec<u8>,
    },
    /// A top-k insert met a value that is not a top-k list.
    #[error("value of key {} is not a top-k list", crate::error::show_key(key))]
    NotATopK {
        /// The key.
        key: Vec<u8>,
    },
    /// An ordered put met a value that was not written by an ordered put.
    #[error("value of key {} is not an ordered value", crate::error::show_key(key))]
    NotOrdered {
        /// The key.
        key: Vec<u8>,
    },
    /// A score add met a value that is not an encoded score (8 bytes).
    #[error("value of key {} is not a score", crate::error::show_key(key))]
    NotAScore {
        /// The key.
        key: Vec<u8>,
    },
    /// A score add was given NaN, or its sum is not a number (`inf` plus `-inf`).
    #[error(
        "score of key {} would not be a number (NaN)",
        crate::error::show_key(key)
    )]
    NotANumber {
        /// The key (empty when the increment itself was NaN).
        key: Vec<u8>,
    },
}

/// [`Db::begin`](crate::Db::begin) or [`Db::snapshot`](crate::Db::snapshot) could not open a
/// transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BeginError {
    /// [`OPEN_TXNS_MAX`](crate::limits::OPEN_TXNS_MAX) transactions are already open.
    #[error(
        "too many open transactions: at most {} may be open at once",
        crate::limits::OPEN_TXNS_MAX
    )]
    TooManyOpen,
}

/// A commit failed for a reason other than a conflict. Nothing the transaction wrote is
/// visible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// A commutative operation could not be applied to the committed value.
    #[error(transparent)]
    Apply(#[from] Error),
    /// The write-ahead log failed: this commit is not durable (it may or may not survive a
    /// restart) and the database accepts no more writes until it is reopened.
    #[error(transparent)]
    Log(#[from] crate::wal::LogFailed),
}

/// Why a transaction lost a conflict and was aborted. Retrying it may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The key on which the conflict was found.
    pub key: Vec<u8>,
    /// What kind of conflict.
    pub reason: ConflictReason,
}

/// The kinds of conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConflictReason {
    /// Another transaction held the lock of a key this one writes.
    WriteLocked,
    /// A key this transaction read was changed (or is being changed) since its snapshot.
    ReadChanged,
    /// A key inside a range this transaction scanned was inserted, deleted or changed.
    Phantom,
    /// A key this transaction read (or scanned) is split: it changes on per-core slices
    /// until the next reconciliation. [`Db::transact`](crate::Db::transact) waits for the
    /// joined phase before it retries; a hand-written retry loop can call
    /// [`Db::wait_joined`](crate::Db::wait_joined).
    Split,
    /// A key this transaction writes, or read and another changes, is held by a transaction
    /// prepared in a two-phase commit ([`Txn::prepare`](crate::Txn::prepare)) until its
    /// decision, which may take a network round trip or a recovery: the commit did not wait
    /// for it. [`Db::transact`](crate::Db::transact) waits for the decision before it
    /// retries; a hand-written retry loop can call
    /// [`Db::wait_decided`](crate::Db::wait_decided).
    Prepared,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.reason {
            ConflictReason::WriteLocked => "write-write conflict",
            ConflictReason::ReadChanged => "read-write conflict",
            ConflictReason::Phantom => "phantom in a scanned range",
            ConflictReason::Split => "read of a split (contended) key",
            ConflictReason::Prepared => "key held by a prepared two-phase commit",
        };
        write!(f, "{what} on key {}", show_key(&self.key))
    }
}

impl std::error::Error for Conflict {}

/// [`Db::transact`](crate::Db::transact) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactError<E> {
    /// The closure returned an error; the transaction was aborted.
    #[error("transaction aborted by its body: {0}")]
    Aborted(E),
    /// The transaction could not begin.
    #[error(transparent)]
    Begin(#[from] BeginError),
    /// The commit failed for a reason other than a conflict.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// Every attempt conflicted.
    #[error("gave up after {attempts} attempts; last conflict: {last}")]
    Conflicts {
        /// How many attempts were made.
        attempts: u32,
        /// The conflict of the last attempt.
        last: Conflict,
    },
}

/// Keys in messages: printable ASCII as is, anything else escaped, long keys shortened.
pub(crate) fn show_key(key: &[u8]) -> String {
    const SHOWN_MAX: usize = 64;
    let mut out = String::from("\"");
    for &b in key.iter().take(SHOWN_MAX) {
        out.extend(std::ascii::escape_default(b).map(char::from));
    }
    out.push('"');
    if key.len() > SHOWN_MAX {
        out.push_str(&format!("... ({} bytes)", key.len()));
    }
    out
}

/// [`Db::open`](crate::Db::open) (or `keel check`) could not open a database directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A file is damaged where damage cannot be a torn tail.
    #[error("{}: damaged at offset {offset}: {reason}", file.display())]
    Damaged {
        /// The damaged file.
        file: std::path::PathBuf,
        /// Byte offset of the first damage.
        offset: u64,
        /// What is wrong there.
        reason: String,
    },
    /// A file was written by a newer keel.
    #[error("{}: format version {found} is newer than this keel supports ({supported})", file.display())]
    NewerFormat {
        /// The file.
        file: std::path::PathBuf,
        /// Its version.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The directory holds files that are not keel's.
    #[error("{}: not a keel data directory (it holds {example:?} and no keel MANIFEST)", dir.display())]
    NotKeel {
        /// The directory.
        dir: std::path::PathBuf,
        /// One of the foreign files.
        example: String,
    },
    /// Another process has the directory open.
    #[error("{}: already opened by another process (LOCK is held)", dir.display())]
    Locked {
        /// The directory.
        dir: std::path::PathBuf,
    },
}

impl OpenError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> OpenError {
        OpenError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
