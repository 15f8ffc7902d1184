//! Pushleft's outgoing HTTP: commit statuses posted to a forge (`status.rs`: GitHub, GitLab,
//! Gitea and Forgejo, each API's own shape) and signed webhooks for events (`hook.rs`). A call
//! is a [`Request`] built purely from typed values (tests read it without a network), sent by
//! [`send`] within a time limit, and its answer judged by the kind of call: delivered, worth
//! retrying (the receiver was down, slow, or said so), or refused for good. Tokens and secrets
//! live in [`Secret`]s, which never print.

pub mod hook;
pub mod status;

use std::time::Duration;

/// A token or a signing secret: kept out of `Debug`, errors and logs, wiped when dropped.
#[derive(Clone)]
pub struct Secret(zeroize::Zeroizing<String>);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(zeroize::Zeroizing::new(value))
    }

    pub(crate) fn expose(&self) -> &str {
        self.0.as_str()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// One outgoing call: a POST of a JSON body.
#[derive(Debug)]
pub struct Request {
    pub url: String,
    /// Headers other than the content type; a value may be a secret.
    pub headers: Vec<(&'static str, Header)>,
    pub body: Vec<u8>,
}

/// A header's value: plain, or a secret (an authorization token).
#[derive(Debug)]
pub enum Header {
    Plain(String),
    Secret(Secret),
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Try again later (with the reason, never a secret).
    Retry(String),
    /// The receiver refused it for good (a bad token, a commit it does not know): retrying
    /// changes nothing.
    Refused(String),
}

/// The time a call may take, connection to last byte.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an answer's body read (for a refusal's reason).
pub const MAX_ANSWER_BYTES: u64 = 64 * 1024;
/// The most of an answer's body a reason quotes.
const REASON_CHARS: usize = 200;

/// What an answer means, by status code, for a call whose success codes are 2xx: 408, 429 and
/// 5xx are worth retrying; other 4xx are refusals.
pub fn judge_status(code: u16, body: &str) -> Outcome {
    let quoted: String = body.chars().take(REASON_CHARS).collect();
    match code {
        200..=299 => Outcome::Delivered,
        408 | 425 | 429 | 500..=599 => Outcome::Retry(format!("{code} {quoted}")),
        _ => Outcome::Refused(format!("{code} {quoted}")),
    }
}

/// Sends `request` (blocking, at most [`TIMEOUT`]) and judges the answer with `judge` (status
/// code and the start of the body). A connection that fails is worth retrying.
pub fn send(request: &Request, judge: impl Fn(u16, &str) -> Outcome) -> Outcome {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(TIMEOUT))
        .build()
        .into();
    let mut call = agent
        .post(&request.url)
        .header("content-type", "application/json")
        .header("user-agent", concat!("pushleft/", env!("CARGO_PKG_VERSION")));
    for (name, value) in &request.headers {
        call = match value {
            Header::Plain(v) => call.header(*name, v.as_str()),
            Header::Secret(s) => call.header(*name, s.expose()),
        };
    }
    match call.send(&request.body[..]) {
        Ok(mut answer) => {
            let code = answer.status().as_u16();
            let body = answer
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER_BYTES)
                .read_to_string()
                .unwrap_or_default();
            judge(code, &body)
        }
        // ureq's errors name the URL and the transport's reason, never a header.
        Err(e) => Outcome::Retry(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("ghp_topsecret".into());
        let r = Request {
            url: "https://forge.example.invalid/x".into(),
            headers: vec![("authorization", Header::Secret(s))],
            body: Vec::new(),
        };
        let printed = format!("{r:?}");
        assert!(
            !printed.contains("topsecret") && printed.contains("redacted"),
            "{printed}"
        );
    }

    #[test]
    fn answers_are_delivered_retried_or_refused() {
        assert_eq!(judge_status(201, ""), Outcome::Delivered);
        assert!(matches!(judge_status(503, "down"), Outcome::Retry(r) if r == "503 down"));
        assert!(matches!(judge_status(429, ""), Outcome::Retry(_)));
        assert!(matches!(judge_status(422, "no such sha"), Outcome::Refused(r) if r.contains("no such sha")));
        let long = "x".repeat(1000);
        assert!(matches!(judge_status(400, &long), Outcome::Refused(r) if r.len() < 220));
    }
}
