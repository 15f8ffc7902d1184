//! Commit statuses: one per (commit, environment), `pending` while its rollout runs, then
//! `success` or `failure` with the reason, in each forge's own API:
//! - GitHub: `POST {api}/repos/{owner}/{repo}/statuses/{sha}`, `{state, context, description,
//!   target_url}`, a bearer token; answers `201`.
//! - Gitea and Forgejo: the same path and body under `/api/v1`, `Authorization: token …`;
//!   answers `201`.
//! - GitLab: `POST {api}/projects/{id or url-encoded path}/statuses/{sha}`, `{state (failed,
//!   not failure), name, description, target_url}`, `PRIVATE-TOKEN`; answers `201`, and `400`
//!   "Cannot transition status" for a state the commit has already (taken as delivered).

use crate::{Header, Outcome, Request, Secret, judge_status};
use serde_json::json;

/// Which API a forge speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    GitHub,
    /// Gitea and Forgejo.
    Gitea,
    GitLab,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "github" => Some(Kind::GitHub),
            "gitea" | "forgejo" => Some(Kind::Gitea),
            "gitlab" => Some(Kind::GitLab),
            _ => None,
        }
    }
}

/// A commit status's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Success,
    Failure,
}

/// One status to post.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommitStatus {
    pub sha: String,
    /// `pushleft/<environment>`: one status line per environment on the commit.
    pub context: String,
    pub state: State,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
}

/// The longest description every forge takes (GitHub's limit).
pub const MAX_DESCRIPTION: usize = 140;

/// Why a forge's configuration is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForgeError {
    #[error("`{0}` is not a repository (owner/name; for GitLab a project path or id)")]
    Repository(String),
    #[error("`{0}` is not an API URL: https://, or http:// to a loopback address")]
    Api(String),
    #[error("`{0}` is not a commit sha (40 or 64 hex digits)")]
    Sha(String),
}

/// A forge to post statuses to: its API, the repository, the token (never printed).
#[derive(Clone, Debug)]
pub struct Forge {
    kind: Kind,
    api: String,
    repository: String,
    token: Secret,
}

/// Whether `url` may be called: https, or plain http to loopback only (a test's receiver).
pub fn allowed_url(url: &str) -> bool {
    if url.len() > 2048 || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return false;
    }
    if let Some(rest) = url.strip_prefix("https://") {
        return !rest.is_empty();
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    matches!(host, "127.0.0.1" | "[::1]" | "localhost")
}

impl Forge {
    pub fn new(kind: Kind, api: &str, repository: &str, token: Secret) -> Result<Forge, ForgeError> {
        let api = api.trim_end_matches('/');
        if !allowed_url(api) {
            return Err(ForgeError::Api(api.to_owned()));
        }
        let part_ok = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        let parts: Vec<&str> = repository.split('/').collect();
        let ok = match kind {
            Kind::GitLab => parts.iter().all(|p| part_ok(p)) && parts.len() <= 20,
            _ => parts.len() == 2 && parts.iter().all(|p| part_ok(p)),
        };
        if !ok || repository.len() > 255 {
            return Err(ForgeError::Repository(repository.to_owned()));
        }
        Ok(Forge {
            kind,
            api: api.to_owned(),
            repository: repository.to_owned(),
            token,
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The call that posts `status`.
    pub fn request(&self, status: &CommitStatus) -> Result<Request, ForgeError> {
        let sha = &status.sha;
        if !matches!(sha.len(), 40 | 64) || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ForgeError::Sha(sha.clone()));
        }
        let description: String = status.description.chars().take(MAX_DESCRIPTION).collect();
        let state = match (self.kind, status.state) {
            (_, State::Pending) => "pending",
            (_, State::Success) => "success",
            (Kind::GitLab, State::Failure) => "failed",
            (_, State::Failure) => "failure",
        };
        let (url, headers, body) = match self.kind {
            Kind::GitHub | Kind::Gitea => {
                let mut body = json!({"state": state, "context": status.context, "description": description});
                if let Some(t) = &status.target_url {
                    body["target_url"] = json!(t);
                }
                let auth = match self.kind {
                    Kind::GitHub => format!("Bearer {}", self.token.expose()),
                    _ => format!("token {}", self.token.expose()),
                };
                let mut headers = vec![("authorization", Header::Secret(Secret::new(auth)))];
                if self.kind == Kind::GitHub {
                    headers.push(("accept", Header::Plain("application/vnd.github+json".into())));
                    headers.push(("x-github-api-version", Header::Plain("2022-11-28".into())));
                }
                let url = format!("{}/repos/{}/statuses/{sha}", self.api, self.repository);
                (url, headers, body)
            }
            Kind::GitLab => {
                let mut body = json!({"state": state, "name": status.context, "description": description});
                if let Some(t) = &status.target_url {
                    body["target_url"] = json!(t);
                }
                let headers = vec![("private-token", Header::Secret(self.token.clone()))];
                let id = self.repository.replace('/', "%2F");
                let url = format!("{}/projects/{id}/statuses/{sha}", self.api);
                (url, headers, body)
            }
        };
        Ok(Request {
            url,
            headers,
            body: body.to_string().into_bytes(),
        })
    }

    /// What this forge's answer to a status means.
    pub fn judge(&self, code: u16, body: &str) -> Outcome {
        // GitLab refuses a state the commit's status has already: it is there.
        if self.kind == Kind::GitLab && code == 400 && body.contains("Cannot transition status") {
            return Outcome::Delivered;
        }
        judge_status(code, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: State) -> CommitStatus {
        CommitStatus {
            sha: "a".repeat(40),
            context: "pushleft/web-production".into(),
            state,
            description: "d".repeat(300),
            target_url: None,
        }
    }

    fn header<'r>(r: &'r Request, name: &str) -> Option<&'r Header> {
        r.headers.iter().find(|(n, _)| *n == name).map(|(_, h)| h)
    }

