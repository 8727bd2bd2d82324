//! The summaries' file `pg_stat/dedup_expired.stat`: written by the postmaster at a clean
//! shutdown (fsynced, renamed into place, with a checksum), read back at start; a file that
//! is torn, altered, of another layout or of another `dedup.expired_memory` is refused
//! whole, and the summaries start empty.
use super::*;

pub(super) const FILE: &str = "pg_stat/dedup_expired.stat";
const FILE_TMP: &str = "pg_stat/dedup_expired.stat.tmp";
const MAGIC: u32 = 0x4445_4458; // "DEDX"
/// 2 since 0.7.0: the keys' hash changed (`expired::fold`); a file of 1 holds bits placed by
/// the old one, and is refused as of another format (and removed, as every file read).
const VERSION: u32 = 2;

// Layout (little-endian): magic, version, slots, databases per slot (u32 each); blocks per
// slot, the current slot, the secret, the automatic look-back (u64 each); per slot, META
// values (u64 each); every slot's bits (u64 words); then an FNV-1a 64-bit checksum of
// everything before it.
// A slot's values, in this order, then its DBS databases.
const STARTED: usize = 0;
const LAST_AT: usize = 1;
const KEYS: usize = 2;
const NOT_KEPT: usize = 3;
const MIN_EXPIRY: usize = 4;
const MAX_EXPIRY: usize = 5;
const DB_MASK: usize = 6;
const MORE_DBS: usize = 7;
const FIXED: usize = 8;
const META: usize = FIXED + DBS;
const HEADER: usize = 4 * 4 + 4 * 8;

fn meta(s: &Slot) -> [u64; META] {
    let mut m = [0u64; META];
    m[STARTED] = s.started.load(Ordering::Relaxed) as u64;
    m[LAST_AT] = s.last_at.load(Ordering::Relaxed) as u64;
    m[KEYS] = s.keys.load(Ordering::Relaxed);
    m[NOT_KEPT] = s.not_kept.load(Ordering::Relaxed);
    m[MIN_EXPIRY] = s.min_expiry.load(Ordering::Relaxed) as u64;
    m[MAX_EXPIRY] = s.max_expiry.load(Ordering::Relaxed) as u64;
    m[DB_MASK] = s.db_mask.load(Ordering::Relaxed);
    m[MORE_DBS] = u64::from(s.more_dbs.load(Ordering::Relaxed));
    for (i, d) in s.dbs.iter().enumerate() {
        m[FIXED + i] = u64::from(d.load(Ordering::Relaxed));
    }
    m
}

fn set_meta(s: &Slot, m: &[u64]) {
    s.started.store(m[STARTED] as i64, Ordering::Relaxed);
    s.last_at.store(m[LAST_AT] as i64, Ordering::Relaxed);
    s.keys.store(m[KEYS], Ordering::Relaxed);
    s.not_kept.store(m[NOT_KEPT], Ordering::Relaxed);
    s.min_expiry.store(m[MIN_EXPIRY] as i64, Ordering::Relaxed);
    s.max_expiry.store(m[MAX_EXPIRY] as i64, Ordering::Relaxed);
    s.db_mask.store(m[DB_MASK], Ordering::Relaxed);
    s.more_dbs.store(m[MORE_DBS] as u32, Ordering::Relaxed);
    for (i, d) in s.dbs.iter().enumerate() {
        d.store(m[FIXED + i] as u32, Ordering::Relaxed);
    }
}

