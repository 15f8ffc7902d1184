//! Wakes between the replicas of a pair on PostgreSQL (`LISTEN`/`NOTIFY`): the leader queues
//! jobs that the other replica's agents wait for, and that replica records completions the
//! leader's next step waits on. Without a word between them each learned of the other's writes
//! by its own periodic look (a follower's waiting leases once a second, the leader's settle at
//! its next pass): a pair's 100-node release took 2.8 s where one daemon took 0.6. A wake is a
//! hint, never the record: what it says is read from the ledger, and a wake lost (a connection
//! dropped, a replica restarting) costs only the periodic look's delay. SQLite has one daemon:
//! nothing to say.

use super::{Backend, Ledger, LedgerError};

/// The one channel; the payload says what and who (`jobs:<instance>`).
const CHANNEL: &str = "pushleft_wakes";

/// What another replica wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Jobs queued: this replica's waiting leases look whether any are their nodes'.
    Jobs,
    /// Agents' completions recorded: the leader's next step may be due.
    Completions,
}

impl Wake {
    fn as_str(self) -> &'static str {
        match self {
            Wake::Jobs => "jobs",
            Wake::Completions => "completions",
        }
    }

    fn parse(s: &str) -> Option<Wake> {
        match s {
            "jobs" => Some(Wake::Jobs),
            "completions" => Some(Wake::Completions),
            _ => None,
        }
    }
}

/// The other replicas' wakes, as this one hears them (its own are left out).
pub struct Wakes {
    listener: sqlx::postgres::PgListener,
    instance: String,
}

impl Wakes {
    /// The next wake another replica sent. A dropped connection is opened again here
    /// (what was said meanwhile is lost: the periodic looks cover it); an error is a ledger
    /// that cannot be reached, for the caller to wait out.
    pub async fn next(&mut self) -> Result<Wake, LedgerError> {
        loop {
            let n = self.listener.recv().await?;
            let Some((what, who)) = n.payload().split_once(':') else {
                continue;
            };
            if who == self.instance {
                continue;
            }
            if let Some(wake) = Wake::parse(what) {
                return Ok(wake);
            }
        }
    }
}

impl Ledger {
    /// Tells the other replicas what this one wrote (PostgreSQL; nothing on SQLite). Sent after
    /// the write committed, outside its transaction.
    pub async fn announce(&self, wake: Wake) -> Result<(), LedgerError> {
        if self.backend != Backend::Postgres {
            return Ok(());
        }
        let payload = format!("{}:{}", wake.as_str(), self.instance);
        sqlx::query(self.sql("SELECT 1 FROM (SELECT pg_notify(?, ?)) AS sent"))
            .bind(CHANNEL)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Listens for the other replicas' wakes on a connection of its own (PostgreSQL; `None`
    /// on SQLite).
    pub async fn wakes(&self) -> Result<Option<Wakes>, LedgerError> {
        let Some(url) = self.listen_url.as_deref() else {
            return Ok(None);
        };
        let mut listener = sqlx::postgres::PgListener::connect(url).await?;
        listener.listen(CHANNEL).await?;
        Ok(Some(Wakes {
            listener,
            instance: self.instance.clone(),
        }))
    }
}
