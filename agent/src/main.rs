//! `pl-agent`: the node agent. `enroll` joins the fleet; `run` leases this node's jobs and
//! executes them (JSON logs on stderr, `PL_LOG` filters them); `build` serves `pl up --build`.

use pushleft_agent::enroll;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Read as _;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "pl-agent", version, about = "Pushleft's node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the fleet: make this node's TLS key and age identity in DIR and trade the one-time
    /// token (read from standard input) for a client certificate.
    Enroll {
        /// The control plane's API, `https://…`.
        #[arg(long)]
        control: String,
        /// The control CA's fingerprint, `SHA256:<64 hex>`, as `pl-reconciler tls-init` printed it.
        #[arg(long)]
        ca_fingerprint: String,
        /// This node's name, as its NodePool declares it.
        #[arg(long)]
        node: String,
        /// Where the node's key, identity and certificates go (created 0700).
        #[arg(long)]
        dir: PathBuf,
    },
    /// Build DIR's Dockerfile on the engine and push it to a control plane's image store on
    /// loopback (`pl up --build`'s); prints its reference by digest,
    /// `pushleft.invalid/NAME@sha256:…` (the build's output goes to standard error).
    Build {
        /// The Docker engine's socket.
        #[arg(long, default_value = "/var/run/docker.sock")]
        docker_socket: PathBuf,
        /// The folder holding the Dockerfile (the build context).
        #[arg(long)]
        context: PathBuf,
        /// The control plane's operator API on loopback (`https://127.0.0.1:PORT`).
        #[arg(long)]
        store: String,
        /// The CA that signed the API's certificate (PEM).
        #[arg(long)]
        ca_cert: PathBuf,
        /// A file (mode 0600) holding an operator token.
        #[arg(long)]
        token_file: PathBuf,
        /// The repository name in the store (`pl-build/api`).
        #[arg(long)]
        name: String,
    },
    /// Heartbeat, lease this node's jobs and execute them, until stopped.
    Run {
        /// The agent's configuration (TOML; docs/agent.md).
        #[arg(long)]
        config: PathBuf,
    },
    /// Write the man pages (one per command) to `--out` (the packages are built with it).
    #[command(hide = true)]
    Man {
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pl-agent: {e:#}");
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
        Command::Enroll {
            control,
            ca_fingerprint,
            node,
            dir,
        } => {
            let mut token = zeroize::Zeroizing::new(String::new());
            std::io::stdin()
                .take(4096)
                .read_to_string(&mut token)
                .context("reading the enrolment token from standard input")?;
            let answer = enroll::enroll(&control, &ca_fingerprint, &node, &dir, token.trim())?;
            println!(
                "enrolled {node}: certificate in {} until {} ms since the epoch",
                dir.join(enroll::CERT).display(),
                answer.not_after_ms
            );
            Ok(())
        }
        Command::Build {
            docker_socket,
            context,
            store,
            ca_cert,
            token_file,
            name,
        } => {
            let pusher = pushleft_agent::build::store_pusher(&store, &ca_cert, &token_file)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the runtime")?;
            let reference = rt.block_on(pushleft_agent::build::build_and_push(
                &docker_socket,
                &context,
                &name,
                pusher,
                |line| eprintln!("{line}"),
            ))?;
            println!("{reference}");
            Ok(())
        }
        Command::Run { config } => {
            let config = pushleft_agent::run::Config::load(&config)?;
            pushleft_secrets::harden_process().context("disabling core dumps")?;
            tracing_subscriber::fmt()
                .json()
                .with_writer(std::io::stderr)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("PL_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the runtime")?;
            rt.block_on(pushleft_agent::run::run(config))
        }
    }
}
