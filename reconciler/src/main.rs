//! `pl-reconciler`: the control host's daemon (`run`), its ledger migrations (`migrate`), and
//! the helpers that set it up (`check-config`, `token`, `tls-init`).

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use reconciler::auth::Tokens;
use reconciler::config::{Config, Role};
use reconciler::http::agent::{self, Agents};
use reconciler::http::enrolment::{self, Enrol};
use reconciler::http::logs::{self, LogHub, Readers, Writers};
use reconciler::http::operator::{self, Operator};
use reconciler::http::peer::Peers;
use reconciler::http::server::{operator_tls_config, serve, tls_config, tls_config_with};
use reconciler::http::streams::watch_events;
use reconciler::http::ui::{self, Ui};
use reconciler::http::{agent_images, registry};
use reconciler::hub::Hub;
use reconciler::images::store::Store;
use reconciler::ops::Ops;
use reconciler::ops::group::Group;
use reconciler::reconcile::{Reconciler, run_fetcher, run_loop, watch_local};
use reconciler::store::Ledger;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "pl-reconciler", version, about = "Pushleft's reconciler daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: migrate the ledger, watch or fetch the repository, reconcile, serve the API.
    Run(ConfigArg),
    /// Apply the ledger migrations and exit.
    Migrate(ConfigArg),
    /// Check the configuration file and the files it names, and exit.
    CheckConfig(ConfigArg),
    /// Make an API token: the token goes to a new file (mode 0600), the line for the
    /// configuration to standard output.
    Token {
        #[arg(long)]
        name: String,
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Where to write the token; it must not exist.
        #[arg(long)]
        out: PathBuf,
    },
    /// Make a control CA (10 years, `pathlen:0`) and an API server certificate signed by it
    /// (398 days) as PEM files in `--dir`.
    TlsInit {
        #[arg(long)]
        dir: PathBuf,
        /// Names the API certificate is valid for.
        #[arg(long = "hostname", default_values_t = vec!["localhost".to_owned(), "127.0.0.1".to_owned()])]
        hostnames: Vec<String>,
    },
    /// Replace the API certificate and key in `--dir` with new ones (398 days) from the same
    /// CA; restart the daemon to serve them.
    TlsRenew {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long = "hostname", default_values_t = vec!["localhost".to_owned(), "127.0.0.1".to_owned()])]
        hostnames: Vec<String>,
    },
    /// Disaster recovery: the control plane's state as one encrypted archive (docs/operations.md).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Write the man pages (one per command) to `--out` (the packages are built with it).
    #[command(hide = true)]
    Man {
        #[arg(long)]
        out: PathBuf,
    },
}

/// How long the control CA is valid.
const CA_DAYS: i64 = 3650;
/// How long an API certificate is valid: the CA/Browser Forum's ceiling, so clients that
/// enforce it accept the certificate too.
const API_DAYS: i64 = 398;

#[derive(clap::Args)]
struct ConfigArg {
    /// The configuration file (docs/reconciler.md).
    #[arg(
        long,
        short,
        env = "PL_RECONCILER_CONFIG",
        default_value = "/etc/pushleft/reconciler.toml"
    )]
    config: PathBuf,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RoleArg {
    Viewer,
    Operator,
    Admin,
}

