//! Where the tasks that write most run. SQLite has one writer: a transaction holds it while each
//! statement goes to the connection's thread and its answer comes back to the task. On the
//! daemon's runtime, busy with the TLS and HTTP of thousands of agents' connections, every such
//! answer waited its turn for a worker thread, stretching each hold (the group commit's averaged
//! 32 ms at 3,000 nodes there, 19 ms on a thread of its own, by `write_tx`'s debug line), and
//! every other writer waited behind it. So on SQLite the group committer and the reconcile loop each run
//! on a thread of their own, woken as soon as their statement is done. PostgreSQL has no one
//! writer, and its connections belong to the runtime that opened them: there they stay on the
//! daemon's runtime.

use super::{Backend, Ledger};
use std::future::Future;
use std::sync::{Arc, Mutex};

impl Ledger {
    /// Runs `task` where it best holds the ledger's writer (above); the returned receiver
    /// ends when it does. A thread that cannot start leaves the task on the daemon's runtime.
    pub fn spawn_writer<F>(&self, name: &str, task: F) -> tokio::sync::oneshot::Receiver<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (done, ended) = tokio::sync::oneshot::channel();
        let task = async move {
            task.await;
            let _ = done.send(());
        };
        if self.backend != Backend::Sqlite {
            tokio::spawn(task);
            return ended;
        }
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(error = %e, thread = name, "a writer's runtime did not start: it runs on the daemon's");
                tokio::spawn(task);
                return ended;
            }
        };
        // Shared, so that a thread that cannot start leaves the task to the caller.
        type Task = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
        let slot: Arc<Mutex<Option<Task>>> = Arc::new(Mutex::new(Some(Box::pin(task))));
        let theirs = Arc::clone(&slot);
        let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            if let Some(task) = theirs.lock().ok().and_then(|mut t| t.take()) {
                rt.block_on(task);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, thread = name, "a writer's thread did not start: it runs on the daemon's runtime");
            if let Some(task) = slot.lock().ok().and_then(|mut t| t.take()) {
                tokio::spawn(task);
            }
        }
        ended
    }
}
