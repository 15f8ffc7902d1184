//! The operator API's OpenAPI 3.1 document, built from `operator_proto`'s types (their schemas
//! are derived by utoipa) and this one table of routes: what the operator listener serves,
//! who may call it, what it reads and what it answers. Served at `GET /v1/openapi.json`
//! (anyone: it says nothing of the fleet) and kept in `docs/openapi.json` by
//! `scripts/openapi.sh`.
//!
//! Architecture invariant: every route the operator listener mounts is in the document and
//! every path in it is mounted (`tests/openapi.rs` reads the routers' source and asks the
//! running daemon for each path).

mod builder;

use builder::*;
use operator_proto as wire;
use utoipa::openapi::path::{HttpMethod, PathItemBuilder};
use utoipa::openapi::schema::{ComponentsBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{InfoBuilder, OpenApi, PathsBuilder};

/// The document, from the types: the same every time for the same build.
pub fn document() -> OpenApi {
    use Access::{Anyone, Forge, Token};
    use HttpMethod::{Get, Post};
    use wire::*;
    let mut d = Doc {
        routes: Vec::new(),
        components: ComponentsBuilder::new(),
    };
    let page = |about: &'static str| Query("limit", Type::Integer, false, about);
    let empty = || Body::Empty;
    let (viewer, operator, admin) = (Token("viewer"), Token("operator"), Token("admin"));

    d.route(
        Get,
        "/healthz",
        Anyone,
        "The process answers.",
        &[],
        empty(),
        (200, Body::Text("ok")),
    );
    let ready = d.json::<status::Ready>();
    d.route(
        Get,
        "/readyz",
        Anyone,
        "The ledger answers and the loop ticked within 30 s (else 503, same body).",
        &[],
        empty(),
        (200, ready),
    );
    d.route(
        Get,
        "/metrics",
        Anyone,
        "Prometheus metrics of the last pass.",
        &[],
        empty(),
        (200, Body::Text("Prometheus text format 0.0.4")),
    );
    d.route(
        Get,
        "/v1/openapi.json",
        Anyone,
        "This document.",
        &[],
        empty(),
        (200, Body::Opaque("an OpenAPI 3.1 document")),
    );
    let b = d.json::<status::Status>();
    d.route(
        Get,
        "/v1/status",
        viewer,
        "Where the daemon and its branch stand, read live.",
        &[],
        empty(),
        (200, b),
    );
    let b = d.json::<revisions::RevisionsPage>();
    d.route(
        Get,
        "/v1/revisions",
        viewer,
        "Judged commits, newest first.",
        &[
            Query("branch", Type::String, false, "one branch"),
            Query(
                "before",
                Type::Integer,
                false,
                "the cursor of the page (a page's `next`)",
            ),
            page("rows, 1 to 1,000 (50)"),
        ],
        empty(),
        (200, b),
    );
    let b = d.json::<DeploymentsPage>();
    d.route(
        Get,
        "/v1/deployments",
        viewer,
        "Each environment's deployment, by name.",
        &[
            Query("after", Type::String, false, "the cursor of the page (a page's `next`)"),
            page("rows, 1 to 1,000 (100)"),
        ],
        empty(),
        (200, b),
    );
    let b = d.json::<Deployment>();
    d.route(
        Get,
        "/v1/environments/{name}",
        viewer,
        "One environment's deployment; with `waitMs` and `If-None-Match`, answers when it changes (or 304).",
        &[Query(
            "waitMs",
            Type::Integer,
            false,
            "wait up to this long (at most 30,000) for a change from the ETag sent",
        )],
        empty(),
        (200, b),
    );
    let b = d.json::<operator_proto::provenance::Provenance>();
    d.route(
        Get,
        "/v1/environments/{name}/provenance",
        viewer,
        "Each running replica of the environment: its image, who signed it as the node verified, and the signed commit that put it there.",
        &[],
        empty(),
        (200, b),
    );
    let b = d.json::<jobs::JobsPage>();
    d.route(
        Get,
        "/v1/jobs",
        viewer,
        "Jobs, newest first.",
        &[
            Query("state", Type::String, false, "one state"),
            Query("environment", Type::String, false, "one environment"),
            Query(
                "before",
                Type::Integer,
                false,
                "the cursor of the page (a page's `next`)",
            ),
            page("rows, 1 to 1,000 (100)"),
        ],
        empty(),
        (200, b),
    );
    let b = d.json::<events::EventsPage>();
    d.route(
        Get,
        "/v1/events",
        viewer,
        "Events after a cursor, oldest first; with `waitMs`, an empty page waits for the next event.",
        &[
            Query("after", Type::Integer, false, "the cursor (0)"),
            page("rows, 1 to 1,000 (100)"),
            Query(
                "waitMs",
                Type::Integer,
                false,
                "wait up to this long (at most 30,000) for an event after the cursor",
            ),
        ],
        empty(),
        (200, b),
    );
    d.route(
        Get,
        "/v1/events/stream",
        viewer,
        "Server-Sent Events after a cursor (or `Last-Event-ID`): each `data:` is an `Event`.",
        &[Query("after", Type::Integer, false, "the cursor (0)")],
        empty(),
        (
            200,
            Body::Text("text/event-stream: `id:` the cursor, `event:` the kind, `data:` an Event"),
        ),
    );
    let b = d.json::<status::ReconcileAsked>();
    d.route(Post, "/v1/reconcile", operator, "A pass now.", &[], empty(), (202, b));
    let b = d.json::<revisions::Rewrites>();
    d.route(
        Get,
        "/v1/rewrites",
        viewer,
        "Heads refused as history rewrites, newest first.",
        &[page("rows (50)")],
        empty(),
        (200, b),
    );
    let (req, b) = (d.json::<revisions::ApproveRewrite>(), d.json::<revisions::Approved>());
    d.route(
        Post,
        "/v1/rewrites/approve",
        admin,
        "Approves one refused head.",
        &[],
        req,
        (200, b),
    );
    let b = d.json::<ui::SignInLink>();
    d.route(
        Post,
        "/v1/ui/sign-in-link",
        viewer,
        "A one-time link (10 minutes) that signs a browser in to the web view as the caller's token.",
        &[],
        empty(),
        (200, b),
    );
    let b = d.json::<ui::SignedOut>();
    d.route(
        Post,
        "/v1/ui/sign-out-everywhere",
        viewer,
        "Ends every web view session of the caller's token.",
        &[],
        empty(),
        (200, b),
    );
    let b = d.json::<nodes::Nodes>();
    d.route(Get, "/v1/nodes", viewer, "Every declared node.", &[], empty(), (200, b));
    let b = d.json::<nodes::NodeToken>();
    d.route(
        Post,
        "/v1/nodes/{node}/token",
        operator,
        "A one-time enrolment token for a declared node.",
        &[],
        empty(),
        (200, b),
    );
    let b = d.json::<nodes::MeshKeyAsked>();
    d.route(
        Post,
        "/v1/nodes/{node}/mesh-key",
        operator,
        "A new mesh key pair for a node.",
        &[],
        empty(),
        (200, b),
    );
    d.route(
        Post,
        "/v1/enroll",
        Anyone,
        "An agent's enrolment (the agent's wire: `agent_proto::EnrollRequest`).",
        &[],
        Body::Opaque("agent_proto::EnrollRequest"),
        (200, Body::Opaque("agent_proto::EnrollResponse")),
    );
    d.route(
        Get,
        "/v1/ca",
        Anyone,
        "The control plane's CA certificate.",
        &[],
        empty(),
        (200, Body::Text("PEM")),
    );
    let b = d.json::<domains::Certificates>();
    d.route(
        Get,
        "/v1/certificates",
        viewer,
        "Certificates the control plane issued.",
        &[],
        empty(),
        (200, b),
    );
    let b = d.json::<domains::Domains>();
    d.route(Get, "/v1/domains", viewer, "Custom domains.", &[], empty(), (200, b));
    let b = d.json::<volumes::Volumes>();
    d.route(
        Get,
        "/v1/volumes",
        viewer,
        "Volumes where they live.",
        &[],
        empty(),
        (200, b),
    );
    let (req, b) = (d.json::<volumes::RemoveVolume>(), d.json::<volumes::VolumeRemoved>());
    d.route(
        Post,
        "/v1/volumes/remove",
        admin,
        "Removes a retained volume (or a kept generation) on its node.",
        &[],
        req,
        (200, b),
    );
    let (req, b) = (d.json::<volumes::MoveVolume>(), d.json::<volumes::VolumeMoving>());
    d.route(
        Post,
        "/v1/volumes/move",
        admin,
        "Moves a volume and its role to another node.",
        &[],
        req,
        (202, b),
    );
    let b = d.json::<backups::Backups>();
    d.route(
        Get,
        "/v1/backups",
        viewer,
        "An environment's backups, newest first.",
        &[
            Query("environment", Type::String, true, "the environment"),
            Query("volume", Type::String, false, "one volume"),
            page("rows, 1 to 1,000 (50)"),
        ],
        empty(),
        (200, b),
    );
    let (req, b) = (
        d.json::<operator_proto::images::CollectImages>(),
        d.json::<operator_proto::images::ImagesCollected>(),
    );
    d.route(
        Post,
        "/v1/images/gc",
        admin,
        "The image store's blobs nothing references and older than the grace: listed, and removed when `delete` is true.",
        &[],
        req,
        (200, b),
    );
    let (req, b) = (d.json::<backups::RunBackup>(), d.json::<backups::JobAsked>());
    d.route(
        Post,
        "/v1/backups/run",
        operator,
        "A backup (or a restore drill) now.",
        &[],
        req,
        (202, b),
    );
    let (req, b) = (d.json::<backups::Restore>(), d.json::<backups::Restoring>());
    d.route(
        Post,
        "/v1/restores",
        admin,
        "Restores a snapshot as the volume's next generation.",
        &[],
        req,
        (202, b),
    );
    let (req, b) = (
        d.json::<rollbacks::RollbackAsk>(),
        d.json::<rollbacks::RollbackAnswer>(),
    );
    d.route(
        Post,
        "/v1/rollbacks",
        operator,
        "A rollback to the previous release, or a hold released.",
        &[],
        req,
        (202, b),
    );
    let (req, b) = (d.json::<rollbacks::RolloutAsk>(), d.json::<rollbacks::RolloutAnswer>());
    d.route(
        Post,
        "/v1/rollouts",
        operator,
        "A canary promoted, or a rollout aborted.",
        &[],
        req,
        (202, b),
    );
    let b = d.json::<events::Outbox>();
    d.route(
        Get,
        "/v1/outbox",
        viewer,
        "Outgoing notifications, newest first.",
        &[
            Query("state", Type::String, false, "pending, delivered or dead"),
            Query("limit", Type::Integer, false, "rows (100)"),
        ],
        empty(),
        (200, b),
    );
    d.route(
        Get,
        "/v1/fleet",
        viewer,
        "The live fleet as re-placement sees it (`pl plan --fleet`).",
        &[],
        empty(),
        (
            200,
            Body::Opaque(
                "state_schema::replacement::Snapshot: opaque to the wire types, read by the pure re-placement decision",
            ),
        ),
    );
    let b = d.json::<status::WebhookAccepted>();
    d.route(
        Post,
        "/v1/webhooks/{forge}",
        Forge,
        "A forge's push: fetch now (github, gitea or gitlab).",
        &[],
        Body::Opaque("the forge's push event (only its signature is read)"),
        (202, b),
    );
    d.route(
        Get,
        "/v1/logs",
        viewer,
        "A role's container logs from every node that runs it, as text lines.",
        &[
            Query("environment", Type::String, true, "the environment"),
            Query("role", Type::String, true, "the role"),
            Query("tail", Type::Integer, false, "lines from the end of each replica's log"),
            Query("follow", Type::Boolean, false, "keep streaming new lines"),
        ],
        empty(),
        (200, Body::Text("lines prefixed by replica and generation")),
    );

    let mut paths: Vec<(String, PathItemBuilder)> = Vec::new();
    for (path, method, op) in d.routes {
        match paths.iter_mut().find(|(p, _)| *p == path) {
            Some((_, item)) => *item = std::mem::take(item).operation(method, op),
            None => paths.push((path, PathItemBuilder::new().operation(method, op))),
        }
    }
    let mut built = PathsBuilder::new();
    for (path, item) in paths {
        built = built.path(path, item.build());
    }
    let components = d
        .components
        .security_scheme(
            "token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        )
        .build();
    OpenApi::builder()
        .info(
            InfoBuilder::new()
                .title("Pushleft operator API")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "The API `pl` speaks to `pl-reconciler`, over TLS with a bearer token. Every type is `operator_proto`'s; every refusal is an ErrorBody with a stable code.",
                )),
        )
        .paths(built)
        .components(Some(components))
        .build()
}

