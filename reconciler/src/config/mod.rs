//! The daemon's one configuration file (TOML), documented in `docs/reconciler.md`. Paths are
//! read and checked at start, so a bad file is refused before anything runs.

use serde::Deserialize;

mod certificates;
mod check;
mod control;
mod image_updates;
mod images;
mod outbound;

pub use certificates::*;
pub use control::{ControlConfig, ControlPlaneId};
pub use image_updates::ImageUpdatesConfig;
pub use images::ImagesConfig;
pub use outbound::*;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{message}")]
    Exposed { path: PathBuf, message: String },
}

impl ConfigError {
    /// A stable code for the refusal.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "config-unreadable",
            ConfigError::TooLarge { .. } => "config-too-large",
            ConfigError::Parse { .. } => "config-malformed",
            ConfigError::Invalid { .. } => "config-invalid",
            ConfigError::Exposed { .. } => "private-file-exposed",
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub source: SourceConfig,
    pub trust: TrustConfig,
    pub ledger: LedgerConfig,
    pub api: ApiConfig,
    #[serde(default)]
    pub webhooks: WebhookConfig,
    #[serde(default)]
    pub control: ControlConfig,
    #[serde(default)]
    pub reconcile: ReconcileConfig,
    /// The agents' API (mutual TLS); off when absent.
    #[serde(default)]
    pub agent_api: Option<AgentApiConfig>,
    /// Certificates the control plane issues for the hostnames it serves; off when absent
    /// (hostnames without a certificate of their own are then served over plain HTTP).
    #[serde(default)]
    pub certificates: Option<CertificatesConfig>,
    /// How custom domains' ownership is checked in DNS.
    #[serde(default)]
    pub domains: DomainsConfig,
    /// The forge commit statuses are posted to; off when absent.
    #[serde(default)]
    pub forge: Option<ForgeConfig>,
    /// Receivers of signed webhooks for events.
    #[serde(default)]
    pub hooks: Vec<HookConfig>,
    /// Scheduled snapshots of the control plane's state (`snapshot save`, by the leader); off
    /// when absent.
    #[serde(default)]
    pub snapshots: Option<SnapshotsConfig>,
    /// The image update watcher (`pl image update`'s, in the daemon); off when absent.
    #[serde(default)]
    pub image_updates: Option<ImageUpdatesConfig>,
    /// The control plane's own image store (`pl image push`); off when absent.
    #[serde(default)]
    pub images: Option<ImagesConfig>,
}

/// `[snapshots]`: where the leader writes its scheduled snapshots, how often, how many are
/// kept, and who can open them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsConfig {
    /// The folder the archives go to (`pushleft-<UTC time>.snapshot`).
    pub dir: PathBuf,
    /// Hours between two snapshots (1 to 168).
    #[serde(default = "default_snapshot_hours")]
    pub every_hours: u64,
    /// The newest archives kept; older ones in `dir` are removed (1 to 1000).
    #[serde(default = "default_snapshot_keep")]
    pub keep: usize,
    /// The age (`age1…`) or SSH public keys each archive is encrypted to (1 to 16).
    pub recipients: Vec<String>,
}

fn default_snapshot_hours() -> u64 {
    24
}

