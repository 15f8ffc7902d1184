//! Kept volume generations: the generations of a volume before its current one (a restore or
//! a move made a newer one), each on the node that holds it. Never mounted again and never
//! removed by Pushleft on its own: an admin removes one (`pl volume rm --generation`), and
//! the row goes once its node did. SQL only.

use super::{LedgerError, WriteTx};
use sqlx::FromRow;
use state_schema::values::Name;

/// A kept generation's row.
#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct KeptRow {
    pub environment: String,
    pub volume: String,
    pub generation: i64,
    pub node: String,
    /// When a newer generation took its place.
    pub kept_at: i64,
}

impl KeptRow {
    /// The task that removes it from its node (`None` for names that do not parse: never
    /// written so).
    pub fn removal(&self) -> Option<state_schema::task::Task> {
        Some(state_schema::task::Task::RemoveVolume {
            environment: Name::new(&self.environment).ok()?,
            volume: Name::new(&self.volume).ok()?,
            generation: u64::try_from(self.generation).ok()?,
            released_at: self.kept_at,
        })
    }
}

/// Why a generation cannot be removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeptRefusal {
    /// No such kept generation (nor such a volume).
    Unknown,
    /// It is the volume's current generation: its role mounts it.
    Current,
}

impl crate::store::Deployments<'_> {
    /// Records that `environment`'s `volume` left `generation` on `node` for a newer one, in
    /// the transaction that moved it.
    pub(crate) async fn keep_generation_in(
        &self,
        tx: &mut WriteTx,
        (environment, volume, generation): (&str, &str, i64),
        node: &str,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        sqlx::query(self.sql(
            "INSERT INTO volume_generations (environment, volume, generation, node, kept_at) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (environment, volume, generation) DO NOTHING",
        ))
        .bind(environment)
        .bind(volume)
        .bind(generation)
        .bind(node)
        .bind(now_ms)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Every kept generation, by environment, volume and generation.
    pub async fn kept_generations(&self) -> Result<Vec<KeptRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT environment, volume, generation, node, kept_at FROM volume_generations ORDER BY environment, volume, generation",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// The kept generation an admin asked to remove, or why it cannot be.
    pub async fn kept_generation(
        &self,
        environment: &str,
        volume: &str,
        generation: i64,
    ) -> Result<Result<KeptRow, KeptRefusal>, LedgerError> {
        let kept: Option<KeptRow> = sqlx::query_as(self.sql(
            "SELECT environment, volume, generation, node, kept_at FROM volume_generations \
             WHERE environment = ? AND volume = ? AND generation = ?",
        ))
        .bind(environment)
        .bind(volume)
        .bind(generation)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(k) = kept {
            return Ok(Ok(k));
        }
        let current: Option<i64> =
            sqlx::query_scalar(self.sql("SELECT generation FROM volumes WHERE environment = ? AND volume = ?"))
                .bind(environment)
                .bind(volume)
                .fetch_optional(&self.pool)
                .await?;
        Ok(Err(if current == Some(generation) {
            KeptRefusal::Current
        } else {
            KeptRefusal::Unknown
        }))
    }

    /// Forgets a kept generation its node removed, with an event. Whether it was still there.
    pub async fn forget_generation(&self, row: &KeptRow, now_ms: i64) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let gone = sqlx::query(
            self.sql("DELETE FROM volume_generations WHERE environment = ? AND volume = ? AND generation = ?"),
        )
        .bind(&row.environment)
        .bind(&row.volume)
        .bind(row.generation)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if gone {
            self.events()
                .event(
                    &mut tx,
                    now_ms,
                    "volume-generation-removed",
                    &format!("{}/{}", row.environment, row.volume),
                    &format!("generation {} on {}", row.generation, row.node),
                )
                .await?;
        }
        tx.commit().await?;
        Ok(gone)
    }
}
