-- dedup, portable edition: the counters of dedup.stats (src/stats/). They live in the
-- shared memory of the native library, which the portable edition has not: nothing is
-- counted. Each function answers as the native one does when the library is not in
-- shared_preload_libraries (a WARNING, no counters), saying why.

-- No rows, with a WARNING (dedup.stats reads this function).
CREATE FUNCTION dedup.stats_counters()
RETURNS TABLE (
    datname                pg_catalog.text,
    scope                  pg_catalog.text,
    consumer               pg_catalog.text,
    claims                 pg_catalog.int8,
    duplicates             pg_catalog.int8,
    busy                   pg_catalog.int8,
    fingerprint_mismatches pg_catalog.int8,
    last_claim_at          pg_catalog.timestamptz,
    last_duplicate_at      pg_catalog.timestamptz,
    late_duplicates        pg_catalog.int8,
    duplicate_age_sum      pg_catalog.interval,
    duplicate_age_max      pg_catalog.interval,
    duplicate_ages         pg_catalog.int8[],
    waits                  pg_catalog.int8,
    wait_time              pg_catalog.interval,
    wait_max               pg_catalog.interval,
    batches                pg_catalog.int8,
    advances               pg_catalog.int8,
    expired_duplicates     pg_catalog.int8,
    last_expired_duplicate_at pg_catalog.timestamptz,
    expired_duplicate_after_max pg_catalog.interval,
    expired_duplicates_expected pg_catalog.float8,
    unsummarised_probes    pg_catalog.int8,
    summary_false_positives pg_catalog.int8)
LANGUAGE plpgsql STRICT VOLATILE PARALLEL RESTRICTED
AS $$
BEGIN
    PERFORM dedup._portable_stats_warning('dedup.stats');
END
$$;

-- counting false, no entries, the bound dedup.stats_max (5000 unless set), nothing
-- overflowed, never reset: the native answer without shared_preload_libraries.
CREATE FUNCTION dedup.stats_info()
RETURNS TABLE (
    counting    pg_catalog.bool,
    entries     pg_catalog.int8,
    max_entries pg_catalog.int8,
    overflowed  pg_catalog.int8,
    reset_at    pg_catalog.timestamptz)
LANGUAGE plpgsql STRICT VOLATILE PARALLEL RESTRICTED
AS $$
BEGIN
    PERFORM dedup._portable_stats_warning('dedup.stats_info');
    counting := false;
    entries := 0;
    max_entries := dedup._portable_setting('dedup.stats_max', 5000, 100, 1000000, false);
    overflowed := 0;
    reset_at := NULL;
    RETURN NEXT;
END
$$;

-- The summaries of pruned claims live in shared memory too: the portable edition keeps
-- none, so it cannot count copies that ran again after their claim expired. No rows, with
-- the WARNING; size the retention by the guide's rule (docs/diagnostics.md).
CREATE FUNCTION dedup.expired_summaries()
RETURNS TABLE (
    slot                pg_catalog.int4,
    current             pg_catalog.bool,
    started             pg_catalog.timestamptz,
    last_pruned_at      pg_catalog.timestamptz,
    in_lookback         pg_catalog.bool,
    keys                pg_catalog.int8,
    not_kept            pg_catalog.int8,
    capacity            pg_catalog.int8,
    expired_from        pg_catalog.timestamptz,
    expired_until       pg_catalog.timestamptz,
    databases           pg_catalog.oid[],
    false_positive_rate pg_catalog.float8)
LANGUAGE plpgsql STRICT VOLATILE PARALLEL RESTRICTED
AS $$
BEGIN
    PERFORM dedup._portable_stats_warning('dedup.expired_summaries');
END
$$;

-- Nothing to forget: a WARNING, and nothing done.
CREATE FUNCTION dedup.stats_reset()
RETURNS void
LANGUAGE plpgsql STRICT VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM dedup._portable_stats_warning('dedup.stats_reset');
END
$$;

-- Count a lease or advance outcome: nothing to count into. The event is checked as the
-- native function checks it (an unknown one is an internal error, XX000).
CREATE FUNCTION dedup._count(scope pg_catalog.text, event pg_catalog.text)
RETURNS void
LANGUAGE plpgsql STRICT VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM dedup._count(scope, event, NULL);
END
$$;

CREATE FUNCTION dedup._count(scope pg_catalog.text, event pg_catalog.text, claimed_at pg_catalog.timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    IF scope IS NULL OR event IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004',
            MESSAGE = pg_catalog.format('dedup._count: %s must not be NULL',
                CASE WHEN scope IS NULL THEN 'scope' ELSE 'event' END),
            HINT = 'This internal function is called by dedup''s own functions with a constant here: '
                   'call the public function (dedup.try_claim, dedup.lease, dedup.advance) instead.';
    END IF;
    IF NOT event OPERATOR(pg_catalog.=) ANY ('{acquired,done,busy,fingerprint_mismatch,advance,stale}'::pg_catalog.text[]) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = pg_catalog.format('dedup._count: unknown event "%s"',
                pg_catalog.replace(pg_catalog.replace(event, '\', '\\'), '"', '\"')),
            HINT = 'The events are acquired, done, busy, fingerprint_mismatch, advance and stale; '
                   'dedup''s own functions call dedup._count, not applications.';
    END IF;
END
$$;