/// The document as JSON text, as served and as kept in `docs/openapi.json` (built once).
pub fn json() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| document().to_pretty_json().unwrap_or_default() + "\n")
}

#[cfg(test)]
mod tests {
    /// `docs/openapi.json` is this build's document: `PL_UPDATE_GOLDEN=1 cargo test -p
    /// reconciler --lib openapi` writes it again, for review.
    #[test]
    fn the_kept_document_is_this_builds() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        if std::env::var_os("PL_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, super::json()).expect("write docs/openapi.json");
        }
        let kept = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            kept == super::json(),
            "docs/openapi.json differs from the types: run `PL_UPDATE_GOLDEN=1 cargo test -p reconciler --lib openapi` and review the diff"
        );
    }

    #[test]
    fn operation_ids_are_unique_and_every_schema_named_is_a_component() {
        let doc: serde_json::Value = serde_json::from_str(super::json()).expect("json");
        let mut ids = std::collections::BTreeSet::new();
        for (_, item) in doc["paths"].as_object().expect("paths") {
            for (_, op) in item.as_object().expect("item") {
                assert!(ids.insert(op["operationId"].as_str().expect("id").to_owned()));
            }
        }
        let text = super::json();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for r in text.split("\"$ref\": \"#/components/schemas/").skip(1) {
            let name = r.split('"').next().expect("name");
            assert!(schemas.contains_key(name), "{name} is referenced and not a component");
        }
        assert!(ids.len() >= 30, "{} operations", ids.len());
    }
}