fn default_snapshot_keep() -> usize {
    7
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentApiConfig {
    /// Where agents connect; a client certificate from the control CA is required.
    pub listen: SocketAddr,
    /// Connections served at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// A local repository, watched for new commits.
    pub path: Option<PathBuf>,
    /// A remote repository, fetched into `cache_dir` on an interval and on webhooks.
    pub url: Option<String>,
    pub cache_dir: Option<PathBuf>,
    #[serde(default = "default_fetch_interval")]
    pub fetch_interval_seconds: u64,
    #[serde(default = "default_branch")]
    pub branch: String,
    #[serde(default)]
    pub preview_branches: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustConfig {
    pub allowed_signers: PathBuf,
    pub policy: Option<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// `sqlite:///var/lib/pushleft/ledger.db` or `postgres://…` (a password belongs in
    /// `PGPASSWORD` or `~/.pgpass`, not here).
    pub url: String,
    #[serde(default = "default_connections")]
    pub max_connections: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// Bearer tokens, stored as SHA-256 hashes (`pl-reconciler token` makes them).
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// Connections served at once; past it a new connection is closed at once, so a flood
    /// cannot use the daemon's file descriptors (systemd's default limit is 1,024).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Event streams open at once, in all.
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// Event streams one token may hold open.
    #[serde(default = "default_max_streams_per_token")]
    pub max_streams_per_token: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    pub role: Role,
    /// Hex SHA-256 of the token.
    pub sha256: String,
}

/// What a token may do; each role can do everything the ones before it can.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// File holding GitHub's webhook secret (checks `X-Hub-Signature-256`).
    pub github_secret_file: Option<PathBuf>,
    /// File holding Gitea's webhook secret (checks `X-Gitea-Signature`).
    pub gitea_secret_file: Option<PathBuf>,
    /// File holding GitLab's webhook token (checks `X-Gitlab-Token`).
    pub gitlab_token_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileConfig {
    /// The loop runs at least this often, hint or not.
    #[serde(default = "default_interval")]
    pub interval_seconds: u64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            interval_seconds: default_interval(),
        }
    }
}

fn default_fetch_interval() -> u64 {
    60
}
fn default_branch() -> String {
    "main".into()
}
fn default_connections() -> u32 {
    16
}
fn default_interval() -> u64 {
    10
}
fn default_max_connections() -> usize {
    512
}
fn default_max_streams() -> usize {
    128
}
fn default_max_streams_per_token() -> usize {
    16
}

/// Why `url` carries a credential, if it does: user information in an HTTP(S) URL (a token as
/// the user name is how forges take them), a query string, or a password in any URL.
fn credential_in_url(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
    let http = scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https");
    if http && userinfo.is_some() {
        return Some("it holds user information (`user@` or `token@`)");
    }
    if userinfo.is_some_and(|u| u.contains(':')) {
        return Some("it holds a password");
    }
    if http && url.contains('?') {
        return Some("it holds a query string");
    }
    None
}

/// A private file that group or others can read.
fn exposed(path: &Path, message: String) -> ConfigError {
    ConfigError::Exposed {
        path: path.to_owned(),
        message,
    }
}

impl Config {
    /// Whether the control plane issues certificates for hostnames (`[certificates]`, with an
    /// age identity to seal their keys to): only then does a hostname's publish look for one.
    pub fn issues_certificates(&self) -> bool {
        self.certificates
            .as_ref()
            .is_some_and(|c| c.identity.is_some() || self.control.age_identity.is_some())
    }

