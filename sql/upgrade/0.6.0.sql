--@ upgrade 0.5.0 0.6.0
-- dedup 0.5.0 -> 0.6.0: scale-out on Citus, operating retention (duplicate ages, waits,
-- table_health, forget), a claim kept its retention from when it became visible, batch
-- claims and offsets per partition. Keeps every claim.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.6.0'" to load this file. \quit

-- The library's new functions.
--@ create library dedup.try_claim_many
--@ create library dedup._try_claim_many_fp
--@ create library dedup._check_offset
--@ create library dedup._claim_result
--@ create library dedup._distributed
--@ create library dedup._written_here
--@ create library dedup._caller
--@ create library dedup._count(text, text, timestamptz)

-- dedup.stats_counters() has new columns: the view on it is made again below.
DROP VIEW dedup.stats;
DROP FUNCTION dedup.stats_counters();
--@ create library dedup.stats_counters
--@ create stats.sql dedup.stats_counters
--@ create stats.sql dedup.stats
--@ create stats.sql dedup._count(text, text, timestamptz)

-- Copies that ran again after their claim expired: the summaries of pruned claims, and the
-- retention each scope needs.
--@ create library dedup.expired_summaries
--@ create stats.sql dedup.expired_summaries
--@ create stats.sql dedup.suggest_retention

-- Leases and stored results on Citus, and the claim's time for the duplicate ages.
--@ replace leases.sql dedup.lease
--@ replace leases.sql dedup._lease_lost
--@ replace leases.sql dedup.complete
--@ replace leases.sql dedup.extend_lease
--@ replace leases.sql dedup.release_lease
--@ replace leases.sql dedup.claim_result
--@ create leases.sql dedup._claim_result

-- Citus.
--@ create citus.sql *

-- Operating retention: table_health, forget and its audit table, the horizons.
--@ create retention.sql dedup.table_health
--@ create retention.sql dedup.forgotten
--@ create retention.sql dedup.forget
--@ create retention.sql dedup._horizons
--@ create retention.sql dedup._mark_horizon
--@ create retention.sql dedup._horizon

-- Where the worker's last pass over all scopes stopped when its share of time ran out
-- (sql/retention.sql, dedup._prune_status).
ALTER TABLE dedup._prune_status
    ADD COLUMN resume_target pg_catalog.text,
    ADD COLUMN resume_block  pg_catalog.int8;

-- Offsets per partition, and try_claim_many with fingerprints.
--@ create offsets.sql *
