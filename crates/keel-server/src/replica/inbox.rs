//! The receiving end of a snapshot's transfer: the chunks of the leader's `install_snapshot`
//! RPCs written into one file (`snapfile::SnapData`), which is read through whole before
//! openraft is given it to install (`Raft::install_full_snapshot`).
//!
//! openraft 0.9's own receiver (`Raft::install_snapshot`) writes each chunk at its offset,
//! and starts a new file on a first chunk (offset 0) of any snapshot other than the one it is
//! receiving, which is none once a transfer finished. With messages duplicated and delayed,
//! that assembles files with holes: a late copy of a finished transfer's first chunk starts a
//! file, a late copy of its last chunk "finishes" it, and the install refuses the damaged
//! file, which stops openraft for good (`replica::sim::across`, seed 101). Here:
//!
//! - a chunk is written only where the file being received ends. One over bytes already
//!   received is acknowledged if it repeats them (a duplicate); one past the end, or one
//!   that differs (the file is dropped), is refused with openraft's `SnapshotMismatch`, on
//!   which the sender starts the snapshot over from its first chunk, and the repeats are
//!   acknowledged until it reaches the end of what was received;
//! - chunks of a snapshot no newer than what this replica has committed (one it installed,
//!   or caught up past through its log) are acknowledged and not written: openraft would
//!   skip their install, and a copy arriving late starts no file;
//! - the last chunk's file is read through (`machine::verify_received`) before openraft sees
//!   it: a damaged one is dropped and refused as above, so the leader sends the snapshot
//!   again, and an install, whose failure stops openraft, only meets a file that checked;
//! - chunks that come while a file is checked and installed wait for the install, so no
//!   reception begins in between (see `receive`).
//!
//! A failed read or write of the local file is answered as openraft's receiver answers it (a
//! storage error, which ends the leader's transfer, not this replica's Raft) and drops the
//! file; one that shows only when the file is flushed at the end is handled as damage.

use std::io::SeekFrom;

