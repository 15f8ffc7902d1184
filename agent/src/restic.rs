//! restic, the backups' one owner: a volume's files or a command's output saved into a restic
//! repository (encrypted, deduplicated; local, SFTP or S3-compatible, whatever restic reaches),
//! listed, restored and pruned, so that the `restic` a user already has reads what Pushleft
//! wrote. Debian's `restic` binary, run with a cleared environment: the repository's password
//! only as a file (`RESTIC_PASSWORD_FILE`, never an argument or a variable), its output read
//! as JSON and bounded, each run bounded in time.

use crate::outcome::{Failure, permanent, retryable};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Most of restic's standard output kept (its JSON: a snapshot list, a summary).
const MAX_STDOUT: usize = 16 << 20;
/// Most of its standard error kept for a failure's detail (the end of it).
const MAX_STDERR: usize = 16 * 1024;

/// A restic repository and how to open it.
#[derive(Clone, Debug)]
pub struct Repository {
    /// restic's own location syntax: `/srv/backups`, `sftp:user@host:/path`, `s3:https://…`.
    pub location: String,
    /// A file (0600, on a tmpfs) holding the repository's password.
    pub password_file: PathBuf,
    /// What the backend needs besides (an S3 key pair, say), from the same sealed secret.
    pub env: BTreeMap<String, String>,
    /// restic's cache, under the agent's state.
    pub cache_dir: PathBuf,
}

/// What one backup wrote.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Summary {
    /// restic's short id of the new snapshot.
    pub snapshot_id: String,
    /// Bytes read from the volume or the command.
    #[serde(rename = "total_bytes_processed")]
    pub bytes: u64,
    /// Bytes the repository grew by (after deduplication and compression).
    pub data_added: u64,
}

/// One snapshot as `restic snapshots --json` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub short_id: String,
    /// RFC 3339.
    pub time: String,
    #[serde(default)]
    pub tags: Vec<String>,
    pub hostname: String,
}

/// The `restic` program.
#[derive(Clone, Debug)]
pub struct Restic {
    pub program: PathBuf,
    /// The longest one run may take.
    pub timeout: Duration,
}

