//! Adversarial arguments: every function of the schema dedup, called over the wire with
//! arguments drawn from each type's edge cases (NULL, empty and oversize strings, every
//! integer boundary, huge and odd arrays, infinite and extreme times and intervals, NaN),
//! as a superuser and as a role holding only what PUBLIC has. No call may end the server
//! process, none may raise `XX000` without a hint (an error a user cannot act on) or a
//! corruption SQLSTATE (`XX001`, `XX002`), and a call that raised changes no claim and
//! counts nothing (but a fingerprint mismatch, `YD001`, which `dedup.stats` counts).
//! `DEDUP_FUZZ_CALLS` (default 3000) sets the number of calls; `DEDUP_FUZZ_SEED` the seed
//! (printed, so a failure can be replayed).
use crate::common::ensure_eq;
use crate::common::Ctx;
use anyhow::{bail, Context, Result};
use dedup_pg_test::cluster::{Cluster, Options};
use dedup_pg_test::{connect, Conn};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// Edge cases of each argument type, as text (None: SQL NULL), cast by the server.
fn values(ty: &str) -> Vec<Option<String>> {
    let s = |v: &str| Some(v.to_string());
    let long = |n: usize| Some("x".repeat(n));
    let array = |n: usize, each: &str| {
        Some(format!(
            "{{{}}}",
            (0..n)
                .map(|i| each.replace('#', &i.to_string()))
                .collect::<Vec<_>>()
                .join(",")
        ))
    };
    let mut v = vec![None];
    match ty {
        "text" | "character varying" | "name" => v.extend([
            s(""),
            s(" "),
            s("default"),
            s("job-1"),
            s("€ü\u{1F600}"),
            s("'; DROP TABLE dedup.processed; --"),
            long(128),
            long(129),
            long(256),
            long(257),
            long(1024),
            long(1025),
            long(100_000),
        ]),
        "integer" | "smallint" => v.extend(
            [
                "0",
                "1",
                "-1",
                "2147483647",
                "-2147483648",
                "32767",
                "-32768",
            ]
            .map(s),
        ),
        "bigint" => v.extend(
            [
                "0",
                "1",
                "-1",
                "42",
                "9223372036854775807",
                "-9223372036854775808",
                "2147483648",
            ]
            .map(s),
        ),
        "double precision" | "real" => v.extend(
            [
                "0",
                "-0",
                "1",
                "NaN",
                "Infinity",
                "-Infinity",
                "1e308",
                "-1e308",
                "1e-320",
            ]
            .map(s),
        ),
        "boolean" => v.extend(["true", "false"].map(s)),
        "uuid" => v.extend(
            [
                "00000000-0000-0000-0000-000000000000",
                "ffffffff-ffff-ffff-ffff-ffffffffffff",
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            ]
            .map(s),
        ),
        "interval" => v.extend(
            [
                "0",
                "1 microsecond",
                "-1 second",
                "1 second",
                "30 seconds",
                "1 hour",
                "1 month -29 days",
                "-1 month 31 days",
                "178000000 years",
                "-178000000 years",
                "2147483647 days",
            ]
            .map(s),
        ),
        "timestamp with time zone" => v.extend(
            [
                "infinity",
                "-infinity",
                "epoch",
                "now",
                "4713-01-01 00:00:00+00 BC",
                "294276-12-31 23:59:59+00",
            ]
            .map(s),
        ),
        "jsonb" | "json" => v.extend(
            [
                "null",
                "{}",
                "[]",
                "\"x\"",
                "{\"a\": [1, 2, {\"b\": null}]}",
            ]
            .map(s),
        ),
        "text[]" => v.extend([
            s("{}"),
            s("{NULL}"),
            s("{\"\"}"),
            s("{a,a,b}"),
            array(3, "j#"),
            array(10_000, "j#"),
            array(10_001, "j#"),
            s("{{a,b},{c,d}}"),
        ]),
        "bigint[]" => v.extend([
            s("{}"),
            s("{NULL}"),
            s("{1,1,2}"),
            s("{-9223372036854775808,9223372036854775807}"),
            array(10_001, "#"),
        ]),
        "uuid[]" => v.extend([
            s("{}"),
            s("{NULL}"),
            s("{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"),
        ]),
        "oid" | "regclass" | "regrole" => v.extend(["0", "1", "4294967295", "1259"].map(s)),
        "tid" => v.extend(["(0,0)", "(0,1)", "(4294967295,65535)", "(1000000,1)"].map(s)),
        "xid8" | "xid" => v.extend(["0", "1", "2", "18446744073709551615"].map(s)),
        _ => v.extend([s(""), s("0")]),
    }
    v
}

/// The first words of a message (its variable parts come later, mostly).
fn first(message: &str) -> String {
    message.chars().take(40).collect()
}

struct Function {
    name: String,
    types: Vec<String>,
}

async fn functions(c: &Conn) -> Result<Vec<Function>> {
    let rows = c
        .query(
            "SELECT p.proname::text, \
                    coalesce(array_agg(pg_catalog.format_type(t.typ, NULL) ORDER BY t.n) \
                             FILTER (WHERE t.typ IS NOT NULL), '{}') \
               FROM pg_proc AS p \
               JOIN pg_namespace AS n ON n.oid = p.pronamespace AND n.nspname = 'dedup' \
               LEFT JOIN LATERAL unnest(p.proargtypes::oid[]) WITH ORDINALITY AS t(typ, n) ON true \
              WHERE p.prokind = 'f' AND p.proname <> 'distribute' \
              GROUP BY p.oid, p.proname ORDER BY p.proname, p.oid",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Function {
            name: r.get(0),
            types: r.get(1),
        })
        .collect())
}

