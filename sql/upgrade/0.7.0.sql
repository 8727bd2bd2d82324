--@ upgrade 0.6.0 0.7.0
-- dedup 0.6.0 -> 0.7.0: claims in rotating generations, opt-in (issue 26, slice 1). Changes
-- no claim and no table of 0.6.0: dedup.generations starts empty, and a database uses
-- generations only once a superuser calls dedup.use_generations(). Keeps every claim.
\echo Use "ALTER EXTENSION dedup UPDATE TO '0.7.0'" to load this file. \quit

-- The library's new functions.
--@ create library dedup.use_generations
--@ create library dedup.rotate_generations
--@ create library dedup._claim_tables
--@ create library dedup.generation_summaries
--@ create library dedup._generations_changed
--@ create library dedup._lease_tables
--@ create library dedup._write_lease
--@ create library dedup._rotate

-- The catalog of generations, every claim across them (dedup.claims()), and the privileges
-- and comments of the library's new functions.
--@ create generations.sql *

-- dedup.forget finds the claim in every generation (dedup._claim_tables).
--@ replace retention.sql dedup.forget(text, text)

-- The lease functions work in every generation (dedup._lease_tables, dedup._write_lease,
-- dedup._lease_row): a lease found in an older generation moves to the one claims go to
-- when it is taken over, extended or completed; dedup._lease_lost explains a lost lease
-- from every generation.
--@ create leases.sql dedup._lease_tables
--@ create leases.sql dedup._write_lease
--@ create leases.sql dedup._lease_row
--@ replace leases.sql dedup._lease_lost(text, text, text, uuid)
--@ replace leases.sql dedup.lease(text, text, interval, text)
--@ replace leases.sql dedup.complete(text, uuid, jsonb, text)
--@ replace leases.sql dedup.extend_lease(text, uuid, interval, text)
--@ replace leases.sql dedup.release_lease(text, uuid, text)

-- dedup.stats_counters() has two new columns, the index probes of sealed generations (for
-- want of a summary, and a summary's false positives): the view on it and
-- dedup.cluster_stats() are made again.
DROP VIEW dedup.stats;
DROP FUNCTION dedup.stats_counters();
--@ create library dedup.stats_counters
--@ create stats.sql dedup.stats_counters
--@ create stats.sql dedup.stats
DROP FUNCTION dedup.cluster_stats();
--@ create citus.sql dedup.cluster_stats

-- dedup.distribute() refuses a database that uses generations (claims routed by Citus never
-- look in a generation).
--@ replace citus.sql dedup.distribute(text, int4)