fn failed(what: &str, code: Option<i32>, stderr: &[u8]) -> Failure {
    let text = String::from_utf8_lossy(stderr);
    let tail: String = text
        .trim()
        .chars()
        .rev()
        .take(2000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    // A repository that cannot be reached may be back later; anything else is for a person.
    let unreachable = [
        "connection refused",
        "no such host",
        "timeout",
        "i/o timeout",
        "connection reset",
    ]
    .iter()
    .any(|s| text.to_ascii_lowercase().contains(s));
    let detail = format!(
        "restic {what} exited with {}: {tail}",
        code.map_or("a signal".into(), |c| c.to_string())
    );
    if unreachable {
        retryable("backup-repository-unreachable", detail)
    } else {
        permanent("restic-failed", detail)
    }
}

impl Restic {
    fn command(&self, repo: &Repository, args: &[&str], cwd: Option<&Path>) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.program);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RESTIC_REPOSITORY", &repo.location)
            .env("RESTIC_PASSWORD_FILE", &repo.password_file)
            .env("RESTIC_CACHE_DIR", &repo.cache_dir)
            .envs(&repo.env)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(d) = cwd {
            c.current_dir(d);
        }
        c
    }

    /// Runs restic with `args`, feeding `input` to its standard input when given; its
    /// standard output (bounded) on success.
    async fn run(
        &self,
        repo: &Repository,
        args: &[&str],
        cwd: Option<&Path>,
        input: Option<&mut (dyn AsyncRead + Unpin + Send)>,
    ) -> Result<Vec<u8>, Failure> {
        let mut cmd = self.command(repo, args, cwd);
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| permanent("restic-missing", format!("{}: {e}", self.program.display())))?;
        let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(permanent("restic-failed", "restic's output was not captured"));
        };
        let stdin = child.stdin.take();
        let work = async {
            let feed = async {
                if let (Some(mut sink), Some(src)) = (stdin, input) {
                    // A command's output into restic; restic ending early ends the copy.
                    let copied = tokio::io::copy(src, &mut sink).await;
                    drop(sink);
                    copied.map(|_| ())
                } else {
                    Ok(())
                }
            };
            let read_out = async {
                let mut buf = Vec::new();
                (&mut out)
                    .take(MAX_STDOUT as u64)
                    .read_to_end(&mut buf)
                    .await
                    .map(|_| buf)
            };
            let read_err = async {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = err.read(&mut chunk).await?;
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.len() > MAX_STDERR {
                        buf.drain(..buf.len() - MAX_STDERR);
                    }
                }
                Ok::<_, std::io::Error>(buf)
            };
            let (fed, stdout, stderr) = tokio::join!(feed, read_out, read_err);
            let status = child.wait().await;
            (fed, stdout, stderr, status)
        };
        let (fed, stdout, stderr, status) = tokio::time::timeout(self.timeout, work).await.map_err(|_| {
            retryable(
                "restic-timeout",
                format!(
                    "restic {} took longer than {} s",
                    args.first().unwrap_or(&""),
                    self.timeout.as_secs()
                ),
            )
        })?;
        let stderr = stderr.unwrap_or_default();
        let status = status.map_err(|e| retryable("restic-failed", e.to_string()))?;
        if !status.success() {
            return Err(failed(args.first().unwrap_or(&""), status.code(), &stderr));
        }
        if let Err(e) = fed {
            return Err(permanent(
                "backup-input-failed",
                format!("reading what to back up: {e}"),
            ));
        }
        stdout.map_err(|e| retryable("restic-failed", e.to_string()))
    }

    /// Makes the repository unless it exists (`restic cat config` opens it).
    /// A repository that exists but does not open (a wrong password, say) is refused with
    /// why it did not open, never made again.
    pub async fn ensure_repository(&self, repo: &Repository) -> Result<&'static str, Failure> {
        let opened = match self.run(repo, &["cat", "config", "--quiet"], None, None).await {
            Ok(_) => return Ok("repository found"),
            Err(e) => e,
        };
        match self.run(repo, &["init", "--quiet"], None, None).await {
            Ok(_) => Ok("repository made"),
            // Another node made it meanwhile: it opens now.
            Err(_) if self.run(repo, &["cat", "config", "--quiet"], None, None).await.is_ok() => Ok("repository found"),
            // It exists and does not open: why it did not open is the answer.
            Err(_) => Err(opened),
        }
    }

    fn summary(out: &[u8]) -> Result<Summary, Failure> {
        String::from_utf8_lossy(out)
            .lines()
            .rev()
            .find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["message_type"] == "summary").then(|| serde_json::from_value(v).ok())?
            })
            .ok_or_else(|| permanent("restic-failed", "restic's backup printed no summary"))
    }

    fn tag_args(host: &str, tags: &[String]) -> Vec<String> {
        let mut a = vec!["--host".to_owned(), host.to_owned()];
        for t in tags {
            a.push("--tag".into());
            a.push(t.clone());
        }
        a
    }

    /// Saves the files under `dir` (at the snapshot's root).
    pub async fn backup_dir(
        &self,
        repo: &Repository,
        dir: &Path,
        host: &str,
        tags: &[String],
    ) -> Result<Summary, Failure> {
        // The root folder itself is not in the snapshot (only what it holds): its owner, mode
        // and extended attributes go as tags (`volume_root`).
        let root = crate::volume_root::tags_of(dir)
            .map_err(|e| permanent("backup-failed", format!("{}: {e}", dir.display())))?;
        let tags: Vec<String> = tags.iter().cloned().chain(root).collect();
        let mut args = vec!["backup".to_owned(), "--json".to_owned()];
        args.extend(Self::tag_args(host, &tags));
        args.push(".".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::summary(&self.run(repo, &args, Some(dir), None).await?)
    }

    /// Saves what `input` yields as the one file `filename`.
    pub async fn backup_stream(
        &self,
        repo: &Repository,
        input: &mut (dyn AsyncRead + Unpin + Send),
        filename: &str,
        host: &str,
        tags: &[String],
    ) -> Result<Summary, Failure> {
        let mut args = vec![
            "backup".to_owned(),
            "--json".to_owned(),
            "--stdin".to_owned(),
            "--stdin-filename".to_owned(),
            filename.to_owned(),
        ];
        args.extend(Self::tag_args(host, tags));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::summary(&self.run(repo, &args, None, Some(input)).await?)
    }

    /// The snapshots carrying every one of `tags`, oldest first.
    pub async fn snapshots(&self, repo: &Repository, tags: &[String]) -> Result<Vec<Snapshot>, Failure> {
        let joined = tags.join(",");
        let mut args = vec!["snapshots", "--json"];
        if !tags.is_empty() {
            args.extend(["--tag", joined.as_str()]);
        }
        let out = self.run(repo, &args, None, None).await?;
        serde_json::from_slice(&out).map_err(|e| permanent("restic-failed", format!("restic's snapshot list: {e}")))
    }

    /// The tags of snapshot `id`.
    pub async fn tags_of(&self, repo: &Repository, id: &str) -> Result<Vec<String>, Failure> {
        let out = self.run(repo, &["snapshots", "--json", id], None, None).await?;
        let list: Vec<Snapshot> = serde_json::from_slice(&out)
            .map_err(|e| permanent("restic-failed", format!("restic's snapshot list: {e}")))?;
        Ok(list.into_iter().next().map(|s| s.tags).unwrap_or_default())
    }

    /// Restores snapshot `id` into `target` (its root at `target`).
    pub async fn restore(&self, repo: &Repository, id: &str, target: &Path) -> Result<(), Failure> {
        let target = target.to_string_lossy();
        self.run(repo, &["restore", id, "--target", &target, "--quiet"], None, None)
            .await
            .map(|_| ())
    }

    /// Forgets snapshot `id` (a backup whose command failed) and prunes what only it held.
    pub async fn forget_one(&self, repo: &Repository, id: &str) -> Result<(), Failure> {
        self.run(repo, &["forget", id, "--prune", "--quiet"], None, None)
            .await
            .map(|_| ())
    }

    /// Keeps the newest `keep` snapshots carrying every one of `tags`, forgets the others and
    /// prunes the data only they held. One group whatever else the snapshots carry (a volume
    /// root's owner and mode are tags too, `volume_root`, and may change between snapshots).
    pub async fn retain(&self, repo: &Repository, tags: &[String], keep: u32) -> Result<(), Failure> {
        let (joined, keep) = (tags.join(","), keep.max(1).to_string());
        self.run(
            repo,
            &[
                "forget",
                "--tag",
                &joined,
                "--group-by",
                "",
                "--keep-last",
                &keep,
                "--prune",
                "--quiet",
            ],
            None,
            None,
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_the_last_summary_line_and_its_absence_is_a_failure() {
        let out = br#"{"message_type":"status","percent_done":0.5}
{"message_type":"summary","files_new":2,"data_added":1051,"total_bytes_processed":8,"snapshot_id":"bc421c94"}
"#;
        assert_eq!(
            Restic::summary(out).expect("summary"),
            Summary {
                snapshot_id: "bc421c94".into(),
                bytes: 8,
                data_added: 1051
            }
        );
        assert_eq!(
            Restic::summary(b"{\"message_type\":\"status\"}\n")
                .expect_err("none")
                .code,
            "restic-failed"
        );
    }

    #[test]
    fn an_unreachable_repository_is_worth_retrying_and_a_wrong_password_is_not() {
        assert_eq!(
            failed(
                "backup",
                Some(1),
                b"Fatal: unable to open config file: dial tcp: connection refused"
            )
            .code,
            "backup-repository-unreachable"
        );
        let wrong = failed("backup", Some(1), b"Fatal: wrong password or no key found");
        assert_eq!(
            (wrong.code, wrong.outcome),
            ("restic-failed", agent_proto::Outcome::Permanent)
        );
    }
}
