//! Which images of the control plane's store a node's work may pull: what the agents' fetch of
//! the store asks before it serves a node a manifest. SQL only.

use super::LedgerError;

impl crate::store::Jobs<'_> {
    /// Whether the spec of an environment with a queued or leased job on `node` names
    /// `needle`: what a lease hands that node is built from those specs (`delivery`), so these
    /// are the images its work may pull.
    pub async fn work_naming(&self, node: &str, needle: &str) -> Result<bool, LedgerError> {
        let like = format!("%{}%", needle.replace('%', "").replace('_', "\\_"));
        let found = sqlx::query(self.sql(
            "SELECT 1 FROM deployments d WHERE d.spec LIKE ? ESCAPE '\\' AND EXISTS ( \
               SELECT 1 FROM jobs j WHERE j.target_node = ? AND j.state IN ('queued', 'leased') \
               AND j.task LIKE '%\"environment\":\"' || d.environment || '\"%') LIMIT 1",
        ))
        .bind(&like)
        .bind(node)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.is_some())
    }
}