use openraft::error::{InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use openraft::storage::Snapshot;
use openraft::{ErrorSubject, ErrorVerb, SnapshotSegmentId, StorageError, Vote};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::snapfile::{Meta, SnapData};
use super::{Raft, Tc, machine};

type Answer = Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>;

/// A replica's receiving end (one per running Raft): the snapshot being received, if any.
#[derive(Clone, Default)]
pub struct Inbox(std::sync::Arc<tokio::sync::Mutex<Option<Incoming>>>);

/// A snapshot being received.
struct Incoming {
    meta: Meta,
    /// The vote of the leader sending it.
    vote: Vote<u64>,
    data: Box<SnapData>,
    /// How many bytes were received, from the start, without a gap.
    end: u64,
}

impl Inbox {
    /// Serves one `install_snapshot` RPC for `raft`, this inbox's replica.
    pub async fn receive(&self, raft: &Raft, req: InstallSnapshotRequest<Tc>) -> Answer {
        let (vote, committed) = raft
            .with_raft_state(|st| (*st.vote_ref(), st.committed))
            .await
            .map_err(RaftError::Fatal)?;
        let ack = Ok(InstallSnapshotResponse { vote });
        // As openraft's receiver: a sender whose vote is behind learns the newer one.
        let current = req.vote >= vote;
        if !current {
            return ack;
        }
        let mut incoming = self.0.lock().await;
        if req.meta.last_log_id <= committed {
            if incoming
                .as_ref()
                .is_some_and(|i| i.meta.last_log_id <= committed)
            {
                *incoming = None;
            }
            return ack;
        }
        let (id, offset, len) = (&req.meta.snapshot_id, req.offset, req.data.len() as u64);
        let receiving = incoming.as_ref().map(|i| (&i.meta, i.vote, i.end));
        match receiving {
            Some((meta, _, _)) if meta.snapshot_id == *id => {}
            _ if offset != 0 => return Err(mismatch(id, 0, offset)),
            // A late copy of the first chunk of an older snapshot than the one its leader is
            // sending now.
            Some((meta, from, end))
                if from == req.vote && req.meta.last_log_id < meta.last_log_id =>
            {
                return Err(mismatch(&meta.snapshot_id, end, offset));
            }
            _ => {
                // The file of the one it replaces goes.
                *incoming = None;
                let data = raft
                    .begin_receiving_snapshot()
                    .await
                    .map_err(|e| RaftError::Fatal(e.into_fatal().expect("only a fatal error")))?;
                *incoming = Some(Incoming {
                    meta: req.meta.clone(),
                    vote: req.vote,
                    data,
                    end: 0,
                });
            }
        }
        let i = incoming.as_mut().expect("set above");
        if offset > i.end {
            return Err(mismatch(id, i.end, offset));
        }
        // Bytes before the end must repeat what was received; those after it are written.
        let repeated = (i.end - offset).min(len) as usize;
        let written = match write(i, offset, &req.data, repeated).await {
            Ok(written) => written,
            Err(e) => {
                *incoming = None;
                return Err(StorageError::from_io_error(
                    ErrorSubject::Snapshot(Some(req.meta.signature())),
                    ErrorVerb::Write,
                    e,
                )
                .into());
            }
        };
        if !written {
            tracing::warn!(
                "snapshot {id}: the chunk at {offset} differs from the bytes received there; \
                 starting over"
            );
            *incoming = None;
            return Err(mismatch(id, 0, offset));
        }
        if !req.done {
            return ack;
        }
        // The inbox stays locked until the install is over: a next snapshot's reception does
        // not begin during it. The state machine's `begin_receiving_snapshot` and the end of
        // an install mark whether a snapshot is on its way, which the log's purges wait for
        // (`machine::Durable`); a reception begun while this file was checked, before its
        // install started, was marked over by that install's end, and the purge openraft
        // made as it accepted the next snapshot did not wait for its file: a crash then left
        // the log cut past the data ("try to get log at index 130 but got None",
        // `replica::sim::across` seed 9204).
        let Incoming {
            meta, data, end, ..
        } = incoming.take().expect("set above");
        if offset + len != end {
            return Err(mismatch(id, 0, offset));
        }
        let data = match finish(data, &meta).await {
            Ok(data) => data,
            Err(why) => {
                tracing::warn!("snapshot {id} received damaged, dropped; starting over: {why}");
                return Err(mismatch(id, 0, offset));
            }
        };
        let snapshot = Snapshot {
            meta,
            snapshot: data,
        };
        let resp = raft
            .install_full_snapshot(req.vote, snapshot)
            .await
            .map_err(RaftError::Fatal)?;
        Ok(resp.into())
    }
}

/// Writes `chunk` (at `offset`, at most `i.end`) to `i`: its first `repeated` bytes must be
/// those received there already (then false, nothing written); the rest go at the end.
async fn write(
    i: &mut Incoming,
    offset: u64,
    chunk: &[u8],
    repeated: usize,
) -> std::io::Result<bool> {
    if repeated > 0 {
        let mut held = vec![0; repeated];
        i.data.seek(SeekFrom::Start(offset)).await?;
        i.data.read_exact(&mut held).await?;
        i.data.seek(SeekFrom::Start(i.end)).await?;
        if held != chunk[..repeated] {
            return Ok(false);
        }
    }
    let new = &chunk[repeated..];
    if !new.is_empty() {
        i.data.write_all(new).await?;
        i.end += new.len() as u64;
    }
    Ok(true)
}

/// The received file, flushed and checked whole; why it is refused.
async fn finish(mut data: Box<SnapData>, meta: &Meta) -> Result<Box<SnapData>, String> {
    data.shutdown()
        .await
        .map_err(|e| format!("writing the received file: {e}"))?;
    machine::verify_received(data, meta).await
}

/// Refuses a chunk at `got` of snapshot `id`, expecting `expect`: the sender starts over.
fn mismatch(id: &str, expect: u64, got: u64) -> RaftError<u64, InstallSnapshotError> {
    RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
        expect: SnapshotSegmentId {
            id: id.to_string(),
            offset: expect,
        },
        got: SnapshotSegmentId {
            id: id.to_string(),
            offset: got,
        },
    }))
}
