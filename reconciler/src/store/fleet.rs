//! Nodes joining the fleet: one-time enrolment tokens (stored as hashes, 15 minutes, one node
//! declared in the applied branch's accepted state), and enrolment itself, which records the
//! node's age recipient and its first certificate in one transaction. Every refusal is checked
//! before anything is written, and records nothing.

use crate::store::LedgerError;
use agent_proto::Refusal;
use sha2::{Digest, Sha256};
use sqlx::FromRow;

/// How long an enrolment token lives.
pub const TOKEN_TTL_MS: i64 = 15 * 60 * 1000;

/// What enrolment wants to write once every check passed.
pub struct Enrolment<'a> {
    pub node: &'a str,
    pub token: &'a str,
    pub age_recipient: &'a str,
    pub fingerprint: &'a str,
    /// The signing CA's fingerprint.
    pub ca: &'a str,
    pub not_after_ms: i64,
}

fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// One node as `pl nodes` shows it: what Git declares and what the control plane has seen.
#[derive(Clone, Debug)]
pub struct NodeRow {
    pub name: String,
    pub pool: String,
    /// `not-enrolled`, `active`, `unhealthy`, `lost`, `draining` or `retired`.
    pub state: String,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub last_seen_ms: Option<i64>,
    pub agent_version: Option<String>,
    /// The agent protocol its last heartbeat spoke; `None` when it never beat.
    pub agent_protocol: Option<u32>,
    /// Its agent speaks an older protocol than this control plane (`rollout::for_agents`
    /// shapes its tasks).
    pub older_agent: bool,
    /// Replicas placed on the node by the current deployments (what was asked).
    pub instances: usize,
    /// Replicas the node's agent last reported running and healthy (what is true there).
    pub running: usize,
    /// CPU (millis) and memory (bytes) those replicas reserve.
    pub reserved_cpu_millis: u64,
    pub reserved_memory_bytes: u64,
    /// What the agent says it can run (`docker`, `ingress`, …).
    pub capabilities: Vec<String>,
    /// The CA (SHA-256 fingerprint, hex) of the node's newest valid certificate: during a CA
    /// rotation, the second phase may start once every node shows the new one.
    pub certificate_ca: Option<String>,
}

/// A certificate as stored, with whether the one it replaced is revoked.
#[derive(Clone, Debug, FromRow)]
pub struct CertRecord {
    pub node: String,
    pub not_after: i64,
    pub revoked_at: Option<i64>,
    pub replaces: Option<String>,
    pub replaced_revoked: Option<i64>,
}

/// An enrolment token as stored: the node it is for, its expiry, when it was used.
#[derive(Clone, Debug, FromRow)]
pub struct TokenRecord {
    pub node: String,
    pub expires_at: i64,
    pub used_at: Option<i64>,
}

