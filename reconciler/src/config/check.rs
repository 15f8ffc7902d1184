//! The configuration's rules, checked once it is read: each section's values in range and
//! consistent with the others (a source, what issuing certificates needs, where statuses and
//! webhooks go, the limits), the first problem said in the configuration's own words.

use super::*;

impl Config {
    pub(super) fn check(&self, path: &Path) -> Result<(), ConfigError> {
        // In this order, so the first problem said is the same whatever else is wrong.
        self.check_source()
            .and_then(|()| self.check_certificates())
            .and_then(|()| self.check_notifications())
            .and_then(|()| self.check_limits())
            .map_err(|message| ConfigError::Invalid {
                path: path.to_owned(),
                message,
            })
    }

    /// The source: a local path, or a remote URL with a cache and no credential in it; the
    /// preview branches' patterns.
    fn check_source(&self) -> Result<(), String> {
        match (&self.source.path, &self.source.url) {
            (Some(_), Some(_)) => return Err("source: set `path` or `url`, not both".into()),
            (None, None) => return Err("source: set `path` (a local repository) or `url`".into()),
            (None, Some(_)) if self.source.cache_dir.is_none() => {
                return Err("source: a remote `url` needs a `cache_dir` to fetch into".into());
            }
            _ => {}
        }
        if let Some(url) = &self.source.url
            && let Some(why) = credential_in_url(url)
        {
            return Err(format!(
                "source.url: {why}; a credential in the URL would be logged and kept in the configuration. Use an SSH key (`ssh://git@host/repo.git` with the daemon user's key) or a credential file read by git's credential helper"
            ));
        }
        for pattern in &self.source.preview_branches {
            globset::Glob::new(pattern).map_err(|e| format!("source.preview_branches: `{pattern}`: {e}"))?;
        }
        Ok(())
    }

    /// What issuing certificates needs: the node CA for the agent API, an age identity, sane
    /// lifetimes and an ACME account.
    fn check_certificates(&self) -> Result<(), String> {
        if self.agent_api.is_some() && (self.control.ca_cert.is_none() || self.control.ca_key.is_none()) {
            return Err(
                "agent_api needs control.ca_cert and control.ca_key: agents present certificates from that CA".into(),
            );
        }
        if let Some(c) = &self.certificates {
            if c.identity.is_none() && self.control.age_identity.is_none() {
                return Err(
                "certificates needs an age identity (certificates.identity or control.age_identity): an issued key is kept sealed to the control host and resealed to each node".into(),
            );
            }
            if !(1..=24 * 397).contains(&c.lifetime_hours) {
                return Err("certificates.lifetime_hours must be 1 to 9528 (397 days)".into());
            }
            if !c.local_suffix.ends_with(".localhost") {
                return Err(
                    "certificates.local_suffix must end in `.localhost`: the local CA signs nothing else".into(),
                );
            }
            let a = &c.acme;
            if a.directory.is_some() && a.staging {
                return Err("certificates.acme: set `directory` or `staging = true`, not both".into());
            }
            if !a.directory_url().starts_with("https://") {
                return Err("certificates.acme.directory must be an https:// URL (RFC 8555 requires HTTPS)".into());
            }
            if let Some(bad) = a.contact.iter().find(|c| !c.starts_with("mailto:") || c.len() > 320) {
                return Err(format!("certificates.acme.contact: {bad:?} is not a `mailto:` address"));
            }
            if a.eab_kid.is_some() != a.eab_hmac_key_file.is_some() {
                return Err(
                    "certificates.acme: external account binding needs both `eab_kid` and `eab_hmac_key_file`".into(),
                );
            }
            if !(1..=64).contains(&a.max_orders) {
                return Err("certificates.acme.max_orders must be 1 to 64".into());
            }
        }
        Ok(())
    }

