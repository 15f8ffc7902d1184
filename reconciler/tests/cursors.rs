//! Event cursors under concurrent writers: 8 writers append events in transactions that stay
//! open for random moments (so on PostgreSQL their ids commit out of order), while one reader
//! pages `events_after(cursor)`. Every event must be seen exactly once, on both backends: a
//! reader that moved its cursor past an id whose transaction had not committed yet would skip
//! that event for good.

#[path = "support/postgres.rs"]
mod postgres_support;

use reconciler::store::Ledger;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const WRITERS: usize = 8;
const PER_WRITER: usize = 150;

async fn scenario(url: String) {
    let ledger = Ledger::connect(&url, 4).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    sqlx::any::install_default_drivers();
    let sqlite = url.starts_with("sqlite");
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(WRITERS as u32)
        // The writers queue on SQLite's one write lock: on a loaded machine a wait can pass
        // sqlx's 5 s default and fail an insert with `database is locked`, which says nothing
        // about cursors. They wait as long as the test allows instead.
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if sqlite {
                    sqlx::query("PRAGMA busy_timeout = 60000").execute(&mut *conn).await?;
                }
                Ok(())
            })
        })
        .connect(&url)
        .await
        .expect("writers' pool");
    let postgres = url.starts_with("postgres");
    let insert = if postgres {
        "INSERT INTO events (at, kind, subject, detail) VALUES ($1, 'test', $2, '')"
    } else {
        "INSERT INTO events (at, kind, subject, detail) VALUES (?, 'test', ?, '')"
    };
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let pool = pool.clone();
        writers.push(tokio::spawn(async move {
            let mut seed = (w as u64 + 1) * 0x9E37_79B9;
            for i in 0..PER_WRITER {
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(insert)
                    .bind(0i64)
                    .bind(format!("w{w}-{i}"))
                    .execute(&mut *tx)
                    .await
                    .expect("insert");
                // Hold the transaction open for 0-3 ms: later ids commit first.
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                tokio::time::sleep(Duration::from_micros((seed >> 33) % 3_000)).await;
                tx.commit().await.expect("commit");
            }
        }));
    }
    let want = WRITERS * PER_WRITER;
    let mut seen: Vec<String> = Vec::new();
    let mut ids: Vec<i64> = Vec::new();
    let mut cursor = 0;
    let started = Instant::now();
    while seen.len() < want {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "saw {} of {want}",
            seen.len()
        );
        let page = ledger.events().events_after(cursor, 50).await.expect("page");
        if page.is_empty() {
            if writers.iter().all(|w| w.is_finished()) {
                // Everything is committed: one more read tells whether anything was skipped.
                let rest = ledger.events().events_after(cursor, 10_000).await.expect("rest");
                if rest.is_empty() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
            continue;
        }
        for e in &page {
            assert!(e.id > cursor, "ids grow along the cursor");
            cursor = e.id;
            seen.push(e.subject.clone());
            ids.push(e.id);
        }
    }
    for w in writers {
        w.await.expect("writer");
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no event twice");
    let all = ledger.events().events_after(0, 10_000).await.expect("all");
    let missed: Vec<i64> = all.iter().map(|e| e.id).filter(|id| !ids.contains(id)).collect();
    assert_eq!(
        seen.len(),
        want,
        "every event once: a reader paging by cursor skipped none; missed ids {missed:?} (of {} in the ledger)",
        all.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    scenario(format!("sqlite://{}", dir.path().join("l.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_on_postgres() {
    let pg = postgres_support::Postgres::start();
    scenario(pg.url()).await;
}
