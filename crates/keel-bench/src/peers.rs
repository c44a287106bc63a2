//! The peer engines keel is compared with (cargo feature `peers`): RocksDB's optimistic and
//! pessimistic transactions, fjall's optimistic transactions, redb and LMDB (heed).
//!
//! Each runs at its strongest isolation. Reads inside read-write transactions are
//! conflict-checked so that every peer is serializable: RocksDB reads with `get_for_update`
//! (the optimistic DB validates those keys at commit against the transaction's snapshot; the
//! pessimistic DB locks them, with deadlock detection), fjall tracks reads itself, and redb
//! and LMDB allow one writer at a time. Read-only transactions read a snapshot. Every peer
//! keeps its files in a fresh temporary directory that is deleted when the target is dropped.

use anyhow::Context as _;
use tempfile::TempDir;

use crate::target::{
    Durability, Engine, Fail, Open, Step, Target, Tx, Worker, embedded_worker, key_bytes,
};

/// Opens the peer called `name` (one of [`crate::target::PEERS`]).
pub fn open(name: &str, open: &Open) -> anyhow::Result<Box<dyn Target>> {
    std::fs::create_dir_all(&open.dir)
        .with_context(|| format!("creating {}", open.dir.display()))?;
    let dir = tempfile::Builder::new()
        .prefix(&format!("keel-bench-{name}-"))
        .tempdir_in(&open.dir)
        .with_context(|| format!("making a temporary directory in {}", open.dir.display()))?;
    match name {
        "rocksdb-occ" => Ok(Box::new(rocks::Occ::open(dir, open)?)),
        "rocksdb-pess" => Ok(Box::new(rocks::Pess::open(dir, open)?)),
        "fjall" => Ok(Box::new(Fjall::open(dir, open)?)),
        "redb" => Ok(Box::new(Redb::open(dir, open)?)),
        "lmdb" => Ok(Box::new(Lmdb::open(dir, open)?)),
        _ => anyhow::bail!("unknown peer {name:?}"),
    }
}

fn run_body(body: &mut dyn FnMut(&mut dyn Tx) -> Step, tx: &mut dyn Tx) -> anyhow::Result<bool> {
    match body(tx) {
        Ok(()) => Ok(true),
        Err(Fail::Conflict) => Ok(false),
        Err(Fail::Error(e)) => Err(e),
    }
}

fn read_only_violation() -> Fail {
    Fail::Error(anyhow::anyhow!("a read-only transaction tried to write"))
}

use redb::{ReadableDatabase as _, ReadableTable as _};

mod rocks {
    use super::*;
    use rocksdb::{
        BlockBasedOptions, Cache, Direction, ErrorKind, IteratorMode, OptimisticTransactionDB,
        OptimisticTransactionOptions, Options, SnapshotWithThreadMode, Transaction, TransactionDB,
        TransactionDBOptions, TransactionOptions, WriteOptions,
    };
    use std::path::Path;
    use std::sync::{Mutex, OnceLock};

