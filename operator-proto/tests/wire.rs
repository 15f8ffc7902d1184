//! One golden JSON document per endpoint's answer (and request), generated from the wire types:
//! what clients outside this repository read. `PL_UPDATE_GOLDEN=1 cargo test -p operator-proto`
//! writes them again; review the diff (a changed field is a changed API: say it in the docs).

use operator_proto::ErrorBody;
use operator_proto::backups::*;
use operator_proto::deployments::*;
use operator_proto::domains::*;
use operator_proto::events::*;
use operator_proto::jobs::*;
use operator_proto::nodes::*;
use operator_proto::revisions::*;
use operator_proto::rollbacks::*;
use operator_proto::status::*;
use operator_proto::volumes::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;

/// Serialises `value`, checks it against (or writes) `golden/<name>.json`, and reads it back.
fn golden<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: &T) {
    let text = serde_json::to_string_pretty(value).expect("serialises") + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    if std::env::var_os("PL_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &text).expect("write golden");
    }
    let kept = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(kept, text, "{name}: the wire changed; PL_UPDATE_GOLDEN=1 and review");
    let back: T = serde_json::from_str(&text).expect("reads back");
    assert_eq!(&back, value, "{name} does not read back as written");
}

#[test]
fn status() {
    golden(
        "status",
        &Status {
            control_plane: "0a1b2c3d".into(),
            mesh: MeshSummary {
                links: 2,
                down_total: 1,
                down: vec![LinkDown {
                    node: "n1".into(),
                    peer: "n2".into(),
                }],
            },
            leader: true,
            last_pass_ms_ago: 412,
            branch: "main".into(),
            in_force: Some("0123456789abcdef0123456789abcdef01234567".into()),
            last_judged: None,
            counts: Counts {
                jobs: BTreeMap::from([("queued".into(), 1), ("succeeded".into(), 12)]),
                deployments: BTreeMap::from([("done".into(), 3)]),
                revisions: BTreeMap::from([("accepted".into(), 4), ("rejected".into(), 1)]),
                queue_age_ms: 0,
                last_event: 77,
                at_ms: 1_796_180_404_000,
            },
            slos: vec![
                Slo {
                    name: "deployment-success".into(),
                    objective: "95% of deployments that end succeed".into(),
                    target: 0.95,
                    measured: Some(0.9),
                    over: "20 deployments ended".into(),
                    state: SloState::Burning,
                },
                Slo {
                    name: "route-publication".into(),
                    objective: "95% of routes published within 120 s".into(),
                    target: 0.95,
                    measured: None,
                    over: "0 routes published".into(),
                    state: SloState::MissingData,
                },
            ],
        },
    );
    golden(
        "readyz",
        &Ready {
            ledger: true,
            loop_ticked_ms_ago: 120,
            leader: false,
        },
    );
    golden(
        "reconcile",
        &ReconcileAsked {
            leader: true,
            passes_before: 31,
        },
    );
    golden("webhook", &WebhookAccepted { accepted: true });
    golden(
        "error",
        &ErrorBody {
            code: "environment-unknown".into(),
            message: "no deployment of shop".into(),
        },
    );
}

#[test]
fn revisions_and_rewrites() {
    golden(
        "revisions",
        &RevisionsPage {
            revisions: vec![Revision {
                id: 9,
                branch: "main".into(),
                sha: "0123456789abcdef0123456789abcdef01234567".into(),
                verdict: Verdict::Rejected,
                principals: None,
                reasons: vec![Reason {
                    code: "unsigned".into(),
                    message: "0123456789ab: the commit is not signed".into(),
                }],
                seen_at_ms: 1_796_180_404_000,
            }],
            next: Some(9),
        },
    );
    golden(
        "rewrites",
        &Rewrites {
            rewrites: vec![Rewrite {
                branch: "main".into(),
                sha: "1111111111111111111111111111111111111111".into(),
                accepted_sha: "2222222222222222222222222222222222222222".into(),
                seen_at_ms: 5,
                approved_by: Some("admin".into()),
                approved_at_ms: Some(6),
            }],
        },
    );
    golden(
        "approve-rewrite",
        &ApproveRewrite {
            branch: "main".into(),
            sha: "1111111111111111111111111111111111111111".into(),
        },
    );
    golden(
        "approved",
        &Approved {
            approved: true,
            already: false,
        },
    );
    golden(
        "approved-already",
        &Approved {
            approved: true,
            already: true,
        },
    );
}

