//! Proving a custom domain's ownership (the decision, no I/O): what DNS record a Domain needs,
//! whether what a resolver answered proves it, and where the domain's state goes from there.
//! The reconciler asks DNS and keeps the states; `pl domains` shows them.
//!
//! - `txt`: `_pushleft-challenge.<hostname>` holds [`txt_value`], derived from the control plane
//!   and the hostname, so a record made for one control plane proves nothing to another.
//! - `cname`: the hostname is a CNAME to the environment's own hostname.
//!
//! States: `pending` (never proven: not routed, no certificate), `verified` (proven at the last
//! check), `failing` (proven once, not at the last check: still served with the certificate it
//! has until that expires, but no new one is ordered).

use crate::model::Verification;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the `txt` record lives: `_pushleft-challenge.<hostname>`.
pub const TXT_LABEL: &str = "_pushleft-challenge";

/// A domain's state, as the ledger and `pl domains` spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainState {
    Pending,
    Verified,
    Failing,
}

impl DomainState {
    pub fn as_str(self) -> &'static str {
        match self {
            DomainState::Pending => "pending",
            DomainState::Verified => "verified",
            DomainState::Failing => "failing",
        }
    }

    pub fn parse(s: &str) -> DomainState {
        match s {
            "verified" => DomainState::Verified,
            "failing" => DomainState::Failing,
            _ => DomainState::Pending,
        }
    }
}

/// The record's name for a `txt` domain.
pub fn txt_name(hostname: &str) -> String {
    format!("{TXT_LABEL}.{hostname}")
}

/// The value a `txt` domain's record must hold: `pushleft-verify=` and 32 hex digits of the
/// SHA-256 of the control plane's id and the hostname.
pub fn txt_value(control_plane: &str, hostname: &str) -> String {
    let digest = Sha256::digest(format!("pushleft-domain\0{control_plane}\0{hostname}").as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("pushleft-verify={hex}")
}

/// What the resolver answered for the record a domain needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The TXT strings at the record's name (none: the name has no TXT record).
    Txt(Vec<String>),
    /// The CNAME target of the hostname (`None`: it is no CNAME).
    Cname(Option<String>),
    /// No answer (a timeout, a refusal): not proof either way.
    Unanswered(String),
}

/// What a domain needs in DNS: (record type, name, value).
pub fn wanted_record(
    method: Verification,
    control_plane: &str,
    hostname: &str,
    own: Option<&str>,
) -> (&'static str, String, String) {
    match method {
        Verification::Txt => ("TXT", txt_name(hostname), txt_value(control_plane, hostname)),
        Verification::Cname => (
            "CNAME",
            hostname.to_owned(),
            own.unwrap_or("(the environment has no hostname)").to_owned(),
        ),
    }
}

/// Whether `answer` proves the domain: `Ok` with what was seen, or `Err` with what is missing
/// and what was seen instead. `own` is the environment's own hostname (the `cname` target).
pub fn judge(
    method: Verification,
    control_plane: &str,
    hostname: &str,
    own: Option<&str>,
    answer: &Answer,
) -> Result<String, String> {
    let (kind, name, value) = wanted_record(method, control_plane, hostname, own);
    let missing = |seen: String| format!("{kind} {name} must be {value:?}; seen: {seen}");
    match (method, answer) {
        (_, Answer::Unanswered(why)) => Err(missing(format!("no answer ({why})"))),
        (Verification::Txt, Answer::Txt(values)) => {
            if values.iter().any(|v| v.trim() == value) {
                Ok(format!("TXT {value:?}"))
            } else if values.is_empty() {
                Err(missing("no TXT record".into()))
            } else {
                Err(missing(bounded(&values.join(", "))))
            }
        }
        (Verification::Cname, Answer::Cname(target)) => {
            let target = target.as_deref().map(|t| t.trim_end_matches('.').to_ascii_lowercase());
            match (target, own) {
                (Some(t), Some(o)) if t == o => Ok(format!("CNAME {t}")),
                (Some(t), _) => Err(missing(format!("CNAME {}", bounded(&t)))),
                (None, _) => Err(missing("no CNAME record".into())),
            }
        }
        (Verification::Txt, Answer::Cname(_)) | (Verification::Cname, Answer::Txt(_)) => {
            Err(missing("an answer of another type".into()))
        }
    }
}