fn main() -> std::process::ExitCode {
    // The daemon holds the API key, the CA key and the age identity: no core dumps, no
    // ptrace by other processes of the same user.
    if let Err(e) = pushleft_secrets::harden_process() {
        eprintln!("pl-reconciler: cannot disable core dumps: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pl-reconciler: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Man { out } => {
            use clap::CommandFactory;
            std::fs::create_dir_all(&out).with_context(|| format!("cannot make {}", out.display()))?;
            clap_mangen::generate_to(Cli::command(), &out)
                .with_context(|| format!("cannot write man pages to {}", out.display()))
        }
        Command::Run(ConfigArg { config }) => daemon(&config),
        Command::Migrate(ConfigArg { config }) => {
            let cfg = Config::load(&config).map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
            runtime()?.block_on(async {
                let ledger = Ledger::connect(&cfg.ledger.url, 2)
                    .await
                    .context("connecting to the ledger")?;
                ledger.migrate().await.context("migrating the ledger")?;
                println!("ledger migrated ({:?})", ledger.backend());
                Ok(())
            })
        }
        Command::CheckConfig(ConfigArg { config }) => {
            let cfg = Config::load(&config).map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
            cfg.check_files().map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
            tls_config(&cfg.api.tls_cert, &cfg.api.tls_key).map_err(anyhow::Error::msg)?;
            println!("{}: ok", config.display());
            Ok(())
        }
        Command::Token { name, role, out } => token(&name, role, &out),
        Command::TlsInit { dir, hostnames } => tls_init(&dir, &hostnames),
        Command::TlsRenew { dir, hostnames } => tls_renew(&dir, &hostnames),
        Command::Snapshot(c) => snapshot_run(c, runtime()?),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// JSON logs with structured fields on stderr; `PL_LOG` filters (`info` by default).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_writer(std::io::stderr)
        .init();
}

/// What re-admitting nodes needs (`control.readmit_nodes`): the applied branch and every
/// control CA a node certificate may come from, read once at start.
fn readmission(config: &Config) -> Result<reconciler::ops::agents::Readmission> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut cas = Vec::new();
    for path in config.control.client_cas() {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        for der in CertificateDer::pem_slice_iter(&pem) {
            let der = der.with_context(|| format!("{}: a certificate that does not parse", path.display()))?;
            cas.push((agent_proto::cert_fingerprint(der.as_ref()), der.as_ref().to_vec()));
        }
    }
    tracing::warn!(
        cas = cas.len(),
        "re-admitting nodes the ledger does not know (control.readmit_nodes)"
    );
    Ok(reconciler::ops::agents::Readmission {
        branch: config.source.branch.clone(),
        cas,
    })
}

/// The agents' API, when configured: the same server certificate, and a client certificate
/// from the control CA required to finish the handshake (during a CA rotation, certificates
/// of the CAs in `control.trusted_cas` too); its group committer beside it.
async fn serve_agents(
    config: &Arc<Config>,
    ledger: &Arc<Ledger>,
    hub: &Arc<Hub>,
    logs: &Arc<LogHub>,
    images: reconciler::delivery::ImageRules,
    image_store: Option<&Arc<Store>>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let (Some(a), Some(_)) = (&config.agent_api, &config.control.ca_cert) else {
        return Ok(None);
    };
    let cas = config.control.client_cas();
    let tls = tls_config_with(&config.api.tls_cert, &config.api.tls_key, &cas).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    tracing::info!(listen = %listener.local_addr().unwrap_or(a.listen), "serving the agent API over mutual TLS");
    let group = Arc::new(Group::default());
    reconciler::ops::group::start(Arc::clone(ledger), Arc::clone(&group), Arc::clone(hub), stopped.clone());
    let readmission = match config.control.readmit_nodes {
        true => Some(readmission(config)?),
        false => None,
    };
    let peers = Arc::new(Peers::new(Arc::clone(ledger), Arc::clone(hub), readmission));
    let writers = Arc::new(Writers {
        peers: Arc::clone(&peers),
        logs: Arc::clone(logs),
    });
    let agents = Arc::new(
        Agents::new(
            Arc::clone(config),
            Arc::clone(ledger),
            Arc::clone(hub),
            group,
            Arc::clone(&peers),
            images,
        )
        .map_err(anyhow::Error::msg)?,
    );
    let routes = (agent::router(agents).merge(logs::agent_router(writers))).merge(agent_images::agent_router(
        image_store,
        peers,
        Arc::clone(ledger),
    ));
    Ok(Some(tokio::spawn(serve(
        listener,
        tls,
        routes,
        a.max_connections,
        stopped.clone(),
    ))))
}

/// What the operator listener serves: the operator API, enrolment, `pl logs`' readers and the
/// web view, each with its own state.
fn operator_listener(
    config: &Arc<Config>,
    ledger: &Arc<Ledger>,
    ops: &Arc<Ops>,
    hub: &Arc<Hub>,
    tokens: &Arc<Tokens>,
    logs: &Arc<LogHub>,
    image_store: Option<&Arc<Store>>,
) -> Result<axum::Router> {
    let operator = Arc::new(
        Operator::new(Arc::clone(config), Arc::clone(ops), Arc::clone(hub), Arc::clone(tokens))
            .map_err(anyhow::Error::msg)?,
    );
    let enrol = Arc::new(Enrol {
        config: Arc::clone(config),
        ledger: Arc::clone(ledger),
    });
    let readers = Arc::new(Readers {
        tokens: Arc::clone(tokens),
        ledger: Arc::clone(ledger),
        logs: Arc::clone(logs),
    });
    let web = Ui::new(
        Arc::clone(ops),
        Arc::clone(hub),
        Arc::clone(tokens),
        config.api.max_streams,
        Some(Arc::clone(&readers)),
    );
    Ok(operator::router(operator)
        .merge(enrolment::router(enrol))
        .merge(logs::reader_router(readers))
        .merge(ui::router(web))
        // The image store's distribution endpoint (`pl image push`), when `[images]` is set.
        .merge(registry::router(image_store, tokens)))
}