#[test]
fn deployments() {
    let d = Deployment {
        environment: "shop".into(),
        branch: "main".into(),
        generation: 4,
        action: Action::Rollout,
        status: DeploymentStatus::InProgress,
        step: 2,
        updated_at_ms: 10,
        asked: Some(3),
        replicas: 3,
        running: 2,
        stale: 1,
        previous_generation: 3,
        waiting: vec![Waiting {
            role: "web".into(),
            index: 2,
            reason: "no-capacity".into(),
        }],
        hold: Some(Hold {
            by: "ops".into(),
            at_ms: 9,
            from: 3,
            to: 2,
            generation: 4,
            git_hash: "abc".into(),
            released: false,
        }),
        canary: Some(Canary {
            weight: 10,
            waits_for_promote: false,
            next_at_ms: Some(60_000),
        }),
    };
    golden("environment", &d);
    golden(
        "deployments",
        &DeploymentsPage {
            deployments: vec![Deployment {
                canary: None,
                hold: None,
                ..d
            }],
            next: Some("shop".into()),
        },
    );
}

#[test]
fn jobs_events_outbox() {
    golden(
        "jobs",
        &JobsPage {
            jobs: vec![Job {
                id: 3,
                key: "app:shop:web:0:start@4".into(),
                target_node: "n1".into(),
                state: JobState::Dead,
                attempts: 3,
                max_attempts: 3,
                environment: Some("shop".into()),
                generation: Some(4),
                created_at_ms: 1,
                updated_at_ms: 2,
                reason: Some("health check failed".into()),
            }],
            next: None,
        },
    );
    golden(
        "events",
        &EventsPage {
            events: vec![Event {
                id: 5,
                at_ms: 1,
                kind: "job-dead".into(),
                subject: "app:shop:web:0:start@4".into(),
                detail: "health check failed".into(),
            }],
            next: 5,
        },
    );
    golden(
        "outbox",
        &Outbox {
            outbox: vec![OutboxEntry {
                id: 1,
                target: "github".into(),
                event_id: 5,
                kind: "deployment-status".into(),
                payload: "{\"state\":\"success\"}".into(),
                state: OutboxState::Dead,
                attempts: 8,
                next_at: 0,
                last_error: "503".into(),
                created_at: 1,
                updated_at: 2,
            }],
        },
    );
}

#[test]
fn nodes() {
    golden(
        "nodes",
        &Nodes {
            nodes: vec![
                Node {
                    name: "n1".into(),
                    pool: "web".into(),
                    state: NodeState::Active,
                    cpu_millis: 2000,
                    memory_bytes: 1 << 31,
                    last_seen_ms: Some(1),
                    agent_version: Some("0.1.0".into()),
                    agent_protocol: Some(0),
                    older_agent: true,
                    instances: 2,
                    running: 2,
                    reserved_cpu_millis: 500,
                    reserved_memory_bytes: 1 << 28,
                    capabilities: vec!["docker".into(), "ingress".into()],
                    certificate_ca: Some("ab12".into()),
                    mesh: Some(NodeMesh {
                        generation: 3,
                        applied: 3,
                        links: vec![
                            MeshLink {
                                node: "n2".into(),
                                last_handshake: Some(1_796_180_404),
                            },
                            MeshLink {
                                node: "n3".into(),
                                last_handshake: None,
                            },
                        ],
                        down: vec!["n3".into()],
                    }),
                },
                Node {
                    name: "n4".into(),
                    pool: "web".into(),
                    state: NodeState::NotEnrolled,
                    cpu_millis: 1000,
                    memory_bytes: 1 << 30,
                    last_seen_ms: None,
                    agent_version: None,
                    agent_protocol: None,
                    older_agent: false,
                    instances: 0,
                    running: 0,
                    reserved_cpu_millis: 0,
                    reserved_memory_bytes: 0,
                    capabilities: vec![],
                    certificate_ca: None,
                    mesh: None,
                },
            ],
            next: Some("n4".into()),
        },
    );
    golden(
        "node-token",
        &NodeToken {
            node: "n4".into(),
            token: "ple_…".into(),
            expires_at_ms: 900_000,
        },
    );
    golden(
        "mesh-key",
        &MeshKeyAsked {
            node: "n1".into(),
            key_epoch: 2,
        },
    );
}

