//! Judged commits: a verdict once per (sha, branch), and where a branch stands (last judged,
//! last accepted, deployed branches).

use super::{LedgerError, WriteTx};

/// The revision that made one generation of an environment: its commit, who signed it and with
/// which key, and when the control plane first saw it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct GenerationCommit {
    pub generation: i64,
    pub sha: String,
    pub principals: Option<String>,
    pub fingerprint: Option<String>,
    pub seen_at: i64,
}

impl crate::store::Revisions<'_> {
    /// The revisions that made `generations` of `environment` (those it knows of), read in
    /// chunks of 200.
    pub async fn generation_commits(
        &self,
        environment: &str,
        generations: &[i64],
    ) -> Result<Vec<GenerationCommit>, LedgerError> {
        let mut out = Vec::new();
        for chunk in generations.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!(
                "SELECT g.generation, r.sha, r.principals, r.fingerprint, r.seen_at FROM deployment_generations g \
                 JOIN revisions r ON r.id = g.revision_id WHERE g.environment = ? AND g.generation IN ({marks})"
            );
            let mut query = sqlx::query_as::<_, GenerationCommit>(self.sql(&q)).bind(environment);
            for g in chunk {
                query = query.bind(*g);
            }
            out.extend(query.fetch_all(&self.pool).await?);
        }
        Ok(out)
    }

    /// Records the judgement of a commit of `branch`, with an event, in one transaction.
    /// Returns `false` (and writes nothing) when that commit was judged before.
    pub async fn record_revision(
        &self,
        branch: &str,
        j: &state_repo::revision::Judgement,
        now_ms: i64,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let id = self.record_revision_in(&mut tx, branch, j, now_ms).await?;
        tx.commit().await?;
        Ok(id.is_some())
    }

    /// Records a judgement in the caller's transaction; `None` when it was judged before.
    pub(crate) async fn record_revision_in(
        &self,
        tx: &mut WriteTx,
        branch: &str,
        j: &state_repo::revision::Judgement,
        now_ms: i64,
    ) -> Result<Option<i64>, LedgerError> {
        let verdict = if j.accepted() { "accepted" } else { "rejected" };
        let reasons = serde_json::to_string(&j.reasons)?;
        let id: Option<i64> = sqlx::query_scalar(self.sql(
            "INSERT INTO revisions (sha, branch, verdict, principals, fingerprint, reasons, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sha, branch) DO NOTHING RETURNING id",
        ))
        .bind(&j.sha)
        .bind(branch)
        .bind(verdict)
        .bind(j.principals.clone())
        .bind(j.fingerprint.clone())
        .bind(&reasons)
        .bind(now_ms)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(id) = id else { return Ok(None) };
        if j.accepted() {
            for image in j.images_on(agent_proto::images::STORE_HOST) {
                sqlx::query(self.sql("INSERT INTO revision_images (revision_id, image) VALUES (?, ?)"))
                    .bind(id)
                    .bind(&image)
                    .execute(&mut **tx)
                    .await?;
            }
        }
        let detail = if j.accepted() {
            j.principals.clone().unwrap_or_default()
        } else {
            j.reasons.iter().map(|x| x.code.as_str()).collect::<Vec<_>>().join(",")
        };
        let subject = format!("{branch}@{}", j.sha);
        self.events()
            .event(tx, now_ms, &format!("revision-{verdict}"), &subject, &detail)
            .await?;
        Ok(Some(id))
    }

    /// The newest accepted commit of a branch: the one in force.
    pub async fn last_accepted(&self, branch: &str) -> Result<Option<String>, LedgerError> {
        self.branch_position(branch, "AND verdict = 'accepted'").await
    }

    /// The newest of `branch`'s revisions (those `filter` keeps) and of its approved rewrites
    /// applied again: a return to an earlier accepted commit puts that commit back in force.
    /// Two indexed reads of one row each, however long the history.
    pub(crate) async fn branch_position(&self, branch: &str, filter: &str) -> Result<Option<String>, LedgerError> {
        let q = format!("SELECT sha, seen_at FROM revisions WHERE branch = ? {filter} ORDER BY id DESC LIMIT 1");
        let judged: Option<(String, i64)> = sqlx::query_as(self.sql(&q))
            .bind(branch)
            .fetch_optional(&self.pool)
            .await?;
        let again: Option<(String, i64)> = sqlx::query_as(self.sql(
            "SELECT sha, applied_at FROM history_rewrites WHERE branch = ? AND applied_at IS NOT NULL \
             ORDER BY applied_at DESC, id DESC LIMIT 1",
        ))
        .bind(branch)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match (judged, again) {
            (Some((sha, seen)), Some((again_sha, applied))) => Some(if applied >= seen { again_sha } else { sha }),
            (one, other) => one.or(other).map(|(sha, _)| sha),
        })
    }

    /// A judged commit's verdict and reason codes.
    pub async fn revision(&self, branch: &str, sha: &str) -> Result<Option<(String, Vec<String>)>, LedgerError> {
        let row: Option<(String, String)> =
            sqlx::query_as(self.sql("SELECT verdict, reasons FROM revisions WHERE branch = ? AND sha = ?"))
                .bind(branch)
                .bind(sha)
                .fetch_optional(&self.pool)
                .await?;
        let Some((verdict, reasons)) = row else { return Ok(None) };
        let reasons: Vec<serde_json::Value> = serde_json::from_str(&reasons)?;
        Ok(Some((
            verdict,
            reasons
                .iter()
                .filter_map(|v| v["code"].as_str().map(str::to_owned))
                .collect(),
        )))
    }

    /// The newest commit of a branch judged at all, accepted or not.
    pub async fn last_judged(&self, branch: &str) -> Result<Option<String>, LedgerError> {
        self.branch_position(branch, "").await
    }

    /// The branches with an accepted revision (at most 10,000), by name.
    pub async fn accepted_branches(&self) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(
            self.sql("SELECT DISTINCT branch FROM revisions WHERE verdict = 'accepted' ORDER BY branch LIMIT 10000"),
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Branches with deployments that are not torn down.
    pub async fn deployed_branches(&self) -> Result<Vec<String>, LedgerError> {
        Ok(sqlx::query_scalar(
            self.sql("SELECT DISTINCT branch FROM deployments WHERE action = 'rollout' ORDER BY branch"),
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
