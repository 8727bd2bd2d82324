#!/usr/bin/env bash
# Batches, inside `with-server --db bench` after bench/run.sh's schema: a transaction of
# 100 new jobs and their 100 effect rows, the claim done four ways, side by side in mixed
# runs (bench/mixed.sh): (b) the hand-written INSERT ... SELECT unnest(...) ON CONFLICT DO
# NOTHING RETURNING, (a) 100 try_claim calls, (c) one try_claim_many, (d) one
# dedup.advance. Then the size of what each keeps after 1,000,000 messages.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bindir=$DEDUP_PG_BINDIR
OUT=${OUT:-/dev/null}
psql() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
psql -f "$here/../schema.sql"
psql -c "CREATE TABLE my_processed_text (scope text COLLATE \"C\" NOT NULL, job_id text COLLATE \"C\" NOT NULL,
             processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job_id, scope))"
psql -c "ALTER DATABASE $PGDATABASE SET dedup.warn_outside_transaction = off"
echo "# $(date -u +%FT%TZ) commit ${BENCH_COMMIT:-?}, PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), $(nproc) cores: batches of 100" | tee -a "$OUT"
SCRIPTS=$here TRUNCATE="effects, my_processed, my_processed_text, dedup.processed, dedup.offsets" \
    bash "$here/../mixed.sh" b_handwritten_unnest b2_handwritten_text a_try_claim_100 c_try_claim_many d_advance
echo "# batches: what is kept after 1,000,000 messages (10,000 batches of 100)" | tee -a "$OUT"
psql -c "TRUNCATE my_processed, dedup.processed, dedup.offsets"
psql -c "DO \$\$ BEGIN FOR i IN 0..9999 LOOP
           PERFORM dedup.try_claim_many(ARRAY(SELECT generate_series(i::bigint * 100, i::bigint * 100 + 99)), 'size');
           PERFORM dedup.advance('size', i % 10, i::bigint * 100 + 99);
         END LOOP; END \$\$"
psql -c "INSERT INTO my_processed (job_id) SELECT generate_series(1, 1000000)"
psql -c "VACUUM ANALYZE dedup.processed, dedup.offsets, my_processed"
psql -At -c "SELECT 'size claims(try_claim_many) rows=' || (SELECT count(*) FROM dedup.processed) \
               || ' total_mb=' || round(pg_total_relation_size('dedup.processed') / 1e6, 1) \
            || E'\nsize my_processed(hand-written) rows=' || (SELECT count(*) FROM my_processed) \
               || ' total_mb=' || round(pg_total_relation_size('my_processed') / 1e6, 1) \
            || E'\nsize offsets(advance) rows=' || (SELECT count(*) FROM dedup.offsets) \
               || ' total_kb=' || round(pg_total_relation_size('dedup.offsets') / 1e3, 1)" | tee -a "$OUT"