    fn options() -> anyhow::Result<Options> {
        let mut o = Options::default();
        o.create_if_missing(true);
        o.increase_parallelism(2);
        // A block cache that holds the whole data set, as keel holds it in memory.
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&Cache::new_lru_cache(4 << 30).context("RocksDB block cache")?);
        // Bloom filters keep a point read from probing every level-0 file the load left.
        table.set_bloom_filter(10.0, false);
        o.set_block_based_table_factory(&table);
        Ok(o)
    }

    fn write_options(d: Durability) -> WriteOptions {
        let mut w = WriteOptions::default();
        match d {
            Durability::None => w.disable_wal(true),
            Durability::Async => w.set_sync(false),
            Durability::Sync => w.set_sync(true),
        }
        w
    }

    /// A RocksDB status that means "another transaction won; retry".
    fn conflict_or_error(e: rocksdb::Error) -> Fail {
        match e.kind() {
            ErrorKind::Busy | ErrorKind::TryAgain | ErrorKind::TimedOut => Fail::Conflict,
            _ => Fail::Error(anyhow::Error::new(e).context("RocksDB")),
        }
    }

    struct RocksTx<'t, 'db, D> {
        txn: &'t Transaction<'db, D>,
        snapshot: Option<SnapshotWithThreadMode<'t, Transaction<'db, D>>>,
    }

    impl<D> Tx for RocksTx<'_, '_, D> {
        fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
            let k = key_bytes(key);
            match &self.snapshot {
                Some(s) => {
                    let v = s.get_pinned(k).map_err(conflict_or_error)?;
                    f(v.as_deref());
                }
                None => {
                    // Conflict-checked read: the key joins the validated (or locked) set.
                    let v = self
                        .txn
                        .get_pinned_for_update(k, true)
                        .map_err(conflict_or_error)?;
                    f(v.as_deref());
                }
            }
            Ok(())
        }
        fn write(&mut self, key: u64, value: &[u8]) -> Step {
            if self.snapshot.is_some() {
                return Err(read_only_violation());
            }
            self.txn
                .put(key_bytes(key), value)
                .map_err(conflict_or_error)
        }
        fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
            let s = self
                .snapshot
                .as_ref()
                .ok_or_else(|| Fail::Error(anyhow::anyhow!("scans run read-only")))?;
            let k = key_bytes(start);
            for item in s
                .iterator(IteratorMode::From(&k, Direction::Forward))
                .take(len as usize)
            {
                let (k, v) = item.map_err(conflict_or_error)?;
                f(&k, &v);
            }
            Ok(())
        }
    }

    fn transaction<D>(
        txn: Transaction<'_, D>,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        let ok = {
            let snapshot = read_only.then(|| txn.snapshot());
            let mut tx = RocksTx {
                txn: &txn,
                snapshot,
            };
            run_body(body, &mut tx)?
        };
        if !ok {
            txn.rollback().context("RocksDB rollback")?;
            return Ok(false);
        }
        if read_only {
            return Ok(true);
        }
        match txn.commit() {
            Ok(()) => Ok(true),
            Err(e) => match conflict_or_error(e) {
                Fail::Conflict => Ok(false),
                Fail::Error(e) => Err(e),
            },
        }
    }

    /// RocksDB `OptimisticTransactionDB`.
    pub struct Occ {
        db: Lazy<OptimisticTransactionDB>,
        durability: Durability,
    }

    impl Occ {
        pub fn open(dir: TempDir, open: &Open) -> anyhow::Result<Occ> {
            Ok(Occ {
                db: Lazy::new(dir),
                durability: open.durability,
            })
        }

        fn db(&self) -> anyhow::Result<&OptimisticTransactionDB> {
            self.db.get(|path| {
                OptimisticTransactionDB::open(&options()?, path)
                    .context("opening RocksDB OptimisticTransactionDB")
            })
        }
    }

    struct OccEngine<'a> {
        db: &'a OptimisticTransactionDB,
        write: WriteOptions,
        rw: OptimisticTransactionOptions,
        ro: OptimisticTransactionOptions,
    }

    impl Engine for OccEngine<'_> {
        fn transaction(
            &mut self,
            read_only: bool,
            body: &mut dyn FnMut(&mut dyn Tx) -> Step,
        ) -> anyhow::Result<bool> {
            let opts = if read_only { &self.ro } else { &self.rw };
            transaction(self.db.transaction_opt(&self.write, opts), read_only, body)
        }
    }

    impl Target for Occ {
        fn name(&self) -> String {
            "rocksdb-occ".into()
        }
        fn isolation(&self) -> &'static str {
            "serializable (OCC; every read is get_for_update, validated at commit)"
        }
        fn durability(&self) -> &'static str {
            self.durability.name()
        }
        fn load(
            &self,
            records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
            progress: &mut dyn FnMut(u64),
        ) -> anyhow::Result<()> {
            self.db.load(records, progress)?;
            self.db().map(drop)
        }
        fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
            let mut rw = OptimisticTransactionOptions::default();
            // Validate reads against the snapshot taken at begin.
            rw.set_snapshot(true);
            let mut ro = OptimisticTransactionOptions::default();
            ro.set_snapshot(true);
            Ok(embedded_worker(
                OccEngine {
                    db: self.db()?,
                    write: write_options(self.durability),
                    rw,
                    ro,
                },
                thread,
            ))
        }
        fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
            self.db()?.get(key_bytes(key)).context("RocksDB get")
        }
    }

    /// RocksDB `TransactionDB` (pessimistic, two-phase locking).
    pub struct Pess {
        db: Lazy<TransactionDB>,
        durability: Durability,
    }

    impl Pess {
        pub fn open(dir: TempDir, open: &Open) -> anyhow::Result<Pess> {
            Ok(Pess {
                db: Lazy::new(dir),
                durability: open.durability,
            })
        }

        fn db(&self) -> anyhow::Result<&TransactionDB> {
            self.db.get(|path| {
                TransactionDB::open(&options()?, &TransactionDBOptions::default(), path)
                    .context("opening RocksDB TransactionDB")
            })
        }
    }

    struct PessEngine<'a> {
        db: &'a TransactionDB,
        write: WriteOptions,
        rw: TransactionOptions,
        ro: TransactionOptions,
    }

    impl Engine for PessEngine<'_> {
        fn transaction(
            &mut self,
            read_only: bool,
            body: &mut dyn FnMut(&mut dyn Tx) -> Step,
        ) -> anyhow::Result<bool> {
            let opts = if read_only { &self.ro } else { &self.rw };
            transaction(self.db.transaction_opt(&self.write, opts), read_only, body)
        }
    }

    impl Target for Pess {
        fn name(&self) -> String {
            "rocksdb-pess".into()
        }
        fn isolation(&self) -> &'static str {
            "serializable (2PL; every read is get_for_update, locked; deadlock detection)"
        }
        fn durability(&self) -> &'static str {
            self.durability.name()
        }
        fn load(
            &self,
            records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
            progress: &mut dyn FnMut(u64),
        ) -> anyhow::Result<()> {
            self.db.load(records, progress)?;
            self.db().map(drop)
        }
        fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
            let mut rw = TransactionOptions::default();
            // Deadlocks (reads and writes lock keys in stream order) abort one side at once
            // instead of waiting for the lock timeout.
            rw.set_deadlock_detect(true);
            let mut ro = TransactionOptions::default();
            ro.set_snapshot(true);
            Ok(embedded_worker(
                PessEngine {
                    db: self.db()?,
                    write: write_options(self.durability),
                    rw,
                    ro,
                },
                thread,
            ))
        }
        fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
            self.db()?.get(key_bytes(key)).context("RocksDB get")
        }
    }

    /// A RocksDB transaction database opened after the initial load. The load goes
    /// through a plain `DB` without the write-ahead log and ends with a full compaction, so
    /// the timed runs start from a settled LSM tree instead of paying for the load's
    /// flushes and compactions (write stalls); `rocksdb` 0.20 cannot compact a
    /// `TransactionDB` itself.
    pub struct Lazy<T> {
        db: OnceLock<T>,
        opening: Mutex<()>,
        dir: TempDir,
    }

    impl<T> Lazy<T> {
        fn new(dir: TempDir) -> Lazy<T> {
            Lazy {
                db: OnceLock::new(),
                opening: Mutex::new(()),
                dir,
            }
        }

        fn get(&self, open: impl FnOnce(&Path) -> anyhow::Result<T>) -> anyhow::Result<&T> {
            if let Some(db) = self.db.get() {
                return Ok(db);
            }
            let _opening = self
                .opening
                .lock()
                .map_err(|_| anyhow::anyhow!("a RocksDB open panicked"))?;
            if let Some(db) = self.db.get() {
                return Ok(db);
            }
            let db = open(self.dir.path())?;
            Ok(self.db.get_or_init(|| db))
        }

        fn load(
            &self,
            records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
            progress: &mut dyn FnMut(u64),
        ) -> anyhow::Result<()> {
            anyhow::ensure!(
                self.db.get().is_none(),
                "RocksDB targets load once, before their first transaction"
            );
            let db = rocksdb::DB::open(&options()?, self.dir.path())
                .context("opening RocksDB for the load")?;
            let mut no_wal = WriteOptions::default();
            no_wal.disable_wal(true);
            let mut done = 0u64;
            loop {
                let mut batch = rocksdb::WriteBatch::default();
                for (k, v) in (&mut *records).take(10_000) {
                    batch.put(key_bytes(k), v);
                }
                if batch.is_empty() {
                    break;
                }
                done += batch.len() as u64;
                db.write_opt(batch, &no_wal).context("RocksDB load")?;
                progress(done);
            }
            db.flush().context("RocksDB flush after load")?;
            db.compact_range::<&[u8], &[u8]>(None, None);
            Ok(())
        }
    }
}

