//! Validated value types: names, hostnames, pinned images, quantities, cron schedules.
//!
//! Each has a private field and a validating constructor, so a value that exists is valid;
//! the `Err` side is a message and hint for the diagnostic the decoder reports.

use serde::{Serialize, Serializer};
use std::fmt;

/// Why a value was refused: a message and an optional hint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub message: String,
    pub hint: Option<String>,
}

impl Invalid {
    fn new(message: impl Into<String>) -> Self {
        Invalid {
            message: message.into(),
            hint: None,
        }
    }
    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// The pool environments' subnets are cut from on every node (`10.208.0.0/12`, a /24 each):
/// a node address inside it would be routed into an environment instead of to the node.
pub const SUBNET_POOL: (core::net::Ipv4Addr, u8) = (core::net::Ipv4Addr::new(10, 208, 0, 0), 12);

/// Why no other node could reach a node at `ip` over the mesh, if so: an address of no host
/// (unspecified, multicast, broadcast), one every host has for itself (loopback), an IPv6
/// link-local one (unusable without an interface), or one inside the environments' own subnet
/// pool. IPv4-mapped IPv6 addresses are judged as their IPv4 address.
pub fn unreachable_node_address(ip: core::net::IpAddr) -> Option<Invalid> {
    use core::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let why = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => "is unspecified (no host has it)",
        IpAddr::V4(v4) if v4.is_loopback() => "is a loopback address (every host has it for itself)",
        IpAddr::V4(v4) if v4.is_multicast() => "is a multicast address",
        IpAddr::V4(v4) if v4.is_broadcast() => "is the broadcast address",
        IpAddr::V4(v4) if u32::from(v4) >> (32 - SUBNET_POOL.1) == u32::from(SUBNET_POOL.0) >> (32 - SUBNET_POOL.1) => {
            "is inside the environments' subnet pool 10.208.0.0/12"
        }
        IpAddr::V6(v6) if v6.is_unspecified() => "is unspecified (no host has it)",
        IpAddr::V6(v6) if v6.is_loopback() => "is a loopback address (every host has it for itself)",
        IpAddr::V6(v6) if v6.is_multicast() => "is a multicast address",
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            "is an IPv6 link-local address (it needs an interface no other node shares)"
        }
        _ => return None,
    };
    Some(
        Invalid::new(format!("node `address` {ip} {why}"))
            .hint("write the address other nodes reach this one at over the network, e.g. 203.0.113.5"),
    )
}

macro_rules! string_newtype {
    ($name:ident) => {
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::from_text(&s).map_err(|e| serde::de::Error::custom(e.message))
            }
        }
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
    };
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub use crate::small_map::SmallMap;

/// An object, role or node name: a lowercase RFC 1123 label (it ends up in hostnames,
/// container names and nftables table names).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(String);
string_newtype!(Name);

impl Name {
    fn from_text(s: &str) -> Result<Self, Invalid> {
        Name::new(s)
    }

    /// The least name, for range bounds only; not a valid name.
    pub(crate) const MIN: Name = Name(String::new());

    pub fn new(s: &str) -> Result<Self, Invalid> {
        if is_label(s) {
            return Ok(Name(s.to_owned()));
        }
        let suggestion = flatten_label(s);
        let inv = Invalid::new(format!(
            "`{s}` is not a valid name: use 1-63 lowercase letters, digits and `-`, not starting or ending with `-`"
        ));
        Err(if suggestion.is_empty() || suggestion == s {
            inv
        } else {
            inv.hint(format!("try `{suggestion}`"))
        })
    }
}

/// A DNS hostname per RFC 1123: dot-separated labels, 253 characters at most, lowercase.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hostname(String);
string_newtype!(Hostname);

impl Hostname {
    fn from_text(s: &str) -> Result<Self, Invalid> {
        Hostname::new(s)
    }

    pub fn new(s: &str) -> Result<Self, Invalid> {
        let ok = !s.is_empty() && s.len() <= 253 && s.split('.').all(is_label);
        if ok {
            return Ok(Hostname(s.to_owned()));
        }
        let inv = Invalid::new(format!("`{s}` is not an RFC 1123 hostname"));
        Err(if s.chars().any(|c| c.is_ascii_uppercase()) {
            inv.hint(format!("hostnames are lowercase: `{}`", s.to_ascii_lowercase()))
        } else if s.ends_with('.') {
            inv.hint("drop the trailing dot")
        } else {
            inv.hint("labels are 1-63 of a-z, 0-9 and `-`, not starting or ending with `-`; 253 characters in all")
        })
    }