/// What a raised call must not have changed: the claims (their number and the latest
/// claim's time: a rolled-back write leaves neither changed), and every counter, which are
/// not transactional.
async fn state(c: &Conn) -> Result<(String, String)> {
    let claims: String = c
        .query_one(
            "SELECT count(*) || ' ' || coalesce(max(p.processed_at)::text, '-') FROM dedup.processed AS p",
            &[],
        )
        .await?
        .get(0);
    let counters: String = c
        .query_one(
            "SELECT coalesce(string_agg(s::text, ',' ORDER BY s::text), '') FROM dedup.stats_counters() AS s",
            &[],
        )
        .await?
        .get(0);
    Ok((claims, counters))
}

pub async fn every_function_survives_adversarial_arguments(_ctx: Ctx) -> Result<()> {
    let calls: usize = std::env::var("DEDUP_FUZZ_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("DEDUP_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("  {calls} calls, DEDUP_FUZZ_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = Cluster::start(
        Options::named("fuzz")
            .set("shared_preload_libraries", "dedup")
            .set("dedup.prune_interval", "0"),
    )?;
    cluster.create_db_with_extension("fuzz")?;
    let admin = connect(&cluster.dsn("fuzz")).await?;
    admin
        .batch_execute(
            "CREATE ROLE fuzzer LOGIN;
             BEGIN; SELECT dedup.try_claim('job-' || g) FROM generate_series(1, 20) g; COMMIT;",
        )
        .await?;
    let plain = connect(&format!("{} user=fuzzer", cluster.dsn("fuzz"))).await?;
    let list = functions(&admin).await?;
    ensure_eq(list.len() > 30, true, "functions found in the schema dedup")?;
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut findings: BTreeMap<String, String> = BTreeMap::new();
    let mut before = state(&admin).await?;
    let mut stale = false;
    for i in 0..calls {
        let f = &list[rng.random_range(0..list.len())];
        let args: Vec<Option<String>> = f
            .types
            .iter()
            .map(|t| {
                let v = values(t);
                v[rng.random_range(0..v.len())].clone()
            })
            .collect();
        let sql = format!(
            "SELECT * FROM dedup.{}({})",
            f.name,
            (1..=f.types.len())
                .zip(&f.types)
                .map(|(n, t)| format!("${n}::text::{t}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let as_superuser = i % 2 == 0;
        let c = if as_superuser { &admin } else { &plain };
        if stale {
            before = state(&admin).await?;
            stale = false;
        }
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
            .iter()
            .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let shown = || {
            format!(
                "{sql} with {:?} as {}",
                args.iter()
                    .map(|a| a.as_deref().map(|s| s.chars().take(40).collect::<String>()))
                    .collect::<Vec<_>>(),
                if as_superuser { "superuser" } else { "fuzzer" }
            )
        };
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            c.query(sql.as_str(), &params),
        )
        .await
        .with_context(|| format!("no answer in 30 s: {}", shown()))?;
        match r {
            Ok(_) => {
                // A call that succeeded may have claimed or counted: read the state again.
                stale = true;
                *outcomes.entry("ok".into()).or_default() += 1
            }
            Err(e) => {
                let Some(db) = e.as_db_error() else {
                    bail!(
                        "{}: the connection failed: {e}\n{}",
                        shown(),
                        cluster.log_tail(30)
                    );
                };
                let code = db.code().code().to_string();
                if (code == "XX000" && db.hint().is_none()) || code == "XX001" || code == "XX002" {
                    // One line per function and message (not per argument), listed at the end.
                    let key = format!("{} {code} {}", f.name, first(db.message()));
                    findings.entry(key).or_insert_with(|| {
                        format!(
                            "{}: {code} {} (hint {:?})",
                            shown(),
                            db.message(),
                            db.hint()
                        )
                    });
                }
                let after = state(&admin).await?;
                // A fingerprint mismatch (YD001) is counted as one (dedup.stats), by design:
                // of that error, only the claims must be as they were.
                let changed = if code == "YD001" {
                    after.0 != before.0
                } else {
                    after != before
                };
                if changed {
                    findings
                        .entry(format!("{} changed state", f.name))
                        .or_insert_with(|| {
                            format!(
                                "{}: raised {code} {} but changed claims or counters: {before:?} -> {after:?}",
                                shown(),
                                db.message()
                            )
                        });
                }
                before = after;
                *outcomes.entry(code).or_default() += 1;
            }
        }
    }
    let log = cluster.log_text();
    for bad in [
        "PANIC",
        "was terminated by signal",
        "server process",
        "TRAP",
    ] {
        if log.contains(bad) {
            bail!("the server log shows {bad:?}:\n{}", cluster.log_tail(40));
        }
    }
    println!("  outcomes: {outcomes:?}");
    if !findings.is_empty() {
        bail!(
            "{} kinds of call ended badly:\n{}",
            findings.len(),
            findings.values().cloned().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}
