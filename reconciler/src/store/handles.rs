//! The ledger's aggregates, each with its own handle: `ledger.deployments()`, `.jobs()`,
//! `.nodes()`, `.volumes()`, `.backups()`, `.certificates()`, `.domains()`, `.events()` (and
//! the outbox), `.revisions()` (and rewrites) and `.views()` (the read models the operator
//! API lists). A handle is a borrow of the one `Ledger` (its pool, its writer turn, its
//! dialect): what it adds is the aggregate's methods, so a caller names the aggregate it
//! reads or writes, and a layer's use of the store shows which aggregates it touches.

use super::Ledger;

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $accessor:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name<'a>(&'a Ledger);

        /// The ledger itself: its pool, dialect and write transactions.
        impl std::ops::Deref for $name<'_> {
            type Target = Ledger;
            fn deref(&self) -> &Ledger {
                self.0
            }
        }

        impl Ledger {
            pub fn $accessor(&self) -> $name<'_> {
                $name(self)
            }
        }
    };
}

handle!(
    /// Deployments: generations, rollouts and their steps, rollbacks and holds, watches, kept generations.
    Deployments,
    deployments
);
handle!(
    /// Jobs: enqueueing, leases, completions, drift repairs, cron runs, and the rows a lease's execution reads.
    Jobs,
    jobs
);
handle!(
    /// Nodes: enrolment, certificates, heartbeats, meshes, and what placement reads of the fleet.
    Nodes,
    nodes
);
handle!(
    /// Volumes: their rows, measurements, removals and moves.
    Volumes,
    volumes
);
handle!(
    /// Backups: runs, restores, drills and what operators asked.
    Backups,
    backups
);
handle!(
    /// Certificates the control plane issues for hostnames.
    Certificates,
    certificates
);
handle!(
    /// Custom domains and their checks.
    Domains,
    domains
);
handle!(
    /// Events (the cursor) and the outbox of notifications.
    Events,
    events
);
handle!(
    /// Revisions judged per branch, and rewrites of the applied branch.
    Revisions,
    revisions
);
handle!(
    /// The read models the operator API lists (revisions, deployments, jobs, counts).
    Views,
    views
);
handle!(
    /// The web view's sessions and one-time sign-in links.
    Sessions,
    sessions
);