    /// True when `self` equals `zone` or lies below it.
    pub fn is_within(&self, zone: &Hostname) -> bool {
        self.0 == zone.0 || self.0.ends_with(&format!(".{}", zone.0))
    }
}

/// Maps any string onto one DNS label: lowercase, runs of other characters become one `-`,
/// no leading or trailing `-`. May be empty or longer than 63; see [`derive_label`].
pub fn flatten_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}

/// One DNS label made from free text: flattened, and when longer than 63 characters cut to 54
/// with `-` and 8 hex digits of the SHA-256 of the original text appended, so two long names
/// that share a prefix still get different, stable labels.
pub fn derive_label(s: &str) -> String {
    use sha2::{Digest, Sha256};
    let flat = flatten_label(s);
    if !flat.is_empty() && flat.len() <= 63 {
        return flat;
    }
    let digest = Sha256::digest(s.as_bytes());
    let suffix = hex::encode(&digest[..4]);
    let mut head: String = flat.chars().take(54).collect();
    while head.ends_with('-') {
        head.pop();
    }
    if head.is_empty() {
        format!("x-{suffix}")
    } else {
        format!("{head}-{suffix}")
    }
}

/// A container image pinned by digest: `name@sha256:<64 lowercase hex>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ImageRef(String);
string_newtype!(ImageRef);

impl ImageRef {
    fn from_text(s: &str) -> Result<Self, Invalid> {
        ImageRef::new(s)
    }

    pub fn new(s: &str) -> Result<Self, Invalid> {
        let Some((name, digest)) = s.split_once('@') else {
            return Err(Invalid::new(format!("image `{s}` is not pinned by digest"))
                .hint("pin it: `name@sha256:<64 hex>`, for example from `docker buildx imagetools inspect`"));
        };
        let hex = digest.strip_prefix("sha256:");
        let hex_ok =
            hex.is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-/:".contains(&c));
        if !name_ok {
            return Err(Invalid::new(format!("image name `{name}` is not a valid reference")));
        }
        if !hex_ok {
            return Err(Invalid::new(format!(
                "image digest `{digest}` is not `sha256:` and 64 lowercase hex digits"
            ))
            .hint("pin it: `name@sha256:<64 hex>`"));
        }
        Ok(ImageRef(s.to_owned()))
    }
}

/// CPU in millicores. Written `500m` or as cores (`2`, `0.5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cpu(u64);

impl Cpu {
    pub fn millis(self) -> u64 {
        self.0
    }
    pub fn from_millis(m: u64) -> Self {
        Cpu(m)
    }

    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let wrong = || {
            Invalid::new(format!("`{s}` is not a CPU quantity")).hint("write millicores (`500m`) or cores (`2`, `0.5`)")
        };
        let m = if let Some(milli) = s.strip_suffix('m') {
            parse_decimal_scaled(milli, 1).ok_or_else(wrong)?
        } else {
            parse_decimal_scaled(s, 1000).ok_or_else(wrong)?
        };
        if m == 0 {
            return Err(Invalid::new(format!("CPU `{s}` is zero or below a millicore")));
        }
        Ok(Cpu(m))
    }
}

impl fmt::Display for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

/// Memory in bytes. Written with a binary (`Ki`, `Mi`, `Gi`, `Ti`) or decimal (`k`, `M`, `G`,
/// `T`) suffix, or as plain bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Memory(u64);

impl Memory {
    pub fn bytes(self) -> u64 {
        self.0
    }
    pub fn from_bytes(b: u64) -> Self {
        Memory(b)
    }