/// What a resolver answered, cut to what a person reads (an answer is not ours to trust).
fn bounded(s: &str) -> String {
    let clean: String = s.chars().filter(|c| !c.is_control()).take(200).collect();
    if s.chars().count() > 200 {
        format!("{clean}…")
    } else {
        clean
    }
}

/// Where a domain goes after a check: proven → verified; not proven → pending if it never
/// was, failing if it was. An unanswered check changes nothing (a resolver down is not a
/// domain gone).
pub fn next_state(now: DomainState, ever_verified: bool, proven: Result<(), ()>, answered: bool) -> DomainState {
    match (proven, answered) {
        (Ok(()), _) => DomainState::Verified,
        (Err(()), false) => now,
        (Err(()), true) if ever_verified => DomainState::Failing,
        (Err(()), true) => DomainState::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txt_values_are_per_control_plane_and_hostname() {
        let v = txt_value("0123abcd", "shop.example.org");
        assert!(
            v.starts_with("pushleft-verify=") && v.len() == "pushleft-verify=".len() + 32,
            "{v}"
        );
        assert_eq!(v, txt_value("0123abcd", "shop.example.org"), "stable");
        assert_ne!(v, txt_value("4567cdef", "shop.example.org"), "another control plane");
        assert_ne!(v, txt_value("0123abcd", "www.example.org"), "another hostname");
        assert_eq!(txt_name("shop.example.org"), "_pushleft-challenge.shop.example.org");
    }

    #[test]
    fn answers_prove_or_say_what_is_missing_and_what_was_seen() {
        let (cp, host, own) = ("0123abcd", "shop.example.org", Some("api.example.com"));
        let good = txt_value(cp, host);
        let txt = |v: &[&str]| Answer::Txt(v.iter().map(|s| s.to_string()).collect());
        assert!(judge(Verification::Txt, cp, host, own, &txt(&["other", &good])).is_ok());
        let e = judge(Verification::Txt, cp, host, own, &txt(&[])).expect_err("none");
        assert!(
            e.contains("_pushleft-challenge.shop.example.org") && e.contains(&good) && e.contains("no TXT record"),
            "{e}"
        );
        let e = judge(Verification::Txt, cp, host, own, &txt(&["pushleft-verify=stale"])).expect_err("stale");
        assert!(e.contains("seen: pushleft-verify=stale"), "{e}");
        let cname = |t: Option<&str>| Answer::Cname(t.map(str::to_owned));
        assert!(judge(Verification::Cname, cp, host, own, &cname(Some("API.example.com."))).is_ok());
        let e = judge(Verification::Cname, cp, host, own, &cname(Some("evil.example.net."))).expect_err("elsewhere");
        assert!(
            e.contains("CNAME evil.example.net") && e.contains("api.example.com"),
            "{e}"
        );
        assert!(
            judge(Verification::Cname, cp, host, None, &cname(Some("api.example.com"))).is_err(),
            "no own hostname"
        );
        let e = judge(
            Verification::Txt,
            cp,
            host,
            own,
            &Answer::Unanswered("timed out".into()),
        )
        .expect_err("no answer");
        assert!(e.contains("no answer (timed out)"), "{e}");
        let long = "x".repeat(5000);
        assert!(
            judge(Verification::Txt, cp, host, own, &txt(&[&long]))
                .expect_err("long")
                .len()
                < 400
        );
    }

    #[test]
    fn states_follow_the_checks() {
        use DomainState::*;
        assert_eq!(next_state(Pending, false, Err(()), true), Pending);
        assert_eq!(next_state(Pending, false, Ok(()), true), Verified);
        assert_eq!(next_state(Verified, true, Err(()), true), Failing);
        assert_eq!(
            next_state(Verified, true, Err(()), false),
            Verified,
            "a resolver down changes nothing"
        );
        assert_eq!(next_state(Failing, true, Ok(()), true), Verified);
        for s in [Pending, Verified, Failing] {
            assert_eq!(DomainState::parse(s.as_str()), s);
        }
    }
}
