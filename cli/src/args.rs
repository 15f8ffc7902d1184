//! `pl`'s command line: every command, its arguments and its help, as clap reads them.
//! `main.rs` dispatches; each command's work lives in its own module.

pub(crate) use crate::image_args::ImageCommand;
use crate::{client, up, wait};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "pl",
    version,
    about = "Pushleft: GitOps for Docker hosts",
    propagate_version = true,
    after_help = "Examples:
  pl init infra && cd infra && git init -q && git add -A && git commit -qm init
  pl validate                                  every problem, file:line:column
  pl plan --base origin/main --format markdown  what a pull request changes
  pl up                                        run it on this machine
  pl status                                    what the local control plane says
  pl down                                      tear it down

Reference: docs/cli.md"
)]
pub struct Cli {
    /// When to colour output; `NO_COLOR` set to anything turns `auto` off.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto, help_heading = "Global options")]
    pub(crate) color: ColorChoice,
    /// Same as `--color never`.
    #[arg(long, global = true, help_heading = "Global options")]
    pub(crate) no_color: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum ColorChoice {
    Auto,
    Always,
    Never,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiagFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    Text,
    Markdown,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ShowFormat {
    Yaml,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The state tree (default: the current directory).
    pub dir: Option<PathBuf>,
    /// The revision to compare against (`main`, `origin/main`, `HEAD~1`, a sha). When head
    /// has diverged from it, the plan starts from their merge base.
    #[arg(long)]
    pub base: String,
    /// The revision to plan; default: the working tree, uncommitted files included.
    #[arg(long)]
    pub head: Option<String>,
    #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
    pub format: PlanFormat,
    /// Exit 0 when there are no changes, 2 when there are, 1 on error.
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// With `--format markdown`: write each part to DIR/plan-N.md instead of stdout.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Trusted keys (git's allowed-signers format): the plan's header then gives the head
    /// commit's signature verdict.
    #[arg(long, value_name = "FILE")]
    pub allowed_signers: Option<PathBuf>,
    /// The signing policy whose path rules the head's signer must satisfy for the planned change.
    #[arg(long, value_name = "FILE", requires = "allowed_signers")]
    pub policy: Option<PathBuf>,
    #[command(flatten)]
    pub fleet: FleetArgs,
}

/// `pl plan --fleet`: the control plane whose live fleet the plan re-places on.
#[derive(clap::Args, Debug, Clone)]
pub struct FleetArgs {
    /// Also show what re-placement would move on a control plane's live fleet (replicas of a
    /// lost, draining or retired node; waiting replicas that now fit), decided by the daemon's
    /// own function over what its agents reported and the head's node pools. Reads `GET
    /// /v1/fleet` (viewer role) of `--server`, `--local`, or the running local control plane
    /// of the repository around the current folder.
    #[arg(long)]
    pub fleet: bool,
    /// With `--fleet`: the reconciler's API (or `PL_SERVER`).
    #[arg(long, value_name = "URL", requires = "fleet")]
    pub server: Option<String>,
    /// With `--fleet`: the CA that signed the API's certificate (or `PL_CA_CERT`).
    #[arg(long, value_name = "FILE", requires = "fleet")]
    pub ca_cert: Option<PathBuf>,
    /// With `--fleet`: a file holding the API token (or `PL_TOKEN`, `PL_TOKEN_FILE`).
    #[arg(long, value_name = "FILE", requires = "fleet")]
    pub token_file: Option<PathBuf>,
    /// With `--fleet`: the local control plane `pl up` started for DIR.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = ".", requires = "fleet")]
    pub local: Option<PathBuf>,
}

impl FleetArgs {
    /// The operator API's arguments, from these and the environment as every operator
    /// command reads it.
    pub(crate) fn server_args(&self) -> client::ServerArgs {
        let env_path = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        client::ServerArgs {
            server: self
                .server
                .clone()
                .or_else(|| std::env::var("PL_SERVER").ok().filter(|v| !v.is_empty())),
            ca_cert: self.ca_cert.clone().or_else(|| env_path("PL_CA_CERT")),
            token_file: self.token_file.clone().or_else(|| env_path("PL_TOKEN_FILE")),
            format: client::OutFormat::Text,
            local: self.local.clone(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum SecretCommand {
    /// Encrypt the value read from stdin (byte for byte; use `printf %s`) into KEY of Secret NAME.
    Set {
        name: String,
        key: String,
        #[arg(long, short = 'C')]
        dir: Option<PathBuf>,
    },
    /// Decrypt one value (raw bytes) or all of them (`KEY=value` lines) to stdout.
    Show {
        name: String,
        key: Option<String>,
        #[arg(long, short = 'C')]
        dir: Option<PathBuf>,
        /// An age identity file or unencrypted OpenSSH private key (default: $PL_AGE_IDENTITY).
        #[arg(long, value_name = "FILE")]
        identity: Option<PathBuf>,
    },
    /// Edit the decrypted values in $EDITOR; they are re-encrypted on save.
    Edit {
        name: String,
        #[arg(long, short = 'C')]
        dir: Option<PathBuf>,
        #[arg(long, value_name = "FILE")]
        identity: Option<PathBuf>,
    },
    /// Add or remove recipients; every value is re-encrypted to the new set.
    Recipients {
        name: String,
        #[arg(long, value_name = "RECIPIENT")]
        add: Vec<String>,
        #[arg(long, value_name = "RECIPIENT")]
        remove: Vec<String>,
        #[arg(long, short = 'C')]
        dir: Option<PathBuf>,
        #[arg(long, value_name = "FILE")]
        identity: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Check a state tree and report every problem. Exit 0 valid, 1 otherwise.
    Validate {
        /// The state tree (default: the current directory).
        dir: Option<PathBuf>,
        /// Validate a revision instead of the working tree.
        #[arg(long)]
        rev: Option<String>,
        #[arg(long, value_enum, default_value_t = DiagFormat::Text)]
        format: DiagFormat,
        /// Trusted keys (git's allowed-signers format): with `--policy`, every environment's
        /// image is checked against its project's `images` rules as nodes would check it.
        #[arg(long, value_name = "FILE", requires = "policy")]
        allowed_signers: Option<PathBuf>,
        /// The signing policy whose `images` rules say who may sign which projects' images.
        #[arg(long, value_name = "FILE", requires = "allowed_signers")]
        policy: Option<PathBuf>,
    },
    /// Show what would change between two revisions.
    Plan(PlanArgs),
    /// Print the canonical, fully derived state.
    Show {
        dir: Option<PathBuf>,
        #[arg(long)]
        rev: Option<String>,
        #[arg(long, value_enum, default_value_t = ShowFormat::Yaml)]
        format: ShowFormat,
    },
    /// Verify the SSH signatures of commits against an allowed-signers file (and a signing
    /// policy). Exit 0 only when every commit passes.
    Verify {
        /// A commit (`HEAD`, a sha) or a range `A..B` (B's first-parent commits since A).
        #[arg(default_value = "HEAD")]
        range: String,
        /// The state tree (default: the current directory).
        #[arg(long, short = 'C')]
        dir: Option<PathBuf>,
        /// Trusted keys, in git's allowed-signers format; kept outside the state repository.
        #[arg(long, value_name = "FILE")]
        allowed_signers: PathBuf,
        /// The signing policy: `mode: head|strict` and path rules.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Also require each key to be valid at this time (`now`, or `YYYYMMDD[HHMM[SS]][Z]`),
        /// as the reconciler does with the time it first sees a commit. Without it, keys are
        /// checked at the committer date alone, as `git verify-commit` does.
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        #[arg(long, value_enum, default_value_t = DiagFormat::Text)]
        format: DiagFormat,
    },
    /// Set, show, edit and re-key the encrypted values of Secret documents.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Sign images: an SSH signature over an image's manifest digest, kept in the state tree
    /// (`image-signatures/`), which nodes check before they pull or run it.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Print the JSON Schema of every kind (for yaml-language-server and CI).
    Schema,
    /// Create a new state repository with a working example.
    Init { dir: Option<PathBuf> },
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (one per command) to `--out` (the packages are built with it).
    #[command(hide = true)]
    Man {
        #[arg(long)]
        out: PathBuf,
    },
    /// Apply the state repository on this machine: starts (or reuses) a local control plane
    /// (reconciler, SQLite ledger, one enrolled agent, Caddy for web roles), applies the
    /// working tree as a local revision, follows the rollout and prints each URL.
    #[command(after_help = "Examples:
  pl up                                  the working tree of the current folder
  pl up --build hello=./app              run ./app's Dockerfile as project hello's image
  pl up --watch                          apply again as files change
  pl up --port 8080                      serve on 127.0.0.1:8080 (after `pl down`, to change it)
  pl up --allowed-signers ~/.config/pushleft/allowed_signers
                                         apply signed commits only, judged as the daemon does
  pl up --node n1 --node n2              two nodes on this machine, to rehearse a drain

Reference: docs/cli.md (pl up)")]
    Up(up::UpArgs),
    /// Tear the local environments down in order, keep the history, and stop the local control
    /// plane.
    Down(up::DownArgs),
    /// Show the reconciler's state: leader, revision in force, counts of deployments and jobs.
    Status {
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Print the web view's address and a one-time link that signs a browser in as this
    /// token (for `pl up`'s control plane: `pl ui --local`).
    Ui {
        /// End every web view session of this token instead.
        #[arg(long)]
        sign_out_everywhere: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Print the reconciler's events after a cursor; `--follow` streams new ones.
    Events {
        #[arg(long, default_value_t = 0)]
        after: i64,
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Print an environment role's container logs, from every node that runs it.
    Logs {
        environment: String,
        role: String,
        /// Lines from the end of each container's log (at most 10000).
        #[arg(long, default_value_t = 100)]
        tail: u32,
        /// Keep printing new lines until interrupted.
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Wait until a revision is live everywhere it applies, as the agents report it (for CI):
    /// exit 0 live, 1 rejected or failed (with the reason or the failing job), 2 on timeout.
    #[command(after_help = "Example (CI, after pushing a signed commit):
  pl wait --rev \"$GITHUB_SHA\" --timeout 10m --server https://control.example.invalid:7443

Reference: docs/cli.md (pl wait)")]
    Wait(wait::WaitArgs),
    /// List jobs, newest first: each one's environment, task, state, attempts, and why a
    /// failed one failed.
    Jobs {
        /// Only jobs in this state (queued, leased, succeeded, failed, cancelled).
        #[arg(long)]
        state: Option<String>,
        /// Only this environment's jobs.
        #[arg(long)]
        environment: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// List judged commits, newest first, with their verdicts and reasons, and heads refused
    /// as history rewrites.
    Revisions {
        #[command(subcommand)]
        action: Option<RevisionsAction>,
        #[arg(long)]
        branch: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Nodes of the fleet.
    #[command(subcommand)]
    Node(NodeCommand),
    /// List the nodes Git declares: pool, state (active, unhealthy, lost, draining, retired,
    /// not-enrolled), capacity, last heartbeat, agent version, replicas placed (viewer).
    Nodes {
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// For each replica of ENVIRONMENT its agent reports running: the image it runs, who signed
    /// that image as the node verified before the pull, and the commit that put it there with
    /// that commit's signer (viewer). Every link is what the ledger recorded.
    Provenance {
        environment: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// List custom domains (Domain documents): state (pending, verified, serving, failing), the
    /// DNS record each needs, what the last check saw or missed, certificate expiry (viewer).
    Domains {
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// List volumes: environment, node (where the data is: its role runs only there),
    /// generation, state (in-use, retained after a teardown), used against declared size,
    /// and when a retained one is removed (viewer).
    Volumes {
        /// Only this environment's.
        environment: Option<String>,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Volumes of the fleet.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// List an environment's backups, newest first: when each ended, its volume and node,
    /// status, restic snapshot and size, and why a failed one failed (viewer).
    Backups {
        environment: String,
        /// Only this volume's.
        volume: Option<String>,
        /// At most this many (1-1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Restore a volume from a backup (admin role): the snapshot (by default the newest
    /// succeeded backup's) goes into a new generation of the volume on its node, and its role
    /// is rolled out on it; the old generation is kept. Returns once the role runs on the
    /// restored data (0), or 1 with why not.
    Restore {
        environment: String,
        volume: String,
        /// restic's snapshot id (as `pl backups` lists it).
        #[arg(long)]
        snapshot: Option<String>,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Back up a volume now, as its `backup` says (operator role). Returns once its node
    /// reported the backup's end: 0 when it succeeded, 1 when it failed or is still going
    /// after `--timeout`.
    Backup {
        environment: String,
        volume: String,
        /// A restore drill of the newest snapshot (the backup's `verify.command` on a scratch
        /// copy) instead of a backup.
        #[arg(long)]
        verify: bool,
        /// How long to wait for the node's report, in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Bring an environment's previous release back (operator role): the next generation runs
    /// it again (no pull: its image is kept on the nodes), and the control plane holds the
    /// environment there, differing from Git, until an accepted commit changes it or
    /// `--release`. Returns once the agents report every replica of it running: 0 done, 1
    /// refused (`no-previous-release`, `rollback-held`, …) or failed, 2 timed out.
    Rollback {
        environment: String,
        /// End the hold instead: the environment goes back to what Git says.
        #[arg(long, conflicts_with = "commit")]
        release: bool,
        /// Write the rollback as a signed commit instead (a revert of the commit that brought the
        /// current release, on a branch `pl-rollback/ENV`, signed with your SSH signing key),
        /// for when Git is the only authority: merge or push it to roll back. No control plane
        /// is asked; the work tree is left alone.
        #[arg(long)]
        commit: bool,
        /// The repository for `--commit`.
        #[arg(short = 'C', long = "repo", default_value = ".", requires = "commit")]
        repo: PathBuf,
        /// The SSH private key `--commit` signs with (default: git's `user.signingkey`).
        #[arg(long, requires = "commit")]
        signing_key: Option<PathBuf>,
        /// How long to wait for the hosts, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// A rollout in progress (operator role): `promote` lets a canary go on past its pause,
    /// `abort` takes the previous release back (held, as `pl rollback`).
    Rollout {
        #[command(subcommand)]
        action: RolloutCommand,
    },
    /// Ask the reconciler for a pass now (operator role).
    Reconcile {
        /// Run a pass now instead of at the next interval (the only mode).
        #[arg(long, required = true)]
        now: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum RolloutCommand {
    /// Let the environment's canary go on now, past its pause (or the pause that waits for
    /// this). Returns once the step it let run is done on the hosts: 0 done, 1 refused
    /// (`not-in-progress`, `not-paused`) or failed, 2 timed out.
    Promote {
        environment: String,
        /// How long to wait for the hosts, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Stop the environment's rollout in progress (a canary, say): its previous release takes
    /// every request back, and the control plane holds it there as `pl rollback` does.
    /// Returns once the agents report it: 0 done, 1 refused (`not-in-progress`, …) or
    /// failed, 2 timed out.
    Abort {
        environment: String,
        /// How long to wait for the hosts, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum VolumeCommand {
    /// Remove a retained volume now, its data with it (admin role). Only a volume whose
    /// environment was torn down; returns once its node removed it (at most 60 s). With
    /// `--generation`, one of its kept generations instead (one a restore or a move left
    /// behind), whether its environment runs or not.
    Rm {
        environment: String,
        volume: String,
        /// A kept generation of the volume (as `pl volumes` lists them), not the volume.
        #[arg(long)]
        generation: Option<i64>,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Move a volume to another node (admin role): its role stops, the volume's files are
    /// saved to its backup repository and restored into its next generation on NODE, and the
    /// role starts there. Returns once the role is healthy on NODE, with how long it was down
    /// (0), or 1 with why not (the volume then stays where it was, and its role starts again).
    Move {
        environment: String,
        volume: String,
        /// The node the volume goes to (active, in the environment's pool, with room).
        #[arg(long)]
        to: String,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum NodeCommand {
    /// Make a one-time enrolment token for a node declared in Git (operator role): valid 15
    /// minutes, for that node only. The token goes to standard output, for
    /// `pl-agent enroll` to read from its standard input.
    Token {
        node: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Have a node make a new mesh key pair (operator role): the node makes it (its private key
    /// never leaves it), its peers take the new public key; returns once the node applied it
    /// and each peer handshook with it since.
    RotateMeshKey {
        node: String,
        /// How long to wait, in seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        #[command(flatten)]
        server: client::ServerArgs,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum RevisionsAction {
    /// Accept one refused rewrite of the applied branch (admin role): the reconciler then
    /// judges that head like any commit. Recorded as an event naming the token.
    ApproveRewrite {
        branch: String,
        /// The refused head, in full (40 hex digits).
        sha: String,
    },
}