/// The id every host object names: pinned by the configuration or made by the ledger; a
/// ledger of another control plane than the configuration names is refused.
async fn control_plane_id(ledger: &Ledger, cfg: &Config) -> Result<String> {
    let pinned = cfg.control.id.as_ref().map(|id| id.as_str());
    let id = ledger
        .control_plane_or(pinned)
        .await
        .context("the control plane's id")?;
    if let Some(want) = pinned
        && want != id
    {
        bail!(
            "the ledger belongs to control plane {id}, the configuration names {want} ([control] id): \
             point [ledger] url at this control plane's ledger, or remove the id [control-plane-id-mismatch]"
        );
    }
    tracing::info!(control_plane = %id, "the control plane's id");
    Ok(id)
}

/// The image store `[images]` configures (another control plane's folder is refused).
fn image_store(cfg: &Config, control_plane: &str) -> Result<Option<Arc<Store>>> {
    (cfg.images.as_ref())
        .map(|i| Store::open(&i.dir, control_plane, i.quota_bytes, i.max_blob_bytes).map(Arc::new))
        .transpose()
        .map_err(|e| anyhow::anyhow!("images.dir: {e} [{}]", e.code()))
}

fn daemon(config: &Path) -> Result<()> {
    init_logs();
    // Absolute, for the scheduled snapshots (they keep the configuration's own path).
    let config_path = std::path::absolute(config).context("the configuration's path")?;
    let cfg = Config::load(config).map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
    cfg.check_files().map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
    let tls = operator_tls_config(&cfg.api.tls_cert, &cfg.api.tls_key).map_err(anyhow::Error::msg)?;
    runtime()?.block_on(async move {
        let ledger = Ledger::connect(&cfg.ledger.url, cfg.ledger.max_connections)
            .await
            .context("connecting to the ledger")?;
        // Every daemon migrates at start; sqlx serialises concurrent runs with a lock.
        ledger.migrate().await.context("migrating the ledger")?;
        let control_plane = control_plane_id(&ledger, &cfg).await?;
        let image_store = image_store(&cfg, &control_plane)?;
        let listen = cfg.api.listen;
        let max_connections = cfg.api.max_connections;
        // The composition root: each layer's state, built from the configuration, sharing the
        // ledger and the hub; no layer builds or imports another's.
        let config = Arc::new(cfg);
        let ledger = Arc::new(ledger);
        let hub = Arc::new(Hub::default());
        let tokens = Arc::new(Tokens::new(&config.api.tokens));
        let logs = Arc::new(LogHub::default());
        let reconciling = Arc::new(Reconciler::new(
            Arc::clone(&config),
            Arc::clone(&ledger),
            Arc::clone(&hub),
        )?);
        // The same trust files the reconcile layer judges commits with: their image rules.
        let images = reconciler::delivery::ImageRules::new(reconciling.policy.clone(), reconciling.signers.clone());
        let ops = Arc::new(Ops::new(&config, &ledger, &hub, image_store.as_ref()));
        let operator_routes = operator_listener(&config, &ledger, &ops, &hub, &tokens, &logs, image_store.as_ref())?;
        let _watcher = watch_local(&reconciling).context("watching the repository")?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        tracing::info!(listen = %listener.local_addr().unwrap_or(listen), "serving the API over TLS");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let api = tokio::spawn(serve(listener, tls, operator_routes, max_connections, stopped.clone()));
        let events = tokio::spawn(watch_events(Arc::clone(&ledger), Arc::clone(&hub), stopped.clone()));
        reconciler::ops::replica_wakes::start(Arc::clone(&ledger), Arc::clone(&hub), stopped.clone());
        // The agents' API: the same server certificate, and a client certificate from the
        // control CA required to finish the handshake.
        // During a CA rotation, certificates of the CAs in `control.trusted_cas` are accepted too.
        let agents = serve_agents(&config, &ledger, &hub, &logs, images, image_store.as_ref(), &stopped).await?;
        // Commit statuses and webhooks, from the events (the leader's alone).
        let notifier = tokio::spawn(reconciler::notify::run(
            Arc::clone(&ledger),
            Arc::clone(&hub),
            reconciler::notify::Targets::of(&config),
            stopped.clone(),
        ));
        // Scheduled snapshots of the control plane's state, by the leader (`[snapshots]`).
        let snapshots = tokio::spawn(reconciler::snapshot::run_schedule(
            config_path,
            Arc::clone(&config),
            Arc::clone(&ledger),
            Arc::clone(&hub),
            stopped.clone(),
        ));
        // The image update watcher, by the leader (`[image_updates]`; off when absent).
        let updates = tokio::spawn(reconciler::reconcile::image_updates::run(
            Arc::clone(&reconciling),
            stopped.clone(),
        ));
        let fetcher = tokio::spawn(run_fetcher(Arc::clone(&reconciling), stopped.clone()));
        let looper = ledger.spawn_writer("pl-reconcile", run_loop(Arc::clone(&reconciling), stopped));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("stopping");
        let _ = stop.send(true);
        let _ = looper.await;
        let _ = fetcher.await;
        let _ = events.await;
        let _ = notifier.await;
        let _ = snapshots.await;
        let _ = updates.await;
        api.abort();
        if let Some(a) = agents {
            a.abort();
        }
        ledger.close().await;
        Ok(())
    })
}