/// fjall's optimistic transactions (serializable: reads are tracked and validated).
struct Fjall {
    db: fjall::OptimisticTxDatabase,
    keyspace: fjall::Keyspace,
    durability: Durability,
    _dir: TempDir,
}

impl Fjall {
    fn open(dir: TempDir, open: &Open) -> anyhow::Result<Fjall> {
        let db = fjall::OptimisticTxDatabase::builder(dir.path())
            .cache_size(4 << 30)
            .open()
            .context("opening fjall")?;
        let keyspace = db
            .keyspace("bench", fjall::KeyspaceCreateOptions::default)
            .context("opening the fjall keyspace")?
            .inner()
            .clone();
        Ok(Fjall {
            db,
            keyspace,
            durability: open.durability,
            _dir: dir,
        })
    }

    fn persist(&self) -> Option<fjall::PersistMode> {
        match self.durability {
            Durability::None => None,
            Durability::Async => Some(fjall::PersistMode::Buffer),
            Durability::Sync => Some(fjall::PersistMode::SyncAll),
        }
    }
}

struct FjallWrite<'a> {
    tx: fjall::OptimisticWriteTx,
    keyspace: &'a fjall::Keyspace,
}

struct FjallRead<'a> {
    snapshot: fjall::Snapshot,
    keyspace: &'a fjall::Keyspace,
}

