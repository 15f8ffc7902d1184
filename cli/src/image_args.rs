//! `pl image`'s subcommands: signing, updates, and the control plane's image store (push,
//! collection).

use crate::client;
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub(crate) enum ImageCommand {
    /// Sign IMAGE (`name@sha256:<hex>`, or the digest alone) with your SSH key, as `printf %s
    /// DIGEST | ssh-keygen -Y sign -n pushleft-image -f KEY` would (the same bytes for an
    /// Ed25519 key), and add the signature to `image-signatures/sha256-<hex>.sig` in the state
    /// tree. Commit the file: the policy's `images` rules say whose signatures nodes accept.
    Sign {
        image: String,
        /// The SSH private key to sign with (default: git's `user.signingkey`).
        #[arg(long)]
        signing_key: Option<PathBuf>,
        /// The state tree (default: the current directory).
        #[arg(short = 'C', long = "dir")]
        dir: Option<PathBuf>,
    },
    /// For each image with an `imageUpdates` policy (a Project's, or an Environment's own),
    /// read its registry's tags, pick the newest the policy allows, resolve its digest, and
    /// write the change as a commit signed with your key (a bot key) on
    /// `pl-image-update/<kind>/<name>` (one branch per object, moved on each update; `branch:
    /// applied` chains them on `pl-image-update/applied/<branch>` to push to the applied
    /// branch). HEAD, the index and the work tree are left alone; push the branches.
    Update {
        /// The SSH private key to sign with (default: git's `user.signingkey`).
        #[arg(long)]
        signing_key: Option<PathBuf>,
        /// `HOST=FILE`: credentials (`user:password`, a file only its owner may read) for a
        /// registry; repeat for more.
        #[arg(long, value_name = "HOST=FILE")]
        registry_auth: Vec<String>,
        /// The state tree (default: the current directory).
        #[arg(short = 'C', long = "dir")]
        dir: Option<PathBuf>,
    },
    /// Send an image to the control plane's own image store (`[images]`), so nodes pull it
    /// through their agents and no registry is needed (operator). `pl image push web:1.4`: the
    /// engine pushes the local image itself (through the `docker` CLI and its context), so
    /// only the layers the store lacks are read and sent. `docker save web:1.4 | pl image push
    /// web --input -`: an archive instead (IMAGE is then the name to keep it under). Prints
    /// `pushleft.invalid/NAME@sha256:…`, the reference to write in Git.
    Push {
        /// The engine's local image (`web:1.4`, `shop/web`, an image id); with `--input`, the
        /// repository name in the store.
        image: String,
        /// The repository name in the store (default: IMAGE's path without registry host or
        /// tag: `registry.invalid/shop/web:1.4` is `shop/web`).
        #[arg(long)]
        name: Option<String>,
        /// Read a `docker save` archive from FILE (`-`: standard input) instead of asking the
        /// engine.
        #[arg(long, value_name = "FILE")]
        input: Option<PathBuf>,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// List the image store's blobs that nothing the control plane keeps references (an
    /// accepted revision, an environment's running, retired or previous release) and that are
    /// older than `images.gc_grace_hours`; with `--delete`, remove them (admin).
    Gc {
        /// Remove them (without it, a dry run).
        #[arg(long)]
        delete: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
}