#[test]
fn domains_and_certificates() {
    let domain = |hostname: &str, state, certificate| Domain {
        hostname: hostname.into(),
        environment: "shop".into(),
        method: DomainMethod::Cname,
        state,
        record: DnsRecord {
            kind: "CNAME".into(),
            name: hostname.into(),
            value: "shop.cp.example.invalid".into(),
        },
        seen: None,
        reason: Some("no CNAME".into()),
        checked_at_ms: 1,
        next_check_at_ms: 2,
        certificate,
    };
    golden(
        "domains",
        &Domains {
            domains: vec![
                domain("a.example.invalid", DomainState::Pending, None),
                domain(
                    "b.example.invalid",
                    DomainState::Serving,
                    Some(DomainCertificate {
                        source: "acme".into(),
                        issued: Some(IssuedSummary {
                            not_after_ms: 9,
                            failures: 0,
                            last_error: None,
                        }),
                    }),
                ),
                domain(
                    "c.example.invalid",
                    DomainState::Verified,
                    Some(DomainCertificate {
                        source: "brought".into(),
                        issued: None,
                    }),
                ),
            ],
        },
    );
    golden(
        "certificates",
        &Certificates {
            certificates: vec![Certificate {
                hostname: "b.example.invalid".into(),
                issuer: "acme".into(),
                state: CertificateState::RenewalFailing,
                not_before_ms: 1,
                not_after_ms: 9,
                renew_after_ms: 6,
                issued: 2,
                failures: 1,
                retry_at_ms: 7,
                last_error: Some("rate limited".into()),
            }],
        },
    );
}

#[test]
fn volumes_and_backups() {
    golden(
        "volumes",
        &Volumes {
            volumes: vec![Volume {
                environment: "shop".into(),
                volume: "pgdata".into(),
                role: "db".into(),
                node: "n1".into(),
                generation: 2,
                state: VolumeState::Retained,
                size_bytes: Some(1 << 30),
                used_bytes: None,
                measured_at_ms: None,
                created_at_ms: 1,
                released_at_ms: Some(2),
                remove_after_ms: Some(3),
                moving_to: None,
                move_asked_at_ms: Some(1),
                moved_from: Some("n2".into()),
                moved_up_at_ms: Some(2),
                move_failure: None,
                kept: vec![Kept {
                    generation: 1,
                    node: "n2".into(),
                    kept_at_ms: 2,
                }],
            }],
        },
    );
    golden(
        "volume-remove",
        &RemoveVolume {
            environment: "shop".into(),
            volume: "pgdata".into(),
            generation: Some(1),
        },
    );
    golden(
        "volume-removed",
        &VolumeRemoved {
            removed: true,
            node: "n1".into(),
            generation: None,
            detail: Some("removed".into()),
        },
    );
    golden(
        "volume-move",
        &MoveVolume {
            environment: "shop".into(),
            volume: "pgdata".into(),
            to: "n2".into(),
        },
    );
    golden(
        "volume-moving",
        &VolumeMoving {
            job: "volume:shop:pgdata:save@2".into(),
            role: "db".into(),
            from: "n1".into(),
            to: "n2".into(),
            asked_at_ms: 1,
        },
    );
    golden(
        "backups",
        &Backups {
            backups: vec![Backup {
                environment: "shop".into(),
                volume: "pgdata".into(),
                generation: 2,
                node: "n1".into(),
                job: "backup:shop:pgdata@2#1".into(),
                finished_at_ms: 1,
                status: BackupStatus::VerifyFailed,
                snapshot: Some("ab12cd34".into()),
                bytes: Some(1024),
                data_added: None,
                reason: "verify exited 1".into(),
            }],
            proven: vec![Proven {
                volume: "pgdata".into(),
                at_ms: 1,
                snapshot: Some("ab12cd34".into()),
            }],
        },
    );
    golden(
        "backup-run",
        &RunBackup {
            environment: "shop".into(),
            volume: "pgdata".into(),
            verify: true,
        },
    );
    golden(
        "backup-asked",
        &JobAsked {
            job: "backup:shop:pgdata@2#1".into(),
        },
    );
    golden(
        "restore",
        &Restore {
            environment: "shop".into(),
            volume: "pgdata".into(),
            snapshot: None,
        },
    );
    golden(
        "restoring",
        &Restoring {
            job: "volume:shop:pgdata:restore@3".into(),
            generation: 3,
            snapshot: "ab12cd34".into(),
            node: "n1".into(),
        },
    );
}

