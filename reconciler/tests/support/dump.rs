//! Reads a ledger back as text rows, without ids and times, so two ledgers can be compared.
#![allow(dead_code)]

use sqlx::Row;

/// Rows of a query, each as `a|b|c`.
/// A pool of one connection for one look, with sqlx's maintenance task off (no idle timeout,
/// no lifetime): a test polling the ledger makes thousands of these, and a maintenance task
/// once spun a test's worker threads (CI, `faults.rs`, sqlx 0.9's idle count).
async fn connect(url: &str) -> sqlx::AnyPool {
    sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect(url)
        .await
        .expect("connect")
}

pub async fn rows(url: &str, sql: &str) -> Vec<String> {
    sqlx::any::install_default_drivers();
    let pool = connect(url).await;
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(&pool)
        .await
        .expect("query");
    let out = rows
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    r.try_get::<String, _>(i)
                        .or_else(|_| r.try_get::<i64, _>(i).map(|n| n.to_string()))
                        .unwrap_or_else(|_| "NULL".into())
                })
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    pool.close().await;
    out
}

/// Everything the reconciler writes, in a stable order, without ids and times.
pub async fn snapshot(url: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (name, sql) in [
        (
            "revisions",
            "SELECT branch, sha, verdict, principals, fingerprint, reasons FROM revisions ORDER BY id",
        ),
        (
            "objects",
            "SELECT branch, kind, name, hash, document FROM desired_objects ORDER BY branch, kind, name",
        ),
        (
            "deployments",
            "SELECT environment, branch, generation, action, status, step, spec_hash, spec, retired FROM deployments ORDER BY environment",
        ),
        (
            "generations",
            "SELECT environment, generation, branch, action, spec_hash FROM deployment_generations ORDER BY environment, generation",
        ),
        (
            "jobs",
            "SELECT key, task, target_node, state, attempts, max_attempts, environment, generation, step FROM jobs ORDER BY key",
        ),
        ("events", "SELECT kind, subject, detail FROM events ORDER BY id"),
    ] {
        for r in rows(url, sql).await {
            out.push(format!("{name}: {r}"));
        }
    }
    out
}

/// The first difference between two snapshots, for a readable failure.
pub fn first_difference(a: &[String], b: &[String]) -> String {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            return format!("row {i}:\n  left:  {x}\n  right: {y}");
        }
    }
    format!("lengths {} and {}", a.len(), b.len())
}

/// Marks `nodes` as enrolled agents that heartbeat (see `daemon.rs`'s `nodes_up`), on a
/// migrated ledger.
pub async fn nodes_up(url: &str, nodes: &[&str]) {
    sqlx::any::install_default_drivers();
    let pool = connect(url).await;
    for node in nodes {
        let recipient = age::x25519::Identity::generate().to_public().to_string();
        let sql = format!(
            "INSERT INTO nodes (name, age_recipient, enrolled_at, last_seen, capabilities) \
             VALUES ('{node}', '{recipient}', 0, 4102444800000, 'docker,ingress,nftables,routes') \
             ON CONFLICT (name) DO UPDATE SET last_seen = excluded.last_seen, capabilities = excluded.capabilities"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .expect("node up");
    }
    pool.close().await;
}

/// The nodes of `state_schema::synthetic` trees.
pub const SYNTHETIC_NODES: [&str; 16] = [
    "pool-a-node-0",
    "pool-a-node-1",
    "pool-a-node-2",
    "pool-a-node-3",
    "pool-a-node-4",
    "pool-a-node-5",
    "pool-a-node-6",
    "pool-a-node-7",
    "pool-b-node-0",
    "pool-b-node-1",
    "pool-b-node-2",
    "pool-b-node-3",
    "pool-b-node-4",
    "pool-b-node-5",
    "pool-b-node-6",
    "pool-b-node-7",
];