fn fjall_err(e: fjall::Error) -> Fail {
    Fail::Error(anyhow::Error::new(e).context("fjall"))
}

impl Tx for FjallWrite<'_> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        use fjall::Readable as _;
        let v = self
            .tx
            .get(self.keyspace, key_bytes(key))
            .map_err(fjall_err)?;
        f(v.as_deref());
        Ok(())
    }
    fn write(&mut self, key: u64, value: &[u8]) -> Step {
        self.tx.insert(self.keyspace, key_bytes(key), value);
        Ok(())
    }
    fn scan(&mut self, _: u64, _: u32, _: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        Err(Fail::Error(anyhow::anyhow!("scans run read-only")))
    }
}

impl Tx for FjallRead<'_> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        use fjall::Readable as _;
        let v = self
            .snapshot
            .get(self.keyspace, key_bytes(key))
            .map_err(fjall_err)?;
        f(v.as_deref());
        Ok(())
    }
    fn write(&mut self, _: u64, _: &[u8]) -> Step {
        Err(read_only_violation())
    }
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        use fjall::Readable as _;
        for guard in self
            .snapshot
            .range(self.keyspace, key_bytes(start)..)
            .take(len as usize)
        {
            let (k, v) = guard.into_inner().map_err(fjall_err)?;
            f(&k, &v);
        }
        Ok(())
    }
}

struct FjallEngine<'a>(&'a Fjall);

impl Engine for FjallEngine<'_> {
    fn transaction(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        let f = self.0;
        if read_only {
            let mut tx = FjallRead {
                snapshot: f.db.read_tx(),
                keyspace: &f.keyspace,
            };
            return run_body(body, &mut tx);
        }
        let tx =
            f.db.write_tx()
                .context("fjall write_tx")?
                .durability(f.persist());
        let mut tx = FjallWrite {
            tx,
            keyspace: &f.keyspace,
        };
        if !run_body(body, &mut tx)? {
            return Ok(false);
        }
        Ok(tx.tx.commit().context("fjall commit")?.is_ok())
    }
}

impl Target for Fjall {
    fn name(&self) -> String {
        "fjall".into()
    }
    fn isolation(&self) -> &'static str {
        "serializable (fjall optimistic tx: reads tracked, validated at commit)"
    }
    fn durability(&self) -> &'static str {
        self.durability.name()
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        let mut done = 0u64;
        loop {
            let mut tx = self
                .db
                .write_tx()
                .context("fjall write_tx")?
                .durability(self.persist());
            let mut n = 0;
            for (k, v) in (&mut *records).take(10_000) {
                tx.insert(&self.keyspace, key_bytes(k), v);
                n += 1;
            }
            if n == 0 {
                return Ok(());
            }
            tx.commit()
                .context("fjall load commit")?
                .map_err(|_| anyhow::anyhow!("fjall load transaction conflicted"))?;
            done += n;
            progress(done);
        }
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(embedded_worker(FjallEngine(self), thread))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        use fjall::Readable as _;
        Ok(self
            .db
            .read_tx()
            .get(&self.keyspace, key_bytes(key))
            .context("fjall get")?
            .map(|v| v.to_vec()))
    }
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

/// redb: one writer at a time, readers on MVCC snapshots (serializable).
struct Redb {
    db: redb::Database,
    durability: Durability,
    _dir: TempDir,
}

impl Redb {
    fn open(dir: TempDir, open: &Open) -> anyhow::Result<Redb> {
        let db = redb::Database::builder()
            .set_cache_size(4 << 30)
            .create(dir.path().join("bench.redb"))
            .context("creating the redb database")?;
        let redb = Redb {
            db,
            durability: open.durability,
            _dir: dir,
        };
        let w = redb.begin_write()?;
        w.open_table(REDB_TABLE)
            .context("creating the redb table")?;
        w.commit().context("redb commit")?;
        Ok(redb)
    }

