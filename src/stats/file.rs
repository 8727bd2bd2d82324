//! The counter file `pg_stat/dedup.stat`: written by the postmaster at a clean shutdown
//! (fsynced, renamed into place, with a checksum), read back at start; a file that is torn,
//! altered or of another layout is refused whole.
use super::*;

pub(super) const STAT_FILE: &str = "pg_stat/dedup.stat";
pub(super) const STAT_FILE_TMP: &str = "pg_stat/dedup.stat.tmp";
pub(super) const FILE_MAGIC: u32 = 0x4445_4455; // "DEDU"
/// 1: 0.4.0 (no layout, no checksum); 2: 0.5.0; 3: 0.6.0 (duplicate ages and
/// waits). A version 2 file is read; others are refused.
pub(super) const FILE_VERSION: u32 = 3;

// Layout (little-endian): magic, version, key size, values per entry (u32 each);
// overflowed, reset_at, entry count (u64 each); the entries, each a key's bytes and VALUES
// u64 counters; then an FNV-1a 64-bit checksum of everything before it. A file is loaded
// whole or not at all.

/// Values per entry in the file: version 3 (0.6.0) has [`VALUES`] (every counter of the
/// table, in its order), at least the 25 of 0.6.0; version 2 (0.5.0) has 6, and is still read.
/// A counter added at the end of the table needs no new version: a file with fewer values
/// (a version 3 file from before it) is read, its new counters starting at zero; a file
/// with more (from a later dedup) is refused.
pub(super) const VALUES_V3: usize = 25;
pub(super) const VALUES_V2: usize = 6;
const _: () = assert!(
    VALUES >= VALUES_V3,
    "counters are only added, at the table's end"
);
pub(super) const HEADER: usize = 4 * 4 + 3 * 8;
pub(super) const fn record(values: usize) -> usize {
    std::mem::size_of::<Key>() + 8 * values
}
pub(super) const RECORD: usize = record(VALUES);

/// FNV-1a, 64 bits: enough to tell a torn or altered file from a written one.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// # Safety
///
/// Called only by PostgreSQL, as the on_shmem_exit callback registered in shmem_startup,
/// in the postmaster as it exits, when no backend is left: the table is read without its
/// lock. The #[pg_guard] turns an ERROR or a panic into a PostgreSQL error raised from
/// this frame, never an unwind into C.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn write_file_at_exit(code: i32, _arg: pg_sys::Datum) {
    // SAFETY: SHARED is read by value; when set, it and HASH point to the shared memory
    // that stays mapped until the postmaster is gone. entries() runs its scan to the end;
    // each `&*e` is a live entry, read through atomics and the key's plain bytes, which
    // no other process can change now. durable_rename takes 'static C strings and
    // reports every failure (open, fsync, rename) at the LOG level we pass: no ERROR.
    // Not after a crash: the counters may be half-written.
    if code != 0 || SHARED.is_null() {
        return;
    }
    let all = entries();
    let mut out = Vec::with_capacity(HEADER + all.len() * RECORD + 8);
    out.extend_from_slice(&FILE_MAGIC.to_le_bytes());
    out.extend_from_slice(&FILE_VERSION.to_le_bytes());
    out.extend_from_slice(&(std::mem::size_of::<Key>() as u32).to_le_bytes());
    out.extend_from_slice(&(VALUES as u32).to_le_bytes());
    out.extend_from_slice(&((*SHARED).overflowed.load(Ordering::Relaxed)).to_le_bytes());
    out.extend_from_slice(&((*SHARED).reset_at.load(Ordering::Relaxed)).to_le_bytes());
    out.extend_from_slice(&(all.len() as u64).to_le_bytes());
    for e in all {
        // SAFETY: Key is plain bytes with no padding (the assertion at its definition).
        let key = std::slice::from_raw_parts(
            std::ptr::addr_of!((*e).key).cast::<u8>(),
            std::mem::size_of::<Key>(),
        );
        out.extend_from_slice(key);
        for v in Entry::values(e) {
            out.extend_from_slice(&v.load(Ordering::Relaxed).to_le_bytes());
        }
    }
    out.extend_from_slice(&checksum(&out).to_le_bytes());
    if let Err(e) = std::fs::File::create(STAT_FILE_TMP).and_then(|mut f| {
        use std::io::Write;
        f.write_all(&out)?;
        f.sync_all()
    }) {
        log!("dedup: could not write {STAT_FILE_TMP}: {e}");
        return;
    }
    // Renames it into place and fsyncs the file and pg_stat/; failures are logged (LOG).
    pg_sys::durable_rename(
        c"pg_stat/dedup.stat.tmp".as_ptr(),
        c"pg_stat/dedup.stat".as_ptr(),
        pg_sys::LOG as i32,
    );
}