fn token(name: &str, role: RoleArg, out: &Path) -> Result<()> {
    let role = match role {
        RoleArg::Viewer => Role::Viewer,
        RoleArg::Operator => Role::Operator,
        RoleArg::Admin => Role::Admin,
    };
    let (token, hash) = reconciler::auth::new_token().map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    write_private(out, format!("{}\n", token.as_str()).as_bytes())?;
    let role = serde_json::to_value(role)?;
    let role = role.as_str().unwrap_or("viewer");
    println!("[[api.tokens]]\nname = {name:?}\nrole = {role:?}\nsha256 = \"{hash}\"");
    Ok(())
}

/// Creates a file only its owner can read; refuses to overwrite one.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    pushleft_secrets::write_private(path, bytes).with_context(|| format!("creating {}", path.display()))
}

/// A validity window starting an hour ago (clocks differ) and lasting `days`.
fn validity(params: &mut rcgen::CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now - time::Duration::hours(1) + time::Duration::days(days);
}

/// A new API key and certificate for `hostnames`, signed by `issuer`.
fn api_certificate(
    hostnames: &[String],
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
) -> Result<(rcgen::KeyPair, rcgen::Certificate)> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
    let key = KeyPair::generate()?;
    let mut api = CertificateParams::new(hostnames.to_vec())?;
    api.distinguished_name.push(DnType::CommonName, "pl-reconciler");
    api.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    api.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut api, API_DAYS);
    let cert = api.signed_by(&key, issuer)?;
    Ok((key, cert))
}

fn tls_init(dir: &Path, hostnames: &[String]) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    std::fs::create_dir_all(dir)?;
    for f in ["ca.crt", "ca.key", "api.crt", "api.key"] {
        if dir.join(f).exists() {
            bail!("{} exists; tls-init never overwrites keys", dir.join(f).display());
        }
    }
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    // A name of its own per CA (from its key): during a rotation both CAs are trusted at once,
    // and a verifier picks the issuer by name.
    let tag: String = {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(ca_key.public_key_raw())[..4])
    };
    ca.distinguished_name
        .push(DnType::CommonName, format!("Pushleft control CA {tag}"));
    // The CA signs leaf certificates only (the API's, and nodes' from the fleet on): a
    // certificate it signs can never act as a CA itself.
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca, CA_DAYS);
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let (api_key, api_cert) = api_certificate(hostnames, &issuer)?;
    write_private(&dir.join("ca.key"), issuer.key().serialize_pem().as_bytes())?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    write_private(&dir.join("api.key"), api_key.serialize_pem().as_bytes())?;
    std::fs::write(dir.join("api.crt"), api_cert.pem())?;
    println!("wrote ca.crt, ca.key, api.crt, api.key to {}", dir.display());
    let fingerprint = reconciler::pki::fingerprint_of_pem(&ca_cert.pem()).unwrap_or_default();
    println!("CA fingerprint SHA256:{fingerprint} (give it to `pl-agent enroll --ca-fingerprint`)");
    Ok(())
}

