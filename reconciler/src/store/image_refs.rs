//! What the ledger holds that may name an image of the control plane's store: every accepted
//! revision's images of it (`revision_images`), the newest accepted state of every tracked
//! branch (`desired_objects`), and each environment's current, retired and previous specs
//! (what runs, what a rollback goes back to). The image store's
//! collection keeps every digest these name. SQL only: the rows that mention `needle`.

use super::LedgerError;

impl crate::store::Deployments<'_> {
    /// The texts (canonical documents and spec JSON) that contain `needle`.
    pub async fn texts_naming(&self, needle: &str) -> Result<Vec<String>, LedgerError> {
        let like = format!("%{}%", needle.replace('%', "").replace('_', "\\_"));
        let mut out: Vec<String> =
            sqlx::query_scalar(self.sql("SELECT document FROM desired_objects WHERE document LIKE ? ESCAPE '\\'"))
                .bind(&like)
                .fetch_all(&self.pool)
                .await?;
        let specs: Vec<(String, String, String)> = sqlx::query_as(self.sql(
            "SELECT spec, retired, previous_spec FROM deployments \
             WHERE spec LIKE ? ESCAPE '\\' OR retired LIKE ? ESCAPE '\\' OR previous_spec LIKE ? ESCAPE '\\'",
        ))
        .bind(&like)
        .bind(&like)
        .bind(&like)
        .fetch_all(&self.pool)
        .await?;
        for (a, b, c) in specs {
            out.extend([a, b, c]);
        }
        // Every accepted revision's images of the store (written with its row).
        let images: Vec<String> = sqlx::query_scalar(self.sql("SELECT DISTINCT image FROM revision_images"))
            .fetch_all(&self.pool)
            .await?;
        out.extend(images);
        Ok(out)
    }
}