impl crate::store::Nodes<'_> {
    /// A client certificate's record (by fingerprint), if the control plane issued it.
    pub async fn certificate_record(&self, fingerprint: &str) -> Result<Option<CertRecord>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT c.node, c.not_after, c.revoked_at, c.replaces, p.revoked_at AS replaced_revoked FROM node_certificates c \
             LEFT JOIN node_certificates p ON p.fingerprint = c.replaces WHERE c.fingerprint = ?",
        ))
        .bind(fingerprint)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Revokes `old`, the certificate `node`'s renewed one replaced (on the new one's first
    /// use), with its event; nothing when it is revoked already.
    pub async fn revoke_replaced(&self, node: &str, old: &str, now_ms: i64) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(
            self.sql("UPDATE node_certificates SET revoked_at = ? WHERE fingerprint = ? AND revoked_at IS NULL"),
        )
        .bind(now_ms)
        .bind(old)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if n > 0 {
            self.events()
                .event(&mut tx, now_ms, "certificate-revoked", node, &format!("{old}: renewed"))
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records a renewed certificate for `node`, replacing `old` (revoked on the new one's
    /// first use).
    pub async fn add_renewed_certificate(
        &self,
        node: &str,
        old: &str,
        issued: &crate::pki::Issued,
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(self.sql(
            "INSERT INTO node_certificates (fingerprint, node, issued_at, not_after, replaces, ca) VALUES (?, ?, ?, ?, ?, ?)",
        ))
        .bind(&issued.fingerprint)
        .bind(node)
        .bind(now_ms)
        .bind(issued.not_after_ms)
        .bind(old)
        .bind(&issued.ca_fingerprint)
        .execute(&mut *tx)
        .await?;
        self.events()
            .event(&mut tx, now_ms, "certificate-renewed", node, &issued.fingerprint)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Revokes every certificate of the `retired` nodes (those retired in the applied
    /// branch's accepted state). Level triggered: run on every pass, it writes only when a
    /// retired node still has a live one.
    pub async fn revoke_retired(&self, retired: &[String], now_ms: i64) -> Result<usize, LedgerError> {
        if retired.is_empty() {
            return Ok(0);
        }
        let mut tx = self.write_tx().await?;
        let marks = vec!["?"; retired.len()].join(", ");
        let q = format!(
            "UPDATE node_certificates SET revoked_at = ? WHERE revoked_at IS NULL AND node IN ({marks}) RETURNING node"
        );
        let mut query = sqlx::query_scalar::<_, String>(self.sql(&q)).bind(now_ms);
        for n in retired {
            query = query.bind(n.clone());
        }
        let revoked = query.fetch_all(&mut *tx).await?;
        for node in &revoked {
            self.events()
                .event(
                    &mut tx,
                    now_ms,
                    "certificate-revoked",
                    node,
                    "the node is retired in Git",
                )
                .await?;
        }
        tx.commit().await?;
        Ok(revoked.len())
    }
}

/// A certificate the control CA signed that the ledger did not hold, re-admitted.
pub struct Readmitted<'a> {
    pub node: &'a str,
    pub fingerprint: &'a str,
    /// The fingerprint of the CA that signed it.
    pub ca: &'a str,
    /// Its `notBefore`, standing in for when it was issued.
    pub issued_at_ms: i64,
    pub not_after_ms: i64,
}

/// What one heartbeat says, checked and bounded by the API.
#[derive(Clone, Copy, Debug)]
pub struct Beat<'a> {
    pub agent_version: &'a str,
    /// The task set the agent runs (`agent_proto::PROTOCOL`; 0: an agent before it).
    pub protocol: u32,
    pub capabilities: &'a [String],
    /// The machine the node runs on, when the agent said.
    pub host: Option<&'a str>,
    /// What runs (JSON, bounded by the request limit).
    pub observed: &'a str,
    /// (environment, what) for each drift repaired.
    pub repaired: &'a [(String, String)],
    /// Indices of the pool's /24s that others' networks use on the node's machine,
    /// comma-separated (empty: none).
    pub taken_subnets: &'a str,
    /// The node's mesh, checked: (public key, port, address, its own names as JSON).
    pub mesh: Option<(&'a str, u16, Option<&'a str>, &'a str)>,
    /// The extra silence the node gets before each liveness step: the interval it is told
    /// next is longer than the thresholds' (`state_schema::placement::heartbeats::grace_ms`).
    pub grace_ms: i64,
}

/// What the ledger held of a node before its heartbeat: what the heartbeat's use case
/// (`ops::agents`) compares the new one with.
#[derive(Clone, Debug, FromRow)]
pub struct BeatRow {
    /// The last heartbeat's time with the grace it was given: what liveness measures from.
    pub last_seen: Option<i64>,
    /// Comma-separated.
    pub capabilities: String,
    /// What ran (JSON), as last reported.
    pub observed: Option<String>,
    pub mesh_key: Option<String>,
    pub mesh_names: Option<String>,
    /// Empty for a node re-admitted without its enrolment (`ops::agents::readmit`).
    pub age_recipient: String,
}

impl crate::store::Nodes<'_> {
    /// Each repair the agent reports becomes a `drift-repaired` event of its environment.
    pub async fn record_repairs(
        &self,
        node: &str,
        repaired: &[(String, String)],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        if repaired.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        let events: Vec<(String, String, String)> = repaired
            .iter()
            .map(|(env, what)| ("drift-repaired".to_owned(), env.clone(), format!("{node}: {what}")))
            .collect();
        self.events().events_in(&mut tx, now_ms, &events).await?;
        tx.commit().await?;
        Ok(())
    }

    /// How many nodes are enrolled: what heartbeat intervals are derived from.
    pub async fn enrolled_count(&self) -> Result<u64, LedgerError> {
        let n: i64 = sqlx::query_scalar(self.sql("SELECT COUNT(*) FROM nodes"))
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// What the ledger holds of `node` from its last heartbeat (`None`: not enrolled).
    pub async fn beat_row(&self, node: &str) -> Result<Option<BeatRow>, LedgerError> {
        Ok(sqlx::query_as(self.sql(
            "SELECT last_seen + beat_grace_ms AS last_seen, capabilities, observed, mesh_key, mesh_names, age_recipient \
             FROM nodes WHERE name = ?",
        ))
        .bind(node)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Records a heartbeat: the node was seen now, running this agent version, able to run
    /// its capabilities, and running what its `observed` (JSON, bounded by the request limit)
    /// says.
    pub async fn record_beat(&self, node: &str, beat: &Beat<'_>, now_ms: i64) -> Result<(), LedgerError> {
        let Beat {
            agent_version,
            protocol,
            capabilities,
            host,
            observed,
            taken_subnets,
            mesh,
            grace_ms,
            ..
        } = *beat;
        sqlx::query(self.sql(
            "UPDATE nodes SET last_seen = ?, agent_version = ?, agent_protocol = ?, capabilities = ?, observed = ?, \
                 host = COALESCE(?, host), taken_subnets = ?, mesh_key = ?, mesh_port = ?, mesh_address = ?, mesh_names = ?, \
                 beat_grace_ms = ? WHERE name = ?",
        ))
        .bind(now_ms)
        .bind(agent_version)
        .bind(i64::from(protocol))
        .bind(capabilities.join(","))
        .bind(observed)
        .bind(host)
        .bind(taken_subnets)
        .bind(mesh.map(|m| m.0))
        .bind(mesh.map(|m| i64::from(m.1)))
        .bind(mesh.and_then(|m| m.2))
        .bind(mesh.map(|m| m.3))
        .bind(grace_ms)
        .bind(node)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The node each of `job_ids` is targeted at (jobs that do not exist are left out).
    pub async fn job_nodes(&self, job_ids: &[i64]) -> Result<Vec<(i64, String)>, LedgerError> {
        let mut out = Vec::new();
        for chunk in job_ids.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let q = format!("SELECT id, target_node FROM jobs WHERE id IN ({marks})");
            let mut query = sqlx::query_as::<_, (i64, String)>(self.sql(&q));
            for id in chunk {
                query = query.bind(*id);
            }
            out.extend(query.fetch_all(&self.pool).await?);
        }
        Ok(out)
    }

    /// What each node's agent last reported running (its heartbeat's `running`), by node, for
    /// nodes heard from since `since_ms` (an older report is no longer known to be true).
    pub async fn observed_replicas(
        &self,
        since_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, Vec<agent_proto::RunningInstance>>, LedgerError> {
        self.observed_replicas_among(None, since_ms).await
    }

    /// [`Self::observed_replicas`] of `nodes` alone: a page of `GET /v1/nodes` parses its own
    /// nodes' reports, not the fleet's.
    pub async fn observed_replicas_of(
        &self,
        nodes: &[&str],
        since_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, Vec<agent_proto::RunningInstance>>, LedgerError> {
        self.observed_replicas_among(Some(nodes), since_ms).await
    }

    async fn observed_replicas_among(
        &self,
        nodes: Option<&[&str]>,
        since_ms: i64,
    ) -> Result<std::collections::BTreeMap<String, Vec<agent_proto::RunningInstance>>, LedgerError> {
        let mut out = std::collections::BTreeMap::new();
        let among = match nodes {
            Some(_) => format!(" AND {}", self.text_in("name")),
            None => String::new(),
        };
        let q = format!(
            "SELECT name, observed FROM nodes WHERE observed IS NOT NULL AND last_seen + beat_grace_ms >= ?{among}"
        );
        let mut query = sqlx::query_as::<_, (String, String)>(self.sql(&q)).bind(since_ms);
        if let Some(nodes) = nodes {
            query = query.bind(serde_json::to_string(nodes)?);
        }
        for (name, text) in query.fetch_all(&self.pool).await? {
            out.insert(name, serde_json::from_str(&text).unwrap_or_default());
        }
        Ok(out)
    }

    /// The CA (SHA-256 fingerprint) of each node's newest valid certificate, by node.
    pub async fn node_cas(&self) -> Result<std::collections::BTreeMap<String, String>, LedgerError> {
        self.node_cas_among(None).await
    }

    /// [`Self::node_cas`] of `nodes` alone (a page of `GET /v1/nodes`).
    pub async fn node_cas_of(&self, nodes: &[&str]) -> Result<std::collections::BTreeMap<String, String>, LedgerError> {
        self.node_cas_among(Some(nodes)).await
    }

    async fn node_cas_among(
        &self,
        nodes: Option<&[&str]>,
    ) -> Result<std::collections::BTreeMap<String, String>, LedgerError> {
        let among = match nodes {
            Some(_) => format!(" AND {}", self.text_in("node")),
            None => String::new(),
        };
        // Later certificates of a node overwrite earlier ones: the newest CA wins.
        let q = format!(
            "SELECT node, ca FROM node_certificates WHERE revoked_at IS NULL AND ca IS NOT NULL{among} ORDER BY issued_at, fingerprint"
        );
        let mut query = sqlx::query_as::<_, (String, String)>(self.sql(&q));
        if let Some(nodes) = nodes {
            query = query.bind(serde_json::to_string(nodes)?);
        }
        Ok(query.fetch_all(&self.pool).await?.into_iter().collect())
    }

    /// Stores a new token's hash for `node`; the caller checked that the node is declared.
    pub async fn add_enrolment_token(
        &self,
        node: &str,
        token: &str,
        by: &str,
        now_ms: i64,
    ) -> Result<i64, LedgerError> {
        let expires = now_ms + TOKEN_TTL_MS;
        let mut tx = self.write_tx().await?;
        sqlx::query(self.sql(
            "INSERT INTO enrolment_tokens (token_hash, node, created_by, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
        ))
        .bind(hash(token))
        .bind(node)
        .bind(by)
        .bind(now_ms)
        .bind(expires)
        .execute(&mut *tx)
        .await?;
        self.events()
            .event(&mut tx, now_ms, "enrolment-token", node, by)
            .await?;
        tx.commit().await?;
        Ok(expires)
    }

    /// An enrolment token's record (by its hash), if it was ever made.
    pub async fn enrolment_token(&self, token: &str) -> Result<Option<TokenRecord>, LedgerError> {
        Ok(
            sqlx::query_as(self.sql("SELECT node, expires_at, used_at FROM enrolment_tokens WHERE token_hash = ?"))
                .bind(hash(token))
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Records a node re-admitted by a certificate the control CA signed that the ledger does
    /// not hold (`ops::agents::readmit`): the node (with no recipient yet: its first heartbeat
    /// gives it), the certificate and a `node-readmitted` event, in one transaction. `false`,
    /// writing nothing, when the ledger has the node already: only a node it never knew is
    /// re-admitted.
    pub async fn readmit(&self, r: &Readmitted<'_>, now_ms: i64) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let made = sqlx::query(self.sql(
            "INSERT INTO nodes (name, age_recipient, enrolled_at) VALUES (?, '', ?) ON CONFLICT (name) DO NOTHING",
        ))
        .bind(r.node)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if made == 0 {
            return Ok(false);
        }
        sqlx::query(
            self.sql(
                "INSERT INTO node_certificates (fingerprint, node, issued_at, not_after, ca) VALUES (?, ?, ?, ?, ?)",
            ),
        )
        .bind(r.fingerprint)
        .bind(r.node)
        .bind(r.issued_at_ms)
        .bind(r.not_after_ms)
        .bind(r.ca)
        .execute(&mut *tx)
        .await?;
        self.events()
            .event(&mut tx, now_ms, "node-readmitted", r.node, r.fingerprint)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Keeps `recipient` as `node`'s when the ledger holds none for it (a re-admitted node's
    /// first heartbeat), with a `node-recipient-learned` event.
    pub async fn learn_recipient(&self, node: &str, recipient: &str, now_ms: i64) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        let set = sqlx::query(self.sql("UPDATE nodes SET age_recipient = ? WHERE name = ? AND age_recipient = ''"))
            .bind(recipient)
            .bind(node)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if set > 0 {
            self.events()
                .event(&mut tx, now_ms, "node-recipient-learned", node, recipient)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records an enrolment in one transaction: the token is used (only if it still is
    /// unused and live: a concurrent enrolment with the same token loses and writes nothing),
    /// the node's recipient, its certificate, an event. `Some(refusal)` when the token was
    /// taken meanwhile.
    pub async fn enroll(&self, e: &Enrolment<'_>, now_ms: i64) -> Result<Option<Refusal>, LedgerError> {
        let mut tx = self.write_tx().await?;
        let used = sqlx::query(self.sql(
            "UPDATE enrolment_tokens SET used_at = ? WHERE token_hash = ? AND node = ? AND used_at IS NULL AND expires_at > ?",
        ))
        .bind(now_ms)
        .bind(hash(e.token))
        .bind(e.node)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if used == 0 {
            return Ok(Some(Refusal::TokenUsed));
        }
        sqlx::query(self.sql(
            "INSERT INTO nodes (name, age_recipient, enrolled_at) VALUES (?, ?, ?) \
             ON CONFLICT (name) DO UPDATE SET age_recipient = excluded.age_recipient, enrolled_at = excluded.enrolled_at",
        ))
        .bind(e.node)
        .bind(e.age_recipient)
        .bind(now_ms)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            self.sql(
                "INSERT INTO node_certificates (fingerprint, node, issued_at, not_after, ca) VALUES (?, ?, ?, ?, ?)",
            ),
        )
        .bind(e.fingerprint)
        .bind(e.node)
        .bind(now_ms)
        .bind(e.not_after_ms)
        .bind(e.ca)
        .execute(&mut *tx)
        .await?;
        self.events()
            .event(&mut tx, now_ms, "node-enrolled", e.node, e.fingerprint)
            .await?;
        tx.commit().await?;
        Ok(None)
    }
}
