//! The codes an agent's failed task starts its detail with (`code: detail`): a closed list,
//! shared by both ends, so the control plane can count failures by code (`/metrics`) with a
//! label set an agent cannot grow. A code not in it counts as `other`. `agent/tests/codes.rs`
//! checks every code the agent's source writes is here.

/// Every failure code an agent reports, sorted.
pub const FAILURE_CODES: &[&str] = &[
    "acme-challenge-invalid",
    "acme-challenge-unanswered",
    "agent-task-failed",
    "backup-command-failed",
    "backup-container-not-running",
    "backup-failed",
    "backup-input-failed",
    "backup-repository-refused",
    "backup-repository-unreachable",
    "backup-secret-incomplete",
    "backup-secret-refused",
    "bridge-filtering-off",
    "bridge-missing",
    "caddy-admin-exposed",
    "caddy-refused",
    "caddy-unavailable",
    "drill-refused",
    "executor-missing",
    "exit-code",
    "exited",
    "fence-write-failed",
    "firewall-readback-mismatch",
    "foreign-container",
    "foreign-network",
    "foreign-route",
    "foreign-rule",
    "foreign-table",
    "foreign-volume",
    "health-deadline",
    "hostname-invalid",
    "hostname-taken",
    "image-not-found",
    "image-pull-failed",
    "image-registry-unreachable",
    "image-signature-invalid",
    "image-signer-untrusted",
    "image-store-unavailable",
    "image-unsigned",
    "ingress-certs-listen-mismatch",
    "ingress-internal",
    "ingress-readback-mismatch",
    "ingress-write-failed",
    "link-delete-failed",
    "link-set-failed",
    "mesh-apply-failed",
    "mesh-interface-missing",
    "mesh-key-failed",
    "mesh-key-invalid",
    "mesh-readback-mismatch",
    "mesh-spec-invalid",
    "mesh-start-failed",
    "mesh-unavailable",
    "netlink-unavailable",
    "network-subnet-mismatch",
    "nft-unavailable",
    "no-snapshot",
    "no-upstream",
    "node-disk-full",
    "node-identity-unreadable",
    "registry-auth-unreadable",
    "restic-failed",
    "restic-missing",
    "restic-timeout",
    "restore-command-failed",
    "restore-failed",
    "routes-readback-mismatch",
    "run-timeout",
    "secret-key-invalid",
    "secret-unopenable",
    "secrets-dir-failed",
    "secrets-write-failed",
    "stale-generation",
    "state-write-failed",
    "subnet-invalid",
    "task-malformed",
    "tls-certificate-invalid",
    "tls-not-configured",
    "verify-command-failed",
    "verify-restore-failed",
    "volume-exists",
    "volume-missing",
];

/// The code a failure's detail starts with, when it is one of [`FAILURE_CODES`].
pub fn failure_code(detail: &str) -> Option<&'static str> {
    let code = detail.split_once(':').map_or(detail, |(c, _)| c);
    FAILURE_CODES.binary_search(&code).ok().map(|i| FAILURE_CODES[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_sorted_and_read_from_a_detail() {
        assert!(FAILURE_CODES.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
        assert_eq!(
            failure_code("health-deadline: not healthy in 30 s"),
            Some("health-deadline")
        );
        assert_eq!(failure_code("made-up: anything"), None);
        assert_eq!(failure_code(""), None);
    }
}