    /// Checks the files the configuration names: each exists, and the private ones (the API
    /// key, the CA key, the age identity, webhook secrets, the image bot's key and registry
    /// credentials) are readable by their owner alone.
    /// Run at every start, before anything else.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        let mut public = vec![&self.api.tls_cert, &self.trust.allowed_signers];
        public.extend(self.trust.policy.iter());
        public.extend(self.control.ca_cert.iter());
        for p in public {
            std::fs::metadata(p).map_err(|source| ConfigError::Read {
                path: p.clone(),
                source,
            })?;
        }
        let mut private = vec![&self.api.tls_key];
        let certificates_identity = self.certificates.as_ref().and_then(|c| c.identity.clone());
        for p in [
            &self.control.ca_key,
            &self.control.age_identity,
            &certificates_identity,
            &self.webhooks.github_secret_file,
            &self.webhooks.gitea_secret_file,
            &self.webhooks.gitlab_token_file,
        ] {
            private.extend(p.iter());
        }
        private.extend(self.forge.iter().map(|f| &f.token_file));
        private.extend(self.hooks.iter().map(|h| &h.secret_file));
        if let Some(u) = &self.image_updates {
            private.push(&u.signing_key);
            private.extend(u.registry_auth.values());
        }
        for p in private {
            pushleft_secrets::check_private_file(p).map_err(|m| exposed(p, m))?;
        }
        Ok(())
    }

    /// Reads and checks a configuration file. Relative paths in it are taken from its folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let read = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge { path: path.to_owned() });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        let mut cfg = Config::parse(path, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        cfg.resolve(base);
        cfg.check(path)?;
        Ok(cfg)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e: toml::de::Error| {
            let (line, column) = e
                .span()
                .map(|s| {
                    let before = &text[..s.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    (line, column)
                })
                .unwrap_or((1, 1));
            ConfigError::Parse {
                path: path.to_owned(),
                line,
                column,
                message: e.message().to_owned(),
            }
        })
    }

    /// The files of the control plane's own state this configuration names (keys,
    /// certificates, trust, secrets' identities, the ACME account), as `snapshot save` keeps
    /// them: those that exist, not the repository or its cache.
    pub fn state_files(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = vec![
            self.trust.allowed_signers.clone(),
            self.api.tls_cert.clone(),
            self.api.tls_key.clone(),
        ];
        out.extend(self.trust.policy.clone());
        out.extend(self.webhooks.github_secret_file.clone());
        out.extend(self.webhooks.gitea_secret_file.clone());
        out.extend(self.webhooks.gitlab_token_file.clone());
        out.extend(self.control.ca_cert.clone());
        out.extend(self.control.ca_key.clone());
        out.extend(self.control.age_identity.clone());
        out.extend(self.control.trusted_cas.iter().cloned());
        out.extend(self.forge.as_ref().map(|f| f.token_file.clone()));
        out.extend(self.hooks.iter().map(|h| h.secret_file.clone()));
        if let Some(c) = &self.certificates {
            out.extend([c.local_ca_cert.clone(), c.local_ca_key.clone()]);
            out.extend(c.identity.clone());
            out.extend(c.acme.eab_hmac_key_file.clone());
            out.extend(c.acme.ca_root.clone());
            if let Ok(dir) = std::fs::read_dir(&c.acme.account_dir) {
                out.extend(dir.flatten().map(|e| e.path()).filter(|p| p.is_file()));
            }
        }
        out.retain(|p| p.is_file());
        out.sort();
        out.dedup();
        out
    }

    fn resolve(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        let fix_opt = |p: &mut Option<PathBuf>| {
            if let Some(p) = p
                && p.is_relative()
            {
                *p = base.join(&*p);
            }
        };
        fix_opt(&mut self.source.path);
        fix_opt(&mut self.source.cache_dir);
        fix(&mut self.trust.allowed_signers);
        fix_opt(&mut self.trust.policy);
        fix(&mut self.api.tls_cert);
        fix(&mut self.api.tls_key);
        fix_opt(&mut self.webhooks.github_secret_file);
        fix_opt(&mut self.webhooks.gitea_secret_file);
        fix_opt(&mut self.webhooks.gitlab_token_file);
        fix_opt(&mut self.control.ca_cert);
        fix_opt(&mut self.control.ca_key);
        for p in &mut self.control.trusted_cas {
            let mut o = Some(std::mem::take(p));
            fix_opt(&mut o);
            *p = o.unwrap_or_default();
        }
        fix_opt(&mut self.control.age_identity);
        if let Some(sn) = &mut self.snapshots {
            fix(&mut sn.dir);
        }
        if let Some(i) = &mut self.images {
            fix(&mut i.dir);
        }
        if let Some(u) = &mut self.image_updates {
            fix(&mut u.signing_key);
            for file in u.registry_auth.values_mut() {
                fix(file);
            }
        }
        if let Some(f) = &mut self.forge {
            fix(&mut f.token_file);
        }
        for h in &mut self.hooks {
            fix(&mut h.secret_file);
        }
        if let Some(c) = &mut self.certificates {
            fix(&mut c.local_ca_cert);
            fix(&mut c.local_ca_key);
            fix_opt(&mut c.identity);
            fix(&mut c.acme.account_dir);
            fix_opt(&mut c.acme.eab_hmac_key_file);
            fix_opt(&mut c.acme.ca_root);
        }
    }
}

