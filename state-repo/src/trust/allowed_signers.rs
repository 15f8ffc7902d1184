//! Git's allowed-signers file (`gpg.ssh.allowedSignersFile`, the `ssh-keygen -Y` format):
//! one key per line, `principals [options] keytype base64 [comment]`.
//!
//! Options Pushleft honours: `namespaces="git,..."`, `valid-after="YYYYMMDD[HHMM[SS]][Z]"`,
//! `valid-before=...`. `cert-authority` lines are refused: Pushleft trusts keys, not CAs.

use ssh_key::PublicKey;

/// Largest allowed-signers file read, in bytes.
pub const MAX_FILE_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("allowed-signers file is {0} bytes; the limit is 1 MiB")]
    TooLarge(usize),
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
}

/// One trusted key and what it may sign.
#[derive(Clone, Debug)]
pub struct AllowedSigner {
    /// Principal patterns (`alice@example.com`, `ops-*`), as written.
    pub principals: Vec<String>,
    /// Namespaces the key may sign in; empty means any.
    pub namespaces: Vec<String>,
    /// Seconds since the epoch (UTC, or local time when the file did not say `Z`; Pushleft
    /// reads both as UTC, as a server in UTC does).
    pub valid_after: Option<i64>,
    pub valid_before: Option<i64>,
    pub key: PublicKey,
    /// 1-based line in the file, for messages.
    pub line: usize,
}

impl AllowedSigner {
    /// True when `principal` matches one of this key's principal patterns.
    pub fn allows_principal(&self, principal: &str) -> bool {
        self.principals.iter().any(|p| wildcard_match(p, principal))
    }
}

/// `*` and `?` wildcards, as OpenSSH's `match_pattern` (no negation here).
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Splits the next whitespace-separated field, honouring double quotes (as OpenSSH does for
/// principals and options). The quotes stay in the field: options split on the commas
/// outside them.
fn next_field(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if s.is_empty() {
        return None;
    }
    let mut quoted = false;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return Some((&s[..i], &s[i..])),
            _ => {}
        }
    }
    Some((s, ""))
}

/// Splits on commas outside double quotes, as OpenSSH's option parser does
/// (`namespaces="git,file",valid-after=20240101`).
fn split_unquoted_commas(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut quoted, mut start) = (false, 0);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn unquote(s: &str) -> String {
    s.replace('"', "")
}

/// `YYYYMMDD[HHMM[SS]][Z]` as seconds since the epoch (UTC).
pub fn parse_time(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix('z')).unwrap_or(s);
    if !s.bytes().all(|c| c.is_ascii_digit()) || !matches!(s.len(), 8 | 12 | 14) {
        return None;
    }
    let n = |a: usize, b: usize| s[a..b].parse::<i64>().ok();
    let (y, m, d) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (hh, mm, ss) = if s.len() >= 12 {
        (n(8, 10)?, n(10, 12)?, if s.len() == 14 { n(12, 14)? } else { 0 })
    } else {
        (0, 0, 0)
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parses a whole file; every bad line is an error (a trust file is not the place to guess).
pub fn parse(text: &str) -> Result<Vec<AllowedSigner>, ParseError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(ParseError::TooLarge(text.len()));
    }
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| ParseError::Line { line, message };
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (principals, rest) = next_field(trimmed).ok_or_else(|| err("no principals".into()))?;
        let mut rest = rest;
        let mut namespaces = Vec::new();
        let (mut valid_after, mut valid_before) = (None, None);
        // Options come before the key type; a key type starts with `ssh-`, `ecdsa-` or `sk-`.
        let key_text = loop {
            let (field, after) = next_field(rest).ok_or_else(|| err("no key".into()))?;
            if field.starts_with("ssh-") || field.starts_with("ecdsa-") || field.starts_with("sk-") {
                break rest.trim_start().to_owned();
            }
            for opt in split_unquoted_commas(field) {
                let (name, value) = opt.split_once('=').unwrap_or((opt, ""));
                let value = unquote(value);
                let value = value.as_str();
                match name.to_ascii_lowercase().as_str() {
                    "namespaces" => namespaces.extend(value.split(',').map(str::to_owned)),
                    "valid-after" => {
                        valid_after = Some(
                            parse_time(value)
                                .ok_or_else(|| err(format!("valid-after `{value}` is not YYYYMMDD[HHMM[SS]][Z]")))?,
                        )
                    }
                    "valid-before" => {
                        valid_before = Some(
                            parse_time(value)
                                .ok_or_else(|| err(format!("valid-before `{value}` is not YYYYMMDD[HHMM[SS]][Z]")))?,
                        )
                    }
                    "cert-authority" => {
                        return Err(err("cert-authority is not supported; list the keys themselves".into()));
                    }
                    other => return Err(err(format!("unknown option `{other}`"))),
                }
            }
            rest = after;
        };
        let key = PublicKey::from_openssh(&key_text).map_err(|e| err(format!("key does not parse: {e}")))?;
        out.push(AllowedSigner {
            principals: unquote(principals)
                .split(',')
                .map(str::to_owned)
                .filter(|p| !p.is_empty())
                .collect(),
            namespaces,
            valid_after,
            valid_before,
            key,
            line,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard_match("ops-*", "ops-alice"));
        assert!(wildcard_match("*@example.com", "a@example.com"));
        assert!(wildcard_match("a?c", "abc"));
        assert!(!wildcard_match("ops-*", "dev-bob"));
        assert!(wildcard_match("*", ""));
    }

    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPNxRWh2RdKDYTXN/0QFtuDCWrwIF/CGATHI62lddb6l";

    #[test]
    fn quoted_option_lists_parse_as_git_parses_them() {
        let text = format!(
            "ops-alice namespaces=\"git,file\",valid-after=\"20240101\" {KEY}\n\"a@x,b@y\" namespaces=\"git\" {KEY} c\n"
        );
        let signers = parse(&text).expect("git accepts these lines");
        assert_eq!(signers[0].namespaces, ["git", "file"]);
        assert_eq!(signers[0].valid_after, parse_time("20240101"));
        assert_eq!(signers[0].principals, ["ops-alice"]);
        assert_eq!(signers[1].principals, ["a@x", "b@y"]);
        assert_eq!(signers[1].namespaces, ["git"]);
        let bad = parse(&format!("ops namespaces=\"git\",nonsense {KEY}\n")).expect_err("unknown option");
        assert!(bad.to_string().contains("unknown option `nonsense`"), "{bad}");
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("19700101"), Some(0));
        assert_eq!(parse_time("20000301Z"), Some(951_868_800));
        assert_eq!(parse_time("202001020304"), Some(1_577_934_240));
        assert_eq!(parse_time("20200102030405Z"), Some(1_577_934_245));
        assert_eq!(parse_time("2020"), None);
        assert_eq!(parse_time("20201301"), None);
    }
}
