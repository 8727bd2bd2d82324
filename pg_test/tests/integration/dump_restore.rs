//! `pg_dump | pg_restore` into a new database keeps every claim (pg_extension_config_dump).
use crate::common::{claim, ensure_eq, Ctx};
use anyhow::Result;
use dedup_pg_test::claims;
use dedup_pg_test::cluster::run;
use std::process::Command;

pub async fn dump_and_restore_keep_every_claim(ctx: Ctx) -> Result<()> {
    let c = ctx.connect().await?;
    c.batch_execute(
        "BEGIN;
         SELECT dedup.try_claim('text-job');
         SELECT dedup.try_claim(42::bigint, 'numbers');
         SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 'uuids');
         SELECT dedup.try_claim('bulk-' || g) FROM generate_series(1, 1000) g;
         COMMIT;",
    )
    .await?;
    let before = claims(&c).await?;

    let cluster = ctx.cluster.clone();
    let db = ctx.db.clone();
    let restored = format!("{db}_restored");
    let dump = cluster.dir.join(format!("{db}.dump"));
    tokio::task::spawn_blocking({
        let restored = restored.clone();
        move || -> Result<()> {
            let port = cluster.port.to_string();
            let conn = ["-h", "127.0.0.1", "-p", port.as_str(), "-U", "postgres"];
            run(Command::new(cluster.bindir.join("pg_dump"))
                .args(conn)
                .args(["-Fc", "-d", &db, "-f"])
                .arg(&dump))?;
            run(Command::new(cluster.bindir.join("createdb"))
                .args(conn)
                .arg(&restored))?;
            run(Command::new(cluster.bindir.join("pg_restore"))
                .args(conn)
                .args(["--exit-on-error", "-d", &restored])
                .arg(&dump))?;
            Ok(())
        }
    })
    .await??;

    let r = dedup_pg_test::connect(&ctx.cluster.dsn(&restored)).await?;
    let after = claims(&r).await?;
    ensure_eq(after.len(), 1003, "claims restored")?;
    ensure_eq(&after, &before, "restored claims, with their times")?;
    r.batch_execute("BEGIN").await?;
    ensure_eq(
        claim(&r, "SELECT dedup.try_claim('text-job')").await?,
        false,
        "text claim after restore",
    )?;
    ensure_eq(
        claim(&r, "SELECT dedup.try_claim('42', 'numbers')").await?,
        false,
        "bigint claim after restore",
    )?;
    ensure_eq(
        claim(
            &r,
            "SELECT dedup.try_claim('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, 'uuids')",
        )
        .await?,
        false,
        "uuid claim after restore",
    )?;
    ensure_eq(
        claim(&r, "SELECT dedup.try_claim('new-after-restore')").await?,
        true,
        "new claim",
    )?;
    r.batch_execute("COMMIT").await?;
    // The table's privileges and configuration survive too.
    let public_grants: i64 = r
        .query_one(
            "SELECT count(*) FROM pg_class, aclexplode(relacl) a \
             WHERE pg_class.oid = 'dedup.processed'::regclass AND a.grantee = 0",
            &[],
        )
        .await?
        .get(0);
    ensure_eq(
        public_grants,
        0,
        "privileges on dedup.processed granted to PUBLIC after restore",
    )
}