    pub fn parse(s: &str) -> Result<Self, Invalid> {
        const UNITS: &[(&str, u64)] = &[
            ("Ki", 1 << 10),
            ("Mi", 1 << 20),
            ("Gi", 1 << 30),
            ("Ti", 1 << 40),
            ("k", 1_000),
            ("M", 1_000_000),
            ("G", 1_000_000_000),
            ("T", 1_000_000_000_000),
        ];
        let wrong = |extra: &str| {
            Invalid::new(format!("`{s}` is not a memory quantity{extra}"))
                .hint("write bytes with a unit: `512Mi`, `1Gi`, `256M`")
        };
        if s.ends_with('m') {
            return Err(wrong(" (`m` means thousandths, a CPU unit)"));
        }
        let (digits, scale) = UNITS
            .iter()
            .find_map(|(u, scale)| s.strip_suffix(u).map(|d| (d, *scale)))
            .unwrap_or((s, 1));
        let bytes = parse_decimal_scaled(digits, scale).ok_or_else(|| wrong(""))?;
        if bytes < (1 << 20) {
            return Err(Invalid::new(format!("memory `{s}` is below 1Mi")).hint("did you mean `Mi`?"));
        }
        Ok(Memory(bytes))
    }
}

impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, scale) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
            if self.0.is_multiple_of(scale) {
                return write!(f, "{}{unit}", self.0 / scale);
            }
        }
        write!(f, "{}", self.0)
    }
}

macro_rules! display_serialize {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}
display_serialize!(Cpu, Memory);

/// Parses a non-negative decimal (`1`, `0.25`) and multiplies by `scale`; `None` when it is not
/// such a number, overflows, or leaves a fraction after scaling.
fn parse_decimal_scaled(s: &str, scale: u64) -> Option<u64> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|c| c.is_ascii_digit()) || !frac.bytes().all(|c| c.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    let int_v: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int_v.checked_mul(scale)?;
    if !frac.is_empty() {
        let denom = 10u64.pow(frac.len() as u32);
        let num: u64 = frac.parse().ok()?;
        let scaled = num.checked_mul(scale)?;
        if scaled % denom != 0 {
            return None;
        }
        total = total.checked_add(scaled / denom)?;
    }
    Some(total)
}

/// A five-field cron schedule (minute hour day-of-month month day-of-week), validated field by
/// field; kept as written, with runs of blanks folded to one space.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CronSchedule(String);
string_newtype!(CronSchedule);

impl CronSchedule {
    fn from_text(s: &str) -> Result<Self, Invalid> {
        CronSchedule::parse(s)
    }

    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        if parts.len() != 5 {
            let hint = if s.trim_start().starts_with('@') {
                "macros like `@daily` are not accepted; write five fields, e.g. `0 0 * * *`"
            } else {
                "five fields: minute hour day-of-month month day-of-week, e.g. `*/15 * * * *`"
            };
            return Err(Invalid::new(format!("cron schedule `{s}` has {} fields, not 5", parts.len())).hint(hint));
        }
        for (part, field) in parts.iter().zip(CRON_FIELDS) {
            if let Err(m) = cron_field_mask(part, field) {
                return Err(Invalid::new(format!("cron {} field `{part}`: {m}", field.0)));
            }
        }
        Ok(CronSchedule(parts.join(" ")))
    }
}