    fn begin_write(&self) -> anyhow::Result<redb::WriteTransaction> {
        let mut w = self.db.begin_write().context("redb begin_write")?;
        w.set_durability(match self.durability {
            // redb has no "log without fsync" mode: async commits are not persisted either.
            Durability::None | Durability::Async => redb::Durability::None,
            Durability::Sync => redb::Durability::Immediate,
        })
        .context("redb set_durability")?;
        Ok(w)
    }
}

fn redb_err(e: impl Into<redb::Error>) -> Fail {
    Fail::Error(anyhow::Error::new(e.into()).context("redb"))
}

struct RedbWrite<'a, 't>(&'a mut redb::Table<'t, &'static [u8], &'static [u8]>);
struct RedbRead<'a>(&'a redb::ReadOnlyTable<&'static [u8], &'static [u8]>);

impl Tx for RedbWrite<'_, '_> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        let k = key_bytes(key);
        let v = self.0.get(&k[..]).map_err(redb_err)?;
        f(v.as_ref().map(|v| v.value()));
        Ok(())
    }
    fn write(&mut self, key: u64, value: &[u8]) -> Step {
        let k = key_bytes(key);
        self.0.insert(&k[..], value).map_err(redb_err)?;
        Ok(())
    }
    fn scan(&mut self, _: u64, _: u32, _: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        Err(Fail::Error(anyhow::anyhow!("scans run read-only")))
    }
}

impl Tx for RedbRead<'_> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        let k = key_bytes(key);
        let v = self.0.get(&k[..]).map_err(redb_err)?;
        f(v.as_ref().map(|v| v.value()));
        Ok(())
    }
    fn write(&mut self, _: u64, _: &[u8]) -> Step {
        Err(read_only_violation())
    }
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        let k = key_bytes(start);
        for item in self.0.range(&k[..]..).map_err(redb_err)?.take(len as usize) {
            let (k, v) = item.map_err(redb_err)?;
            f(k.value(), v.value());
        }
        Ok(())
    }
}

struct RedbEngine<'a>(&'a Redb);

impl Engine for RedbEngine<'_> {
    fn transaction(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        if read_only {
            let r = self.0.db.begin_read().context("redb begin_read")?;
            let table = r.open_table(REDB_TABLE).context("redb open_table")?;
            return run_body(body, &mut RedbRead(&table));
        }
        let w = self.0.begin_write()?;
        let ok = {
            let mut table = w.open_table(REDB_TABLE).context("redb open_table")?;
            run_body(body, &mut RedbWrite(&mut table))?
        };
        if !ok {
            w.abort().context("redb abort")?;
            return Ok(false);
        }
        w.commit().context("redb commit")?;
        Ok(true)
    }
}

impl Target for Redb {
    fn name(&self) -> String {
        "redb".into()
    }
    fn isolation(&self) -> &'static str {
        "serializable (one writer at a time; readers on snapshots)"
    }
    fn durability(&self) -> &'static str {
        self.durability.name()
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        let mut done = 0u64;
        loop {
            let w = self.begin_write()?;
            let mut n = 0;
            {
                let mut table = w.open_table(REDB_TABLE).context("redb open_table")?;
                for (k, v) in (&mut *records).take(100_000) {
                    table
                        .insert(&key_bytes(k)[..], &v[..])
                        .context("redb insert")?;
                    n += 1;
                }
            }
            w.commit().context("redb load commit")?;
            if n == 0 {
                return Ok(());
            }
            done += n;
            progress(done);
        }
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(embedded_worker(RedbEngine(self), thread))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        let r = self.db.begin_read().context("redb begin_read")?;
        let table = r.open_table(REDB_TABLE).context("redb open_table")?;
        let k = key_bytes(key);
        Ok(table
            .get(&k[..])
            .context("redb get")?
            .map(|v| v.value().to_vec()))
    }
}

type LmdbDb = heed::Database<'static, heed::types::Bytes, heed::types::Bytes>;

/// LMDB through heed: one writer at a time, readers on MVCC snapshots (serializable).
struct Lmdb {
    env: heed::Env,
    db: LmdbDb,
    durability: Durability,
    _dir: TempDir,
}