/// Replaces `api.crt` and `api.key` in `dir` with new ones from the CA there. The new files
/// are written beside the old and renamed over them, so a crash leaves one pair or the other.
fn tls_renew(dir: &Path, hostnames: &[String]) -> Result<()> {
    let ca_key_path = dir.join("ca.key");
    pushleft_secrets::check_private_file(&ca_key_path).map_err(anyhow::Error::msg)?;
    let ca_key_pem = zeroize::Zeroizing::new(
        std::fs::read_to_string(&ca_key_path).with_context(|| format!("reading {}", ca_key_path.display()))?,
    );
    let ca_key = rcgen::KeyPair::from_pem(&ca_key_pem).context("the CA key does not parse")?;
    let ca_pem = std::fs::read_to_string(dir.join("ca.crt")).context("reading ca.crt")?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).context("ca.crt does not parse")?;
    let (api_key, api_cert) = api_certificate(hostnames, &issuer)?;
    let (key_new, crt_new) = (dir.join("api.key.new"), dir.join("api.crt.new"));
    let _ = std::fs::remove_file(&key_new);
    write_private(&key_new, api_key.serialize_pem().as_bytes())?;
    std::fs::write(&crt_new, api_cert.pem())?;
    std::fs::rename(&key_new, dir.join("api.key"))?;
    std::fs::rename(&crt_new, dir.join("api.crt"))?;
    println!(
        "renewed api.crt and api.key in {} (valid {API_DAYS} days); restart pl-reconciler to serve them",
        dir.display()
    );
    Ok(())
}

#[derive(clap::Subcommand)]
enum SnapshotCommand {
    /// Save the ledger (a consistent copy while the daemon serves; SQLite), the configuration
    /// and every file it names (CA, keys, identities, trust, secrets) to one archive,
    /// encrypted with age to the recipients named.
    Save {
        /// The daemon's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// The archive to write; it must not exist.
        #[arg(long)]
        to: PathBuf,
        /// An age (`age1…`) or SSH public key to encrypt to; repeat for several.
        #[arg(long = "recipient", required = true)]
        recipients: Vec<String>,
    },
    /// Restore an archive: every file back where it was saved from, once all were read and
    /// matched the manifest; refused if any of them exists (a live ledger, a key in use).
    Restore {
        /// The archive `snapshot save` wrote.
        #[arg(long)]
        from: PathBuf,
        /// A file of age identities (or an OpenSSH private key) one of its recipients holds.
        #[arg(long)]
        identity: PathBuf,
    },
}

/// `pl-reconciler snapshot save | restore` (`reconciler::snapshot`).
fn snapshot_run(c: SnapshotCommand, rt: tokio::runtime::Runtime) -> Result<()> {
    match c {
        SnapshotCommand::Save { config, to, recipients } => {
            let cfg = Config::load(&config).map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
            let manifest = rt.block_on(async {
                let ledger = Ledger::connect(&cfg.ledger.url, 2)
                    .await
                    .context("connecting to the ledger")?;
                let saved =
                    reconciler::snapshot::save(&config, &cfg, &ledger, &to, &recipients, reconciler::store::now_ms())
                        .await
                        .map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()));
                ledger.close().await;
                saved
            })?;
            println!(
                "snapshot {}: the {} ledger{} and {} files, encrypted to {} recipient(s)",
                to.display(),
                manifest.backend,
                if manifest.ledger.is_some() {
                    ""
                } else {
                    " (not in it: pair it with pg_dump, docs/operations.md)"
                },
                manifest.files.len(),
                recipients.len()
            );
            Ok(())
        }
        SnapshotCommand::Restore { from, identity } => {
            let manifest =
                reconciler::snapshot::restore(&from, &identity).map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
            for e in manifest.ledger.iter().chain(&manifest.files) {
                println!("restored {}", e.path.display());
            }
            Ok(())
        }
    }
}
