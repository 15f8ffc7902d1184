//! Volumes as the ledger keeps them: one row per environment's volume, naming the node that
//! holds it (its pin), its generation, when its environment let it go, and what its agent
//! last measured. SQL only; placement reads the pins (`state_schema::placement::Pin`), the
//! deploy path records them in the transaction that writes the generation.

use super::LedgerError;
use sqlx::FromRow;
use state_schema::deployment::DeploymentSpec;
use state_schema::placement::Pin;
use state_schema::values::Name;

/// A volume's row.
#[derive(Clone, Debug, PartialEq, Eq, FromRow)]
pub struct VolumeRow {
    pub environment: String,
    pub volume: String,
    pub role: String,
    pub node: String,
    pub generation: i64,
    pub size_bytes: Option<i64>,
    pub retain_days: i64,
    pub created_at: i64,
    pub released_at: Option<i64>,
    pub bytes: Option<i64>,
    pub measured_at: i64,
    pub drain_blocked_at: Option<i64>,
    /// While a move is under way: the node it goes to.
    pub moving_to: Option<String>,
    /// When the last move was asked for.
    pub move_asked_at: Option<i64>,
    /// The node the last move left (once its data was restored on the new one).
    pub moved_from: Option<String>,
    /// When the last move's role was healthy on the new node.
    pub moved_up_at: Option<i64>,
    /// Why the last move ended without moving the volume.
    pub move_failure: Option<String>,
}

impl VolumeRow {
    /// The task that removes this released volume from its node; `None` while it is in use
    /// (not released) or for names that do not parse (never written so).
    pub fn removal(&self) -> Option<state_schema::task::Task> {
        Some(state_schema::task::Task::RemoveVolume {
            environment: Name::new(&self.environment).ok()?,
            volume: Name::new(&self.volume).ok()?,
            generation: u64::try_from(self.generation).ok()?,
            released_at: self.released_at?,
        })
    }
}

const COLUMNS: &str = "environment, volume, role, node, generation, size_bytes, retain_days, created_at, released_at, bytes, measured_at, drain_blocked_at, moving_to, move_asked_at, moved_from, moved_up_at, move_failure";

/// Why a volume cannot be removed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeRefusal {
    /// No such volume.
    Unknown,
    /// Its environment runs: a volume is removed only once its environment is torn down.
    InUse,
}

/// One measurement an agent reported: a volume of the node and the bytes it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measured {
    pub environment: String,
    pub volume: String,
    pub generation: u64,
    pub bytes: u64,
}