impl Lmdb {
    fn open(dir: TempDir, open: &Open) -> anyhow::Result<Lmdb> {
        let map_bytes = (open.key_space.saturating_mul(512)).max(1 << 30);
        let mut options = heed::EnvOpenOptions::new();
        options
            .map_size(usize::try_from(map_bytes).context("LMDB map size")?)
            .max_readers(1024);
        if open.durability != Durability::Sync {
            // SAFETY: NO_SYNC and NO_META_SYNC only skip fsyncs; a crash may lose the last
            // commits, which is what durability none/async means.
            unsafe {
                options.flags(heed::EnvFlags::NO_SYNC | heed::EnvFlags::NO_META_SYNC);
            }
        }
        // SAFETY: the directory is fresh and private to this process; nothing else maps it.
        let env = unsafe { options.open(dir.path()) }.context("opening LMDB")?;
        let w = env.write_txn().context("LMDB write_txn")?;
        let db: LmdbDb = env
            .create_databases_and_commit(w, |opener, w| {
                opener
                    .create_database(w, None)
                    .map(heed::CommitOrAbort::<_, ()>::Commit)
            })
            .context("creating the LMDB database")?
            .unwrap_commit();
        Ok(Lmdb {
            env,
            db,
            durability: open.durability,
            _dir: dir,
        })
    }
}

fn heed_err(e: heed::Error) -> Fail {
    Fail::Error(anyhow::Error::new(e).context("LMDB"))
}

struct LmdbWrite<'a, 'e> {
    db: LmdbDb,
    txn: &'a mut heed::RwTxn<'e>,
}

struct LmdbRead<'a, 'e> {
    db: LmdbDb,
    txn: &'a heed::RoTxn<'e>,
}

impl Tx for LmdbWrite<'_, '_> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        f(self.db.get(self.txn, &key_bytes(key)).map_err(heed_err)?);
        Ok(())
    }
    fn write(&mut self, key: u64, value: &[u8]) -> Step {
        self.db
            .put(self.txn, &key_bytes(key), value)
            .map_err(heed_err)
    }
    fn scan(&mut self, _: u64, _: u32, _: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        Err(Fail::Error(anyhow::anyhow!("scans run read-only")))
    }
}

impl Tx for LmdbRead<'_, '_> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        f(self.db.get(self.txn, &key_bytes(key)).map_err(heed_err)?);
        Ok(())
    }
    fn write(&mut self, _: u64, _: &[u8]) -> Step {
        Err(read_only_violation())
    }
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        let k = key_bytes(start);
        let range = (
            std::ops::Bound::Included(&k[..]),
            std::ops::Bound::Unbounded,
        );
        for item in self
            .db
            .range(self.txn, &range)
            .map_err(heed_err)?
            .take(len as usize)
        {
            let (k, v) = item.map_err(heed_err)?;
            f(k, v);
        }
        Ok(())
    }
}

struct LmdbEngine<'a>(&'a Lmdb);

impl Engine for LmdbEngine<'_> {
    fn transaction(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        let l = self.0;
        if read_only {
            let r = l.env.read_txn().context("LMDB read_txn")?;
            return run_body(body, &mut LmdbRead { db: l.db, txn: &r });
        }
        let mut w = l.env.write_txn().context("LMDB write_txn")?;
        if !run_body(
            body,
            &mut LmdbWrite {
                db: l.db,
                txn: &mut w,
            },
        )? {
            w.abort();
            return Ok(false);
        }
        w.commit().context("LMDB commit")?;
        Ok(true)
    }
}

impl Target for Lmdb {
    fn name(&self) -> String {
        "lmdb".into()
    }
    fn isolation(&self) -> &'static str {
        "serializable (one writer at a time; readers on snapshots)"
    }
    fn durability(&self) -> &'static str {
        self.durability.name()
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        let mut done = 0u64;
        loop {
            let mut w = self.env.write_txn().context("LMDB write_txn")?;
            let mut n = 0;
            for (k, v) in (&mut *records).take(100_000) {
                self.db.put(&mut w, &key_bytes(k), &v).context("LMDB put")?;
                n += 1;
            }
            w.commit().context("LMDB load commit")?;
            if n == 0 {
                return Ok(());
            }
            done += n;
            progress(done);
        }
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(embedded_worker(LmdbEngine(self), thread))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        let r = self.env.read_txn().context("LMDB read_txn")?;
        Ok(self
            .db
            .get(&r, &key_bytes(key))
            .context("LMDB get")?
            .map(<[u8]>::to_vec))
    }
}