#[test]
fn rollbacks_and_rollouts() {
    golden(
        "rollback",
        &RollbackAsk {
            environment: "shop".into(),
            release: false,
        },
    );
    golden(
        "rollback-answer",
        &RollbackAnswer::RolledBack(RolledBack {
            environment: "shop".into(),
            from: 4,
            to: 3,
            generation: 5,
        }),
    );
    golden(
        "rollback-released",
        &RollbackAnswer::Released(HoldReleased {
            environment: "shop".into(),
            released: true,
        }),
    );
    golden(
        "rollout",
        &RolloutAsk {
            environment: "shop".into(),
            action: RolloutAction::Promote,
        },
    );
    golden(
        "rollout-promoted",
        &RolloutAnswer::Promoted(Promoted {
            environment: "shop".into(),
            generation: 4,
            step: 3,
        }),
    );
}

/// Every state's spelling reads back as itself, and nothing else reads as one.
#[test]
fn states_are_spelled_one_way() {
    fn each<T: Copy + PartialEq + Debug + Serialize>(
        all: &[T],
        as_str: fn(T) -> &'static str,
        parse: fn(&str) -> Option<T>,
    ) {
        for &v in all {
            assert_eq!(parse(as_str(v)), Some(v));
            assert_eq!(serde_json::to_string(&v).expect("json"), format!("\"{}\"", as_str(v)));
        }
        assert_eq!(parse("Queued"), None);
    }
    each(JobState::ALL, JobState::as_str, JobState::parse);
    each(NodeState::ALL, NodeState::as_str, NodeState::parse);
    each(DomainState::ALL, DomainState::as_str, DomainState::parse);
    each(CertificateState::ALL, CertificateState::as_str, CertificateState::parse);
    each(VolumeState::ALL, VolumeState::as_str, VolumeState::parse);
    each(BackupStatus::ALL, BackupStatus::as_str, BackupStatus::parse);
    each(OutboxState::ALL, OutboxState::as_str, OutboxState::parse);
    each(Verdict::ALL, Verdict::as_str, Verdict::parse);
}

#[test]
fn image_collection() {
    golden("images-gc-ask", &operator_proto::images::CollectImages { delete: true });
    golden(
        "images-gc",
        &operator_proto::images::ImagesCollected {
            deleted: false,
            blobs: vec![operator_proto::images::UnreferencedBlob {
                digest: format!("sha256:{}", "b".repeat(64)),
                bytes: 20_971_520,
                age_seconds: 90_000,
            }],
            bytes: 20_971_520,
            young: 1,
            held_bytes: 230_686_720,
            quota_bytes: 21_474_836_480,
        },
    );
}