/// The file's bytes for `ring`.
pub(super) fn encode(ring: &Ring) -> Vec<u8> {
    let words = ring.blocks as usize * BLOCK_WORDS;
    let mut out = Vec::with_capacity(HEADER + SLOTS * (META + words) * 8 + 8);
    for v in [MAGIC, VERSION, SLOTS as u32, DBS as u32] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        ring.blocks,
        u64::from(ring.current.load(Ordering::Relaxed)),
        ring.secret.load(Ordering::Relaxed),
        ring.auto_lookback.load(Ordering::Relaxed) as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for s in &ring.slots {
        for v in meta(s) {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for i in 0..SLOTS {
        for w in ring.slot_words(i) {
            out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
    }
    let sum = crate::stats::checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Why a file is not loaded into a ring of `blocks` blocks per slot.
pub(super) fn check(data: &[u8], blocks: u64) -> Result<(), String> {
    let words = blocks as usize * BLOCK_WORDS;
    let expected = HEADER + SLOTS * (META + words) * 8 + 8;
    if data.len() < HEADER + 8 {
        return Err(format!("{} bytes, shorter than a header", data.len()));
    }
    let u32_at = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    if u32_at(0) != MAGIC {
        return Err("not a dedup summary file".into());
    }
    if u32_at(4) != VERSION {
        return Err(format!("format {}, not {VERSION}", u32_at(4)));
    }
    if u32_at(8) as usize != SLOTS || u32_at(12) as usize != DBS {
        return Err("summaries of another layout".into());
    }
    if u64_at(16) != blocks {
        return Err(format!(
            "{} blocks per summary, not {blocks} (dedup.expired_memory changed)",
            u64_at(16)
        ));
    }
    if data.len() != expected {
        return Err(format!("{} bytes, not {expected}", data.len()));
    }
    let (body, sum) = data.split_at(data.len() - 8);
    if u64::from_le_bytes(sum.try_into().unwrap()) != crate::stats::checksum(body) {
        return Err("its checksum does not match (torn or altered)".into());
    }
    if u64_at(24) as usize >= SLOTS {
        return Err("a current summary out of range".into());
    }
    // What the summaries say of themselves must be what dedup writes: a file altered and
    // sealed again must not make a look-up loop, overflow or count from nonsense.
    const YEARS_300: i64 = 300 * 366 * 86_400 * 1_000_000;
    let sane = |t: i64| (-YEARS_300..=YEARS_300).contains(&t);
    let capacity = capacity(blocks);
    for slot in 0..SLOTS {
        let m = |i: usize| u64_at(HEADER + (slot * META + i) * 8);
        let (started, last_at, keys) = (m(STARTED) as i64, m(LAST_AT) as i64, m(KEYS));
        let (min, max) = (m(MIN_EXPIRY) as i64, m(MAX_EXPIRY) as i64);
        let ok = keys <= capacity
            && sane(started)
            && sane(last_at)
            && (keys == 0 || (started > 0 && sane(min) && sane(max) && min <= max));
        if !ok {
            return Err(format!("summary {slot} holds values dedup does not write"));
        }
    }
    if (u64_at(40) as i64) < 0 {
        return Err("a negative look-back".into());
    }
    Ok(())
}

/// Load `data` (checked) into `ring`.
fn decode(ring: &Ring, data: &[u8]) {
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    ring.current.store(u64_at(24) as u32, Ordering::Relaxed);
    ring.secret.store(u64_at(32), Ordering::Relaxed);
    ring.auto_lookback
        .store(u64_at(40) as i64, Ordering::Relaxed);
    let mut at = HEADER;
    for s in &ring.slots {
        let m: Vec<u64> = (0..META).map(|i| u64_at(at + 8 * i)).collect();
        set_meta(s, &m);
        s.fpr_ppb.store(
            (false_positive_rate(m[KEYS], ring.blocks) * 1e9).ceil() as u64,
            Ordering::Relaxed,
        );
        at += META * 8;
    }
    for i in 0..SLOTS {
        for w in ring.slot_words(i) {
            w.store(u64_at(at), Ordering::Relaxed);
            at += 8;
        }
    }
}

/// # Safety
///
/// In the postmaster before any backend exists (nothing else touches the ring).
pub(super) unsafe fn read(ring: &Ring) {
    let data = match std::fs::read(FILE) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            log!("dedup: could not read {FILE}: {e}");
            return;
        }
    };
    match check(&data, ring.blocks) {
        Ok(()) => decode(ring, &data),
        Err(why) => {
            pgrx::warning!(
                "dedup: {FILE} not loaded: {why}; the summaries of pruned claims start empty"
            )
        }
    }
    // Read once: a crash later must not bring back summaries older than what it lost.
    if let Err(e) = std::fs::remove_file(FILE) {
        log!("dedup: could not remove {FILE} after reading it: {e}");
    }
}

/// # Safety
///
/// Called only by PostgreSQL, as the on_shmem_exit callback registered in attach(), in the
/// postmaster as it exits, when no backend is left. The #[pg_guard] turns an ERROR or a
/// panic into a PostgreSQL error raised from this frame, never an unwind into C.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn write_at_exit(code: i32, _arg: pg_sys::Datum) {
    // Not after a crash: the summaries may be half-written.
    let Some(ring) = ring() else {
        return;
    };
    if code != 0 {
        return;
    }
    let out = encode(ring);
    if let Err(e) = std::fs::File::create(FILE_TMP).and_then(|mut f| {
        use std::io::Write;
        f.write_all(&out)?;
        f.sync_all()
    }) {
        log!("dedup: could not write {FILE_TMP}: {e}");
        return;
    }
    // SAFETY: 'static C strings; failures are reported at LOG, no ERROR.
    pg_sys::durable_rename(
        c"pg_stat/dedup_expired.stat.tmp".as_ptr(),
        c"pg_stat/dedup_expired.stat".as_ptr(),
        pg_sys::LOG as i32,
    );
}
