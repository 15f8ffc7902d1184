//! The repository side of Pushleft: reading a state tree from a Git revision (gix) or from disk
//! with its limits, deciding which commits to trust (SSH signatures, the allowed-signers file,
//! the signing policy), loading and judging a commit, writing `pl up`'s mirror (signed local
//! revisions), and (with the `fetch` feature) fetching a remote repository.
//!
//! Architecture invariant: no SQL, no async runtime, no network unless `fetch` is on. `pl`
//! links this crate and nothing of the daemon; the reconciler uses it for everything it reads
//! from Git. Git is read and written only here, through gix: nothing shells out to `git` or
//! `ssh-keygen` (`cli/tests/deps.rs` checks the product's sources).

pub mod commit;
pub mod image_update;
pub mod load;
/// The commit id type of every API here.
pub use gix::ObjectId;
pub mod mirror;
#[cfg(feature = "fetch")]
pub mod remote;
pub mod revert;
pub mod revision;
pub mod source;
pub mod trust;