    /// Where statuses and webhooks go: a known forge over HTTPS, bounded hooks with known
    /// events.
    fn check_notifications(&self) -> Result<(), String> {
        if let Some(f) = &self.forge {
            if forge::status::Kind::parse(&f.kind).is_none() {
                return Err(format!(
                    "forge.kind `{}` is not one of github, gitlab, gitea, forgejo",
                    f.kind
                ));
            }
            if !forge::status::allowed_url(&f.api) {
                return Err(format!(
                    "forge.api `{}` must be an https:// URL (http:// only to a loopback address)",
                    f.api
                ));
            }
            if f.context.is_empty() || f.context.len() > 64 || f.context.chars().any(char::is_control) {
                return Err("forge.context must be 1 to 64 printable characters".into());
            }
            if f.target_url.as_deref().is_some_and(|u| !forge::status::allowed_url(u)) {
                return Err("forge.target_url must be an https:// URL".into());
            }
        }
        if self.hooks.len() > MAX_HOOKS {
            return Err(format!("hooks: at most {MAX_HOOKS} receivers"));
        }
        for (i, h) in self.hooks.iter().enumerate() {
            if !forge::status::allowed_url(&h.url) {
                return Err(format!(
                    "hooks[{i}].url must be an https:// URL (http:// only to a loopback address)"
                ));
            }
            if let Some(bad) = h.events.iter().find(|e| !HOOK_EVENTS.contains(&e.as_str())) {
                return Err(format!(
                    "hooks[{i}].events: `{bad}` is not one of {}",
                    HOOK_EVENTS.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Domains' rechecks, certificates' hours, the API's limits, intervals and tokens.
    fn check_limits(&self) -> Result<(), String> {
        let d = &self.domains;
        if !(1..=86_400).contains(&d.pending_recheck_seconds) || !(1..=7 * 86_400).contains(&d.recheck_seconds) {
            return Err("domains: pending_recheck_seconds must be 1 to 86400 and recheck_seconds 1 to 604800".into());
        }
        if let Some(ResolverSetting::Servers(list)) = &d.resolver
            && !(1..=8).contains(&list.len())
        {
            return Err("domains.resolver: 1 to 8 servers, or \"system\"".into());
        }
        if !(0..=3600).contains(&self.control.readmit_wait_seconds) {
            return Err("control.readmit_wait_seconds must be 0 to 3600".into());
        }
        if !(1..=100_000).contains(&self.control.heartbeats_per_second) {
            return Err("control.heartbeats_per_second must be 1 to 100000".into());
        }
        if self.control.heartbeat_min_seconds > 600 {
            return Err("control.heartbeat_min_seconds must be 0 to 600".into());
        }
        if !(1..=24 * 30).contains(&self.control.node_cert_hours) {
            return Err("control.node_cert_hours must be 1 to 720".into());
        }
        if self.api.max_connections == 0 || self.api.max_streams == 0 || self.api.max_streams_per_token == 0 {
            return Err("api: connection and stream limits must be at least 1".into());
        }
        if self.source.fetch_interval_seconds == 0 || self.reconcile.interval_seconds == 0 {
            return Err("intervals must be at least 1 second".into());
        }
        if let Some(u) = &self.image_updates {
            u.check(self.source.path.is_some())?;
        }
        if let Some(i) = &self.images {
            i.check()?;
        }
        if let Some(sn) = &self.snapshots {
            if !(1..=168).contains(&sn.every_hours) || !(1..=1000).contains(&sn.keep) {
                return Err("snapshots: every_hours must be 1 to 168 and keep 1 to 1000".into());
            }
            if !(1..=16).contains(&sn.recipients.len()) {
                return Err("snapshots.recipients: 1 to 16 age or SSH public keys".into());
            }
            for r in &sn.recipients {
                pushleft_secrets::parse_recipient(r).map_err(|e| format!("snapshots.recipients: {e}"))?;
            }
        }
        for t in &self.api.tokens {
            if t.sha256.len() != 64 || !t.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("api.tokens: `{}`: sha256 must be 64 hex digits", t.name));
            }
            if t.sha256.bytes().all(|b| b == b'0') {
                return Err(format!(
                    "api.tokens: `{}`: sha256 is the example's placeholder; `pl-reconciler token --name {} --role … --out FILE` makes a token and prints its line",
                    t.name, t.name
                ));
            }
        }
        Ok(())
    }
}
