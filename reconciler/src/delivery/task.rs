//! The one exhaustive map from the domain's task to the agent protocol's (`wire_task`): a task
//! the wire cannot carry does not compile.

use super::*;

/// The task as the agent receives it: one exhaustive mapping from the control plane's task
/// (validated names, idempotency keys) to the wire's, so a new task kind does not compile until
/// the protocol has it.
pub fn wire_task(task: &Task) -> agent_proto::Task {
    use agent_proto::Task as Wire;
    let s = |n: &dyn std::fmt::Display| n.to_string();
    match task {
        Task::EnsureEnvironment {
            environment,
            generation,
        } => Wire::EnsureEnvironment {
            environment: s(environment),
            generation: *generation,
        },
        Task::EnsureNetwork {
            environment,
            generation,
        } => Wire::EnsureNetwork {
            environment: s(environment),
            generation: *generation,
        },
        Task::ApplyFirewall {
            environment,
            generation,
        } => Wire::ApplyFirewall {
            environment: s(environment),
            generation: *generation,
        },
        Task::EnsureRoutes {
            environment,
            generation,
        } => Wire::EnsureRoutes {
            environment: s(environment),
            generation: *generation,
        },
        Task::EnsureApplication {
            environment,
            role,
            instance,
            generation,
            spec_hash,
            repair,
        } => Wire::EnsureApplication {
            environment: s(environment),
            role: s(role),
            instance: *instance,
            generation: *generation,
            spec_hash: spec_hash.clone(),
            repair: *repair,
        },
        Task::RunOnce {
            environment,
            role,
            generation,
        } => Wire::RunOnce {
            environment: s(environment),
            role: s(role),
            generation: *generation,
        },
        Task::RunCron {
            environment,
            role,
            generation,
            scheduled,
        } => Wire::RunCron {
            environment: s(environment),
            role: s(role),
            generation: *generation,
            scheduled: *scheduled,
        },
        Task::StopApplication {
            environment,
            role,
            instance,
            generation,
        } => Wire::StopApplication {
            environment: s(environment),
            role: s(role),
            instance: *instance,
            generation: *generation,
        },
        Task::TeardownApplication {
            environment,
            role,
            instance,
            generation,
        } => Wire::TeardownApplication {
            environment: s(environment),
            role: s(role),
            instance: *instance,
            generation: *generation,
        },
        Task::PublishIngress {
            environment,
            hostname,
            generation,
            repair,
            weight,
            wait: _,
            rolled: _,
        } => Wire::PublishIngress {
            environment: s(environment),
            hostname: s(hostname),
            generation: *generation,
            repair: *repair,
            weight: *weight,
        },
        // The weight, the wait and the gate are the control plane's: the agent only measures.
        Task::MeasureCanary {
            environment,
            hostname,
            generation,
            weight: _,
            wait: _,
            gate: _,
        } => Wire::MeasureCanary {
            environment: s(environment),
            hostname: s(hostname),
            generation: *generation,
        },
        Task::RemoveIngress {
            environment,
            hostname,
            generation,
        } => Wire::RemoveIngress {
            environment: s(environment),
            hostname: s(hostname),
            generation: *generation,
        },
        Task::RemoveNetwork {
            environment,
            generation,
        } => Wire::RemoveNetwork {
            environment: s(environment),
            generation: *generation,
        },
        Task::RemoveVolume {
            environment,
            volume,
            generation,
            ..
        } => Wire::RemoveVolume {
            environment: s(environment),
            volume: s(volume),
            generation: *generation,
        },
        Task::PlaceAcmeChallenge {
            environment,
            hostname,
            generation,
            token,
            key_authorization,
        } => Wire::PlaceAcmeChallenge {
            environment: s(environment),
            hostname: s(hostname),
            generation: *generation,
            token: token.clone(),
            key_authorization: key_authorization.clone(),
        },
        Task::RestoreVolume {
            environment,
            volume,
            generation,
            to,
            snapshot,
            ..
        } => Wire::RestoreVolume {
            environment: s(environment),
            volume: s(volume),
            generation: *generation,
            to: *to,
            snapshot: snapshot.clone(),
        },
        Task::BackupVolume {
            environment,
            volume,
            generation,
            scheduled,
            on_demand,
            ..
        } => Wire::BackupVolume {
            environment: s(environment),
            volume: s(volume),
            generation: *generation,
            scheduled: *scheduled,
            on_demand: *on_demand,
        },
        Task::VerifyBackup {
            environment,
            volume,
            generation,
            scheduled,
            on_demand,
        } => Wire::VerifyBackup {
            environment: s(environment),
            volume: s(volume),
            generation: *generation,
            scheduled: *scheduled,
            on_demand: *on_demand,
        },
    }
}