impl crate::store::Volumes<'_> {
    /// Every volume row, by environment and name.
    pub async fn volumes(&self) -> Result<Vec<VolumeRow>, LedgerError> {
        let q = format!("SELECT {COLUMNS} FROM volumes ORDER BY environment, volume");
        Ok(sqlx::query_as(self.sql(&q)).fetch_all(&self.pool).await?)
    }

    /// One environment's volumes.
    pub async fn volumes_of(&self, environment: &str) -> Result<Vec<VolumeRow>, LedgerError> {
        let q = format!("SELECT {COLUMNS} FROM volumes WHERE environment = ? ORDER BY volume");
        Ok(sqlx::query_as(self.sql(&q))
            .bind(environment)
            .fetch_all(&self.pool)
            .await?)
    }

    /// Where each role with volumes has its data: placement's pins. A row whose names no
    /// longer parse (never written so) pins nothing.
    pub async fn volume_pins(&self) -> Result<Vec<Pin>, LedgerError> {
        // A volume between a move's ask and its restore on the new node (`moving_to` set,
        // `moved_from` not yet) pins its role to nowhere: it runs nowhere meanwhile.
        let rows: Vec<(String, String, String, String, i64, i64)> = sqlx::query_as(self.sql(
            "SELECT environment, role, node, volume, generation, \
                 CAST(CASE WHEN moving_to IS NOT NULL AND moved_from IS NULL THEN 1 ELSE 0 END AS BIGINT) \
                 FROM volumes ORDER BY environment, role, volume",
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<Pin> = Vec::new();
        for (e, r, n, v, g, moving) in rows {
            let moving = moving == 1;
            let (Ok(environment), Ok(role), Ok(node), Ok(volume)) =
                (Name::new(&e), Name::new(&r), Name::new(&n), Name::new(&v))
            else {
                continue;
            };
            if !out
                .last()
                .is_some_and(|p| p.environment == environment && p.role == role)
            {
                out.push(Pin {
                    environment,
                    role,
                    node,
                    generations: Vec::new(),
                    moving,
                });
            } else if let Some(pin) = out.last_mut() {
                pin.moving |= moving;
            }
            if let (Some(pin), Ok(g)) = (out.last_mut(), u64::try_from(g))
                && g > 1
            {
                pin.generations.push((volume, g));
            }
        }
        Ok(out)
    }

    /// What changes whenever a volume moves to a new generation (a restore, a move's restore)
    /// or a move that failed hands its role back: part of the fleet's signature, so its role
    /// is placed again (on the new generation, or where its data stayed).
    pub(crate) async fn volume_generation_mark(&self) -> Result<(i64, i64), LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT CAST(COALESCE(SUM(generation), 0) AS BIGINT), CAST(COUNT(move_failure) AS BIGINT) FROM volumes",
        ))
        .fetch_one(&self.pool)
        .await?)
    }

    /// Records the volumes of `spec`'s roles where placement put them: a new volume gets the
    /// node of its role's instance (or run) as its pin; a kept one (an environment back within
    /// `retainDays`) is taken up again where it is. The node is never rewritten here: only an
    /// explicit move changes it.
    pub(crate) async fn record_volumes(
        &self,
        tx: &mut super::WriteTx,
        spec: &DeploymentSpec,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let env = spec.environment.as_str();
        for (role, r) in spec.roles.iter() {
            if r.volumes.is_empty() {
                continue;
            }
            let node = spec
                .instances
                .iter()
                .find(|i| &i.role == role)
                .map(|i| &i.node)
                .or_else(|| {
                    spec.release
                        .iter()
                        .chain(&spec.cron)
                        .find(|(n, _)| n == role)
                        .map(|(_, n)| n)
                });
            let Some(node) = node else { continue };
            for v in &r.volumes {
                sqlx::query(self.sql(
                    "INSERT INTO volumes (environment, volume, role, node, size_bytes, retain_days, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (environment, volume) DO UPDATE SET released_at = NULL, role = excluded.role, \
                     size_bytes = excluded.size_bytes, retain_days = excluded.retain_days",
                ))
                .bind(env)
                .bind(&v.name)
                .bind(role.as_str())
                .bind(node.as_str())
                .bind(v.size_bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX)))
                .bind(i64::from(v.retain_days))
                .bind(now_ms)
                .execute(&mut **tx)
                .await?;
            }
        }
        Ok(())
    }

    /// Starts `environment`'s volumes' retention: a teardown keeps them `retain_days`.
    pub(crate) async fn release_volumes(
        &self,
        tx: &mut super::WriteTx,
        environment: &str,
        now_ms: i64,
    ) -> Result<u64, LedgerError> {
        Ok(
            sqlx::query(self.sql("UPDATE volumes SET released_at = ? WHERE environment = ? AND released_at IS NULL"))
                .bind(now_ms)
                .bind(environment)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
        )
    }

    /// Released volumes whose retention is over at `now_ms` (at most 256 a call).
    pub async fn expired_volumes(&self, now_ms: i64) -> Result<Vec<VolumeRow>, LedgerError> {
        let q = format!(
            "SELECT {COLUMNS} FROM volumes WHERE released_at IS NOT NULL AND released_at + retain_days * 86400000 <= ? \
             ORDER BY released_at, environment, volume LIMIT 256"
        );
        Ok(sqlx::query_as(self.sql(&q)).bind(now_ms).fetch_all(&self.pool).await?)
    }

    /// Ends a released volume's retention now (`pl volume rm`): the next sweep removes it.
    /// Returns the row as it was; a volume whose environment runs is refused (`None` and
    /// `false`), one that does not exist is `None` and `true`.
    pub async fn expire_volume(
        &self,
        environment: &str,
        volume: &str,
        now_ms: i64,
    ) -> Result<Result<VolumeRow, VolumeRefusal>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let q = format!("SELECT {COLUMNS} FROM volumes WHERE environment = ? AND volume = ?");
        let row: Option<VolumeRow> = sqlx::query_as(self.sql(&q))
            .bind(environment)
            .bind(volume)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(Err(VolumeRefusal::Unknown));
        };
        if row.released_at.is_none() {
            return Ok(Err(VolumeRefusal::InUse));
        }
        sqlx::query(self.sql("UPDATE volumes SET retain_days = 0 WHERE environment = ? AND volume = ?"))
            .bind(environment)
            .bind(volume)
            .execute(&mut *tx)
            .await?;
        self.events()
            .event(
                &mut tx,
                now_ms,
                "volume-remove-requested",
                &format!("{environment}/{volume}"),
                "an admin ended its retention",
            )
            .await?;
        tx.commit().await?;
        Ok(Ok(row))
    }

    /// Forgets a volume its node removed, if it is still the released row the removal was
    /// for (an environment back in the meantime took it up again: kept).
    pub async fn forget_volume(&self, row: &VolumeRow, now_ms: i64) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let gone = sqlx::query(
            self.sql("DELETE FROM volumes WHERE environment = ? AND volume = ? AND generation = ? AND released_at = ?"),
        )
        .bind(&row.environment)
        .bind(&row.volume)
        .bind(row.generation)
        .bind(row.released_at)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if gone {
            self.events()
                .event(
                    &mut tx,
                    now_ms,
                    "volume-removed",
                    &format!("{}/{}", row.environment, row.volume),
                    &format!("generation {} on {}", row.generation, row.node),
                )
                .await?;
        }
        tx.commit().await?;
        Ok(gone)
    }

    /// Marks the volumes whose node drains (`blocked`: environment, role, node) and clears the
    /// others; each newly blocked one is a `volume-pinned` event, once. Returns how many were
    /// newly blocked.
    pub async fn mark_drain_blocked(&self, blocked: &[Pin], now_ms: i64) -> Result<usize, LedgerError> {
        let rows: Vec<(String, String, String, String, Option<i64>)> =
            sqlx::query_as(self.sql(
                "SELECT environment, volume, role, node, drain_blocked_at FROM volumes ORDER BY environment, volume",
            ))
            .fetch_all(&self.pool)
            .await?;
        let is_blocked = |e: &str, r: &str, n: &str| {
            blocked
                .iter()
                .any(|p| p.environment.as_str() == e && p.role.as_str() == r && p.node.as_str() == n)
        };
        let changes: Vec<(String, String, String, bool)> = rows
            .into_iter()
            .filter_map(|(e, v, r, n, at)| {
                let now_blocked = is_blocked(&e, &r, &n);
                (now_blocked != at.is_some()).then_some((e, v, n, now_blocked))
            })
            .collect();
        if changes.is_empty() {
            return Ok(0);
        }
        let mut tx = self.write_tx().await?;
        let mut newly = 0;
        for (e, v, n, now_blocked) in changes {
            sqlx::query(self.sql("UPDATE volumes SET drain_blocked_at = ? WHERE environment = ? AND volume = ?"))
                .bind(now_blocked.then_some(now_ms))
                .bind(&e)
                .bind(&v)
                .execute(&mut *tx)
                .await?;
            if now_blocked {
                newly += 1;
                self.events().event(
                    &mut tx,
                    now_ms,
                    "volume-pinned",
                    &format!("{e}/{v}"),
                    &format!("node {n} drains, and this volume keeps its role there: move it with `pl volume move`, or the drain waits"),
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(newly)
    }

    /// Stores what `node`'s agent measured of its volumes. Rows of other nodes are untouched,
    /// so an agent reports only what it holds.
    /// Keeps, for each of `node`'s volumes the ledger has no row of, the newest generation
    /// the node reports holding: a ledger rebuilt under running replicas mounts the volume
    /// generation they use (a restored one is not generation 1). The plan that follows fills
    /// in its role, size and retention.
    pub async fn adopt_volumes(&self, node: &str, measured: &[Measured], now_ms: i64) -> Result<(), LedgerError> {
        let mut newest: std::collections::BTreeMap<(&str, &str), u64> = std::collections::BTreeMap::new();
        for m in measured {
            let g = newest.entry((m.environment.as_str(), m.volume.as_str())).or_default();
            *g = (*g).max(m.generation);
        }
        let mut tx = self.write_tx().await?;
        for ((environment, volume), generation) in newest {
            sqlx::query(self.sql(
                "INSERT INTO volumes (environment, volume, role, node, generation, created_at) VALUES (?, ?, '', ?, ?, ?) \
                 ON CONFLICT (environment, volume) DO NOTHING",
            ))
            .bind(environment)
            .bind(volume)
            .bind(node)
            .bind(i64::try_from(generation).unwrap_or(i64::MAX))
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn record_volume_use(&self, node: &str, measured: &[Measured], now_ms: i64) -> Result<(), LedgerError> {
        if measured.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        for m in measured {
            sqlx::query(self.sql(
                "UPDATE volumes SET bytes = ?, measured_at = ? WHERE environment = ? AND volume = ? AND node = ? AND generation = ?",
            ))
            .bind(i64::try_from(m.bytes).unwrap_or(i64::MAX))
            .bind(now_ms)
            .bind(&m.environment)
            .bind(&m.volume)
            .bind(node)
            .bind(i64::try_from(m.generation).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
