//! What the agent's tests share: reading the ledger file directly, for facts the API does not
//! show (the agent itself never sees SQL).
#![allow(dead_code)]

/// Runs `q` on the ledger at `url`: an `UPDATE` returns nothing, a query its first column as text.
pub fn sql(url: &str, q: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(url).await.expect("ledger");
        if q.starts_with("UPDATE") {
            sqlx::query(sqlx::AssertSqlSafe(q.to_owned()))
                .execute(&pool)
                .await
                .expect("update");
            return Vec::new();
        }
        let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(q.to_owned()))
            .fetch_all(&pool)
            .await
            .expect("rows");
        rows.into_iter().map(|r| r.0).collect()
    })
}