/// A cron field: its name, its lowest and highest value, and the names that stand for values
/// from the lowest on.
pub(crate) type CronField = (&'static str, u32, u32, &'static [&'static str]);

/// The five fields in order.
pub(crate) const CRON_FIELDS: [CronField; 5] = [
    ("minute", 0, 59, &[]),
    ("hour", 0, 23, &[]),
    ("day of month", 1, 31, &[]),
    (
        "month",
        1,
        12,
        &[
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ],
    ),
    ("day of week", 0, 7, &["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
];

/// The values a field (`1,5-9,*/15`) selects, as bits; what validation and evaluation share.
pub(crate) fn cron_field_mask(part: &str, (_, lo, hi, names): CronField) -> Result<u64, String> {
    let mut mask = 0u64;
    for item in part.split(',') {
        mask |= cron_item_mask(item, lo, hi, names)?;
    }
    Ok(mask)
}

/// One item of a field: `*`, `n`, `a-b`, each with an optional `/step` (`n/step` runs from n
/// to the highest value, as in Vixie cron).
fn cron_item_mask(item: &str, lo: u32, hi: u32, names: &[&str]) -> Result<u64, String> {
    let (range, step) = match item.split_once('/') {
        Some((r, st)) => (r, Some(st)),
        None => (item, None),
    };
    if let Some(st) = step {
        match st.parse::<u32>() {
            Ok(n) if n >= 1 && n <= hi => {}
            _ => return Err(format!("step `{st}` is not 1-{hi}")),
        }
    }
    let value = |v: &str| -> Result<u32, String> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
            return Ok(lo + i as u32);
        }
        match v.parse::<u32>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(format!("`{v}` is not {lo}-{hi}")),
        }
    };
    let (from, to) = if range == "*" {
        (lo, hi)
    } else {
        match range.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (value(a)?, value(b)?);
                if a > b {
                    return Err(format!("range `{range}` runs backwards"));
                }
                (a, b)
            }
            None => {
                let a = value(range)?;
                (a, if step.is_some() { hi } else { a })
            }
        }
    };
    let every = step.and_then(|s| s.parse::<u32>().ok()).unwrap_or(1);
    Ok((from..=to).step_by(every as usize).fold(0, |m, v| m | (1u64 << v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_hostnames() {
        assert!(Name::new("web-1").is_ok());
        assert!(Name::new("Web").is_err());
        assert_eq!(
            Name::new("my_app").expect_err("bad").hint.as_deref(),
            Some("try `my-app`")
        );
        assert!(Name::new(&"a".repeat(64)).is_err());
        assert!(Hostname::new("api.example.com").is_ok());
        assert!(Hostname::new("-a.example.com").is_err());
        assert!(Hostname::new("a..b").is_err());
        assert!(Hostname::new("API.example.com").is_err());
        let z = Hostname::new("example.com").expect("valid");
        assert!(Hostname::new("a.example.com").expect("valid").is_within(&z));
        assert!(!Hostname::new("notexample.com").expect("valid").is_within(&z));
    }

    #[test]
    fn derived_labels() {
        assert_eq!(derive_label("feature/Login_page"), "feature-login-page");
        let long = format!("feature/{}", "x".repeat(80));
        let l = derive_label(&long);
        assert!(l.len() <= 63, "{l}");
        assert_eq!(l, derive_label(&long), "stable");
        assert_ne!(l, derive_label(&format!("{long}y")), "distinct");
        assert!(Name::new(&l).is_ok());
        assert!(Name::new(&derive_label("///")).is_ok());
    }

    #[test]
    fn images() {
        let d = "a".repeat(64);
        assert!(ImageRef::new(&format!("ghcr.io/acme/api@sha256:{d}")).is_ok());
        assert!(ImageRef::new("nginx:latest").is_err());
        assert!(ImageRef::new("nginx@sha256:abc").is_err());
        assert!(ImageRef::new(&format!("nginx@sha256:{}", "A".repeat(64))).is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(Cpu::parse("500m").map(Cpu::millis), Ok(500));
        assert_eq!(Cpu::parse("0.5").map(Cpu::millis), Ok(500));
        assert_eq!(Cpu::parse("2").map(|c| c.to_string()), Ok("2".into()));
        assert!(Cpu::parse("500Mi").is_err());
        assert!(Cpu::parse("0.0001").is_err());
        assert_eq!(Memory::parse("512Mi").map(|m| m.to_string()), Ok("512Mi".into()));
        assert_eq!(Memory::parse("1024Mi").map(|m| m.to_string()), Ok("1Gi".into()));
        assert_eq!(Memory::parse("256M").map(Memory::bytes), Ok(256_000_000));
        assert!(Memory::parse("512m").is_err());
        assert!(Memory::parse("512").is_err());
        assert!(Memory::parse("lots").is_err());
    }

    #[test]
    fn cron() {
        assert!(CronSchedule::parse("*/15 * * * *").is_ok());
        assert!(CronSchedule::parse("0 3 * * mon-fri").is_ok());
        assert!(CronSchedule::parse("0 0 1,15 * *").is_ok());
        assert_eq!(
            CronSchedule::parse("0  3 * *  *").map(|c| c.to_string()),
            Ok("0 3 * * *".into())
        );
        assert!(CronSchedule::parse("60 * * * *").is_err());
        assert!(CronSchedule::parse("* * * *").is_err());
        assert!(CronSchedule::parse("@daily").is_err());
        assert!(CronSchedule::parse("5-1 * * * *").is_err());
        assert!(CronSchedule::parse("*/0 * * * *").is_err());
    }
}