/// A small file's text (trust files, webhook secrets): at most 1 MiB.
pub(crate) fn read_small(path: &std::path::Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.len() > 1024 * 1024 {
        return Err("larger than 1 MiB".into());
    }
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "[source]\npath = \"state\"\npreview_branches = [\"feature/*\"]\n\n[trust]\nallowed_signers = \"allowed_signers\"\n\n[ledger]\nurl = \"sqlite:///tmp/l.db\"\n\n[api]\nlisten = \"127.0.0.1:7443\"\ntls_cert = \"api.crt\"\ntls_key = \"api.key\"\n";

    #[test]
    fn parses_with_defaults() {
        let c = Config::parse(Path::new("c.toml"), GOOD).expect("parses");
        assert_eq!(c.source.branch, "main");
        assert_eq!(c.reconcile.interval_seconds, 10);
        assert!(c.check(Path::new("c.toml")).is_ok());
    }

    #[test]
    fn domains_are_looked_up_only_through_a_resolver_named_here() {
        let with = |t: &str| Config::parse(Path::new("c.toml"), &format!("{GOOD}\n[domains]\n{t}\n"));
        let none = Config::parse(Path::new("c.toml"), GOOD).expect("parses");
        assert_eq!(none.domains.resolver, None, "unset: no lookups at all");
        let system = with("resolver = \"system\"").expect("system");
        assert_eq!(
            system.domains.resolver,
            Some(ResolverSetting::System(SystemResolver::System))
        );
        let listed = with("resolver = [\"127.0.0.1:5353\"]").expect("servers");
        assert!(matches!(listed.domains.resolver, Some(ResolverSetting::Servers(ref v)) if v.len() == 1));
        assert!(
            with("resolver = \"dns.example\"").is_err(),
            "neither a word nor addresses"
        );
        let empty = with("resolver = []").expect("parses");
        assert!(empty.check(Path::new("c.toml")).is_err(), "an empty list is refused");
        let acme = Config::parse(
            Path::new("c.toml"),
            &format!("{GOOD}\n[certificates]\nissuer = \"acme\"\nidentity = \"id.age\"\n\n[certificates.acme]\nstaging = true\n"),
        )
        .expect("acme");
        let a = &acme.certificates.as_ref().expect("certificates").acme;
        assert_eq!(a.directory_url(), LETS_ENCRYPT_STAGING);
        assert!(acme.check(Path::new("c.toml")).is_ok());
        let both = Config::parse(
            Path::new("c.toml"),
            &format!("{GOOD}\n[certificates]\nissuer = \"acme\"\nidentity = \"id.age\"\n\n[certificates.acme]\nstaging = true\ndirectory = \"https://ca.invalid/dir\"\neab_kid = \"k\"\n"),
        )
        .expect("parses");
        assert!(
            both.check(Path::new("c.toml")).is_err(),
            "directory and staging, EAB half given"
        );
    }

    #[test]
    fn unknown_keys_are_refused_with_a_position() {
        let text = GOOD.replace("[ledger]\n", "[ledger]\nurll = \"x\"\n");
        let e = Config::parse(Path::new("c.toml"), &text).expect_err("refused");
        assert_eq!(e.code(), "config-malformed");
        let shown = e.to_string();
        assert!(shown.starts_with("c.toml:9:1: unknown field `urll`"), "{shown}");
    }

    #[test]
    fn the_documented_example_parses_and_refuses_its_placeholders() {
        let text = include_str!("../../../examples/reconciler/reconciler.toml");
        let c = Config::parse(Path::new("reconciler.toml"), text).expect("the example parses");
        let e = c
            .check(Path::new("reconciler.toml"))
            .expect_err("placeholders are refused");
        assert!(e.to_string().contains("placeholder; `pl-reconciler token"), "{e}");
        // With real token lines, it checks.
        let real = text.replace(
            "0000000000000000000000000000000000000000000000000000000000000000",
            &crate::auth::new_token().expect("random").1,
        );
        let c = Config::parse(Path::new("reconciler.toml"), &real).expect("parses");
        assert!(c.check(Path::new("reconciler.toml")).is_ok());
        assert_eq!(c.api.tokens.len(), 2);
        assert_eq!(c.api.tokens[1].role, Role::Operator);
        assert_eq!(c.source.preview_branches, ["feature/*", "fix/*"]);
    }

    #[test]
    fn the_forge_and_hooks_are_checked_before_anything_is_sent() {
        let text = include_str!("../../../examples/reconciler/reconciler.toml").replace(
            "0000000000000000000000000000000000000000000000000000000000000000",
            &crate::auth::new_token().expect("random").1,
        );
        // The example's commented sections, turned on, check.
        let on = text
            .replace("# [forge]", "[forge]")
            .replace("# kind = \"github\"", "kind = \"github\"")
            .replace("# api = \"https://api.github.com\"", "api = \"https://api.github.com\"")
            .replace("# repository = ", "repository = ")
            .replace("# token_file = ", "token_file = ")
            .replace("# [[hooks]]", "[[hooks]]")
            .replace("# url = \"https://hooks", "url = \"https://hooks")
            .replace("# secret_file = ", "secret_file = ")
            .replace("# events = ", "events = ");
        let path = Path::new("reconciler.toml");
        let c = Config::parse(path, &on).expect("parses");
        assert!(c.check(path).is_ok(), "{:?}", c.check(path).err());
        assert_eq!(
            (c.forge.as_ref().map(|f| f.context.as_str()), c.hooks.len()),
            (Some("pushleft"), 1)
        );
        for (from, to, why) in [
            ("kind = \"github\"", "kind = \"bitbucket\"", "forge.kind"),
            (
                "api = \"https://api.github.com\"",
                "api = \"http://api.github.com\"",
                "forge.api",
            ),
            ("url = \"https://hooks", "url = \"http://hooks", "hooks[0].url"),
            ("\"rollback-automatic\"]", "\"everything\"]", "hooks[0].events"),
        ] {
            let bad = on.replace(from, to);
            assert_ne!(bad, on);
            let e = Config::parse(path, &bad)
                .expect("parses")
                .check(path)
                .expect_err("refused");
            assert!(e.to_string().contains(why), "{e}");
        }
    }

    /// No example or document may carry the hash of a token someone could guess: whoever
    /// copies it would grant that role to anyone.
    #[test]
    fn examples_and_docs_hold_no_hash_of_a_guessable_token() {
        use sha2::{Digest, Sha256};
        let guessable = [
            "", "test", "test2", "token", "secret", "password", "admin", "changeme", "viewer", "operator", "ci",
        ];
        let hashes: Vec<String> = guessable
            .iter()
            .map(|w| hex::encode(Sha256::digest(w.as_bytes())))
            .collect();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["examples", "docs"] {
            let mut stack = vec![root.join(dir)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).expect("read dir").flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        files.push(p);
                    }
                }
            }
        }
        files.push(root.join("README.md"));
        assert!(files.len() > 5);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for (w, h) in guessable.iter().zip(&hashes) {
                assert!(!text.contains(h.as_str()), "{} holds sha256({w:?})", f.display());
            }
        }
    }

    #[test]
    fn credentials_in_source_urls_are_refused() {
        for (url, refused) in [
            ("https://ghp_abc@github.com/acme/state.git", true),
            ("https://user:pass@git.example.com/s.git", true),
            ("https://git.example.com/s.git?private_token=abc", true),
            ("ssh://git:pw@git.example.com/s.git", true),
            ("https://git.example.com/acme/state.git", false),
            ("ssh://git@git.example.com/acme/state.git", false),
            ("git@git.example.com:acme/state.git", false),
        ] {
            let text = GOOD.replace("path = \"state\"\n", &format!("url = {url:?}\ncache_dir = \"c\"\n"));
            let c = Config::parse(Path::new("c.toml"), &text).expect("parses");
            let r = c.check(Path::new("c.toml"));
            assert_eq!(r.is_err(), refused, "{url}: {r:?}");
            if let Err(e) = r {
                let shown = e.to_string();
                assert!(shown.contains("SSH key") && shown.contains("credential"), "{shown}");
                assert!(
                    !shown.contains("ghp_abc") && !shown.contains("user:pass") && !shown.contains("private_token=abc"),
                    "{shown}"
                );
            }
        }
    }

    #[test]
    fn a_source_needs_exactly_one_origin() {
        let text = GOOD.replace("path = \"state\"\n", "");
        let c = Config::parse(Path::new("c.toml"), &text).expect("parses");
        let e = c.check(Path::new("c.toml")).expect_err("refused");
        assert_eq!(e.code(), "config-invalid");
        let text = GOOD.replace("path = \"state\"\n", "url = \"https://git.example.com/s.git\"\n");
        let c = Config::parse(Path::new("c.toml"), &text).expect("parses");
        assert!(
            c.check(Path::new("c.toml"))
                .expect_err("needs cache_dir")
                .to_string()
                .contains("cache_dir")
        );
    }
}