    #[test]
    fn each_forge_gets_its_own_path_state_and_token_header() {
        let token = || Secret::new("t0ken".into());
        let gh = Forge::new(Kind::GitHub, "https://api.github.com/", "acme/web", token()).expect("forge");
        let r = gh.request(&status(State::Failure)).expect("request");
        assert_eq!(
            r.url,
            format!("https://api.github.com/repos/acme/web/statuses/{}", "a".repeat(40))
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(body["state"], "failure");
        assert_eq!(body["context"], "pushleft/web-production");
        assert_eq!(body["description"].as_str().map(str::len), Some(MAX_DESCRIPTION));
        assert!(matches!(header(&r, "authorization"), Some(Header::Secret(s)) if s.expose() == "Bearer t0ken"));

        let gitea = Forge::new(Kind::Gitea, "http://127.0.0.1:3000/api/v1", "acme/web", token()).expect("forge");
        let r = gitea.request(&status(State::Pending)).expect("request");
        assert!(
            r.url
                .starts_with("http://127.0.0.1:3000/api/v1/repos/acme/web/statuses/")
        );
        assert!(matches!(header(&r, "authorization"), Some(Header::Secret(s)) if s.expose() == "token t0ken"));

        let gl = Forge::new(
            Kind::GitLab,
            "https://gitlab.example.invalid/api/v4",
            "group/sub/web",
            token(),
        )
        .expect("forge");
        let r = gl.request(&status(State::Failure)).expect("request");
        assert!(
            r.url
                .starts_with("https://gitlab.example.invalid/api/v4/projects/group%2Fsub%2Fweb/statuses/")
        );
        let body: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(
            (body["state"].as_str(), body["name"].as_str()),
            (Some("failed"), Some("pushleft/web-production"))
        );
        assert!(matches!(header(&r, "private-token"), Some(Header::Secret(s)) if s.expose() == "t0ken"));
        assert_eq!(
            gl.judge(400, "{\"message\":\"Cannot transition status via :run from :running\"}"),
            Outcome::Delivered
        );
        assert!(matches!(gh.judge(400, "Cannot transition status"), Outcome::Refused(_)));
    }

    #[test]
    fn bad_configuration_and_shas_are_refused() {
        let token = || Secret::new("t".into());
        assert!(
            Forge::new(Kind::GitHub, "http://api.github.com", "a/b", token()).is_err(),
            "plain http off loopback"
        );
        assert!(Forge::new(Kind::GitHub, "https://api.github.com", "a/../b", token()).is_err());
        assert!(Forge::new(Kind::GitHub, "https://api.github.com", "a", token()).is_err());
        assert!(
            Forge::new(Kind::GitLab, "https://x.invalid", "12345", token()).is_ok(),
            "a GitLab project id"
        );
        let gh = Forge::new(Kind::GitHub, "https://api.github.com", "a/b", token()).expect("forge");
        let mut s = status(State::Success);
        s.sha = "not-a-sha/../../x".into();
        assert!(gh.request(&s).is_err());
        assert!(allowed_url("http://localhost:8080/x") && allowed_url("http://[::1]:1/"));
        assert!(!allowed_url("http://127.0.0.1.example.invalid/") && !allowed_url("ftp://x"));
    }
}