/// Why a counter file is not loaded.
pub(super) fn check_file(data: &[u8]) -> Result<(usize, usize), String> {
    if data.len() < HEADER + 8 {
        return Err(format!("{} bytes, shorter than a header", data.len()));
    }
    let (body, sum) = data.split_at(data.len() - 8);
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
    if u32_at(0) != FILE_MAGIC {
        return Err("not a dedup counter file".into());
    }
    let values = u32_at(12) as usize;
    let known = match u32_at(4) {
        FILE_VERSION => VALUES_V3..=VALUES,
        2 => VALUES_V2..=VALUES_V2,
        v => {
            return Err(format!(
                "format {v}, not {FILE_VERSION} or 2 (written by another version of dedup)"
            ))
        }
    };
    if u32_at(8) as usize != std::mem::size_of::<Key>() || !known.contains(&values) {
        return Err("entries of another layout".into());
    }
    if u64::from_le_bytes(sum.try_into().unwrap()) != checksum(body) {
        return Err("its checksum does not match (torn or altered)".into());
    }
    let count = u64_at(32);
    if (body.len() - HEADER) as u64 != count.saturating_mul(record(values) as u64) {
        return Err(format!("{count} entries do not fill {} bytes", body.len()));
    }
    // Every entry is checked before any is loaded: a file is loaded whole or not at all.
    let mut seen = std::collections::HashSet::new();
    for i in 0..count as usize {
        let at = HEADER + i * record(values);
        let key = &body[at..at + std::mem::size_of::<Key>()];
        check_key(key).map_err(|why| format!("entry {}: {why}", i + 1))?;
        if !seen.insert(key) {
            return Err(format!("entry {}: a second entry with the same key", i + 1));
        }
    }
    Ok((count as usize, values))
}

/// Why the bytes of a saved [`Key`] are not ones [`Key::new`] could have written: a length
/// past its field, a byte after the length that is not zero, or a name that is not UTF-8.
pub(super) fn check_key(key: &[u8]) -> Result<(), String> {
    let oid = std::mem::size_of::<pg_sys::Oid>();
    let len_at = |at: usize| u16::from_ne_bytes([key[at], key[at + 1]]) as usize;
    let (scope_len, consumer_len) = (len_at(oid), len_at(oid + 2));
    let scope = &key[oid + 4..oid + 4 + MAX_SCOPE];
    let consumer = &key[oid + 4 + MAX_SCOPE..];
    if scope_len > MAX_SCOPE || consumer_len > MAX_CONSUMER {
        return Err(format!(
            "a scope of {scope_len} bytes or a consumer of {consumer_len} (at most {MAX_SCOPE} and {MAX_CONSUMER})"
        ));
    }
    for (name, field, len) in [
        ("scope", scope, scope_len),
        ("consumer", consumer, consumer_len),
    ] {
        if field[len..].iter().any(|b| *b != 0) {
            return Err(format!("bytes after the {name}'s end"));
        }
        if std::str::from_utf8(&field[..len]).is_err() {
            return Err(format!("a {name} that is not UTF-8"));
        }
    }
    Ok(())
}

/// Load the counters saved at the last clean shutdown, then remove the file (it would be
/// stale after a crash).
///
/// # Safety
///
/// Call from shmem_startup, in the postmaster before any backend exists (the table is
/// filled without its lock), with SHARED and HASH set, under its #[pg_guard].
pub(super) unsafe fn read_file() {
    let data = match std::fs::read(STAT_FILE) {
        Ok(data) => data,
        // Say so: after pg_upgrade (which copies no pg_stat/ file), a crash (the file is
        // removed once read) or on a first start, the counters are not carried over.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            log!(
                "dedup: no {STAT_FILE} (a first start, a crash, or a data directory made by \
                 pg_upgrade or a restore): the counters start from zero"
            );
            return;
        }
        Err(e) => {
            log!("dedup: could not read {STAT_FILE}: {e}; the counters start from zero");
            return;
        }
    };
    let _ = std::fs::remove_file(STAT_FILE);
    let (count, values) = match check_file(&data) {
        Ok(n) => n,
        Err(why) => {
            log!("dedup: ignoring {STAT_FILE}: {why}; the counters start from zero");
            return;
        }
    };
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    // SAFETY: SHARED points to the initialised Shared struct (shmem_startup wrote it just
    // before); these are atomic stores.
    (*SHARED).overflowed.store(u64_at(16), Ordering::Relaxed);
    (*SHARED).reset_at.store(u64_at(24), Ordering::Relaxed);
    for i in 0..count {
        let at = HEADER + i * record(values);
        let mut k = std::mem::MaybeUninit::<Key>::uninit();
        // SAFETY: record(values) bytes from `at` are in `data` (check_file); a Key is plain bytes
        // of exactly size_of::<Key>(), every one of them written here.
        std::ptr::copy_nonoverlapping(
            data[at..].as_ptr(),
            k.as_mut_ptr().cast::<u8>(),
            std::mem::size_of::<Key>(),
        );
        let k = k.assume_init();
        let mut found = false;
        // SAFETY: `k` is a full Key read during each call; HASH_ENTER_NULL returns NULL
        // instead of raising an ERROR when no entry is free. A new entry is initialised by
        // init_entry before its counters are stored; no other process exists yet.
        let mut e = pg_sys::hash_search(
            HASH,
            (&k as *const Key).cast(),
            pg_sys::HASHACTION::HASH_FIND,
            &mut found,
        )
        .cast::<Entry>();
        if e.is_null() && pg_sys::hash_get_num_entries(HASH) < max_entries() {
            e = pg_sys::hash_search(
                HASH,
                (&k as *const Key).cast(),
                pg_sys::HASHACTION::HASH_ENTER_NULL,
                &mut found,
            )
            .cast::<Entry>();
        }
        // An entry beyond a smaller dedup.stats_max is left out.
        if e.is_null() {
            continue;
        }
        if !found {
            init_entry(e, (*SHARED).next_generation.fetch_add(1, Ordering::Relaxed));
        }
        let v = |n: usize| u64_at(at + std::mem::size_of::<Key>() + 8 * n);
        // A file of fewer values (version 2's six, or a version 3 file from before a counter
        // was added) has the first ones; the others stay as init_entry left them.
        for (n, f) in Entry::values(e).iter().enumerate().take(values) {
            f.store(v(n), Ordering::Relaxed);
        }
    }
}
