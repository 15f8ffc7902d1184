//! Diagnostics: every problem found in a state tree, with where it is and a stable code.
//!
//! Codes are part of Pushleft's interface: tests assert them and `docs/diagnostics.md` lists
//! them, so a code is never renamed, only added.

use serde::Serialize;
use std::fmt;

/// A position in a source file: 1-based line and column (columns count characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
pub struct Pos {
    pub line: u32,
    pub column: u32,
}

macro_rules! codes {
    ($($variant:ident => $text:literal, $doc:literal;)*) => {
        /// A stable, kebab-case problem code.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code { $(#[doc = $doc] $variant,)* }

        impl Code {
            /// Every code, in declaration order (used by docs and tests).
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code as printed and serialised.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $text,)* }
            }

            /// One line saying what the code means.
            pub fn describe(self) -> &'static str {
                match self { $(Code::$variant => $doc,)* }
            }
        }
    };
}

codes! {
    FileTooLarge => "file-too-large", "A state file is larger than 1 MiB.";
    TooManyDocuments => "too-many-documents", "A file holds more than 10,000 YAML documents.";
    TooManyFiles => "too-many-files", "The state tree holds more than 100,000 YAML files.";
    TreeTooLarge => "tree-too-large", "The YAML files of the state tree add up to more than 256 MiB.";
    AliasLimit => "alias-limit", "YAML aliases expand to more than 10,000 nodes in one file, or anchors copy more than 100,000.";
    NestingTooDeep => "nesting-too-deep", "YAML nesting is deeper than 64 levels.";
    TooManyNodes => "too-many-nodes", "A file holds more than 250,000 YAML nodes (alias expansions included).";
    LookaheadLimit => "lookahead-limit", "Parsing would read more than 128 KiB past the last node: one value, a run of comments, or a flow collection where a key could start, is that long.";
    TreeTooDeep => "tree-too-deep", "Folders of the state tree nest deeper than 32 levels.";
    InvalidUtf8 => "invalid-utf8", "A state file is not valid UTF-8.";
    YamlSyntax => "yaml-syntax", "The file is not well-formed YAML.";
    UnsupportedTag => "unsupported-tag", "A YAML tag other than the core schema's (`!!str`, `!!int`, ...).";
    SymlinkInTree => "symlink-in-tree", "A symbolic link inside the state tree.";
    NotARegularFile => "not-a-regular-file", "A submodule, device, socket or other non-regular file inside the state tree.";
    DuplicateKey => "duplicate-key", "The same key twice in one YAML mapping.";
    UnknownApiVersion => "unknown-api-version", "`apiVersion` is not `pushleft.dev/v1alpha1`.";
    UnknownKind => "unknown-kind", "`kind` is not one of Pushleft's kinds.";
    UnknownField => "unknown-field", "A field that the kind does not have.";
    MissingField => "missing-field", "A required field is absent.";
    WrongType => "wrong-type", "A value of the wrong YAML type (a string where a number belongs, ...).";
    InvalidValue => "invalid-value", "A value outside the allowed set (an enum, a pattern).";
    OutOfRange => "out-of-range", "A number outside its allowed range.";
    FieldNotAllowed => "field-not-allowed", "A field that does not apply in this context (a schedule on a web role, ...).";
    InvalidName => "invalid-name", "A name that is not a lowercase RFC 1123 label.";
    DuplicateName => "duplicate-name", "Two objects of one kind (or two nodes) with the same name.";
    InvalidAddress => "invalid-address", "A node `address` no other node could reach: unspecified, loopback, multicast, broadcast, IPv6 link-local, or inside the environments' subnet pool `10.208.0.0/12`.";
    DuplicateAddress => "duplicate-address", "Two nodes with the same `address`: the mesh would send one node's traffic to the other.";
    DanglingReference => "dangling-reference", "A reference to a project, environment, pool, role or secret that does not exist.";
    ImageNotPinned => "image-not-pinned", "An image that is not pinned by digest (`name@sha256:<64 hex>`).";
    ImageSignatureInvalid => "image-signature-invalid", "A file under `image-signatures/` that is not named `sha256-<64 hex>.sig` or holds anything but SSH signature blocks, or (with trusted keys) a signature that does not verify over its digest in namespace `pushleft-image`.";
    ImageUnsigned => "image-unsigned", "With a policy whose `images` rules refuse unsigned images for a project, one of its images has no signature in `image-signatures/`.";
    ImageSignerUntrusted => "image-signer-untrusted", "An image of a project with `images` rules is signed only by keys that none of those rules trusts.";
    InvalidPort => "invalid-port", "A port outside 1-65535, a role's `ports` listing one twice (or its web `port`), or more than 16.";
    InvalidVolume => "invalid-volume", "A volume whose path is not absolute, clean and the role's own, a name two roles declare, or more than 8 on a role.";
    InvalidBackup => "invalid-backup", "A volume's `backup` (schedule, keep, command) or an Environment's `backups` (repository, secret) that is malformed.";
    BackupRepositoryMissing => "backup-repository-missing", "An Environment whose project backs up a volume, with no `backups` repository.";
    BackupSecretIncomplete => "backup-secret-incomplete", "An Environment's `backups.secret` names a Secret without `RESTIC_PASSWORD`.";
    VolumeOneWriter => "volume-one-writer", "A role with a volume (or a service role) given more than one replica: a volume has one writer.";
    InvalidQuantity => "invalid-quantity", "A CPU or memory quantity in the wrong unit or form.";
    InvalidCron => "invalid-cron", "A cron schedule that is not five valid fields.";
    InvalidHostname => "invalid-hostname", "A hostname that is not RFC 1123.";
    HostnameConflict => "hostname-conflict", "Two environments or domains resolve to the same hostname.";
    DomainUnderManagedZone => "domain-under-managed-zone", "A Domain under `baseDomain` or `previewDomain`, which Pushleft derives itself.";
    MissingRepository => "missing-repository", "No `Repository` document in `pushleft.yaml`.";
    DuplicateRepository => "duplicate-repository", "More than one `Repository` document.";
    MisplacedRepository => "misplaced-repository", "A `Repository` document outside the root `pushleft.yaml`.";
    InvalidGlob => "invalid-glob", "A glob pattern that does not parse.";
    InvalidSecret => "invalid-secret", "A secret value that is not ASCII-armoured age ciphertext, or a recipient that is not a key.";
    TlsSecretIncomplete => "tls-secret-incomplete", "An Environment's or Domain's `tls.secret` names a Secret without both `CERT` and `KEY`.";
    SecretControlKeyMissing => "secret-control-key-missing", "A Secret that does not list the Repository's `controlRecipient` (or there is none), so the control host could not deliver it.";
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One problem. Messages never contain secret values: validation only ever sees ciphertext,
/// and messages quote names and keys, not values of secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    /// Path relative to the state tree's root, with `/` separators.
    pub file: String,
    /// `None` for problems of a whole file (size, symlink, ...).
    pub line: Option<u32>,
    pub column: Option<u32>,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn error(code: Code, file: &str, pos: Option<Pos>, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            file: file.to_owned(),
            line: pos.map(|p| p.line),
            column: pos.map(|p| p.column),
            message: message.into(),
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The order diagnostics are reported in: by file, then position, then code.
    pub fn sort_key(&self) -> (&str, u32, u32, Code, &str) {
        (
            &self.file,
            self.line.unwrap_or(0),
            self.column.unwrap_or(0),
            self.code,
            &self.message,
        )
    }
}

/// Sorts diagnostics into their reporting order and drops exact repeats.
pub fn sort_diagnostics(diags: &mut Vec<Diagnostic>) {
    diags.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    diags.dedup();
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{}:{}: ", self.file, l, c)?,
            _ => write!(f, "{}: ", self.file)?,
        }
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{sev}[{}]: {}", self.code, self.message)?;
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_kebab_case() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Code::ALL {
            let s = c.as_str();
            assert!(seen.insert(s), "duplicate code {s}");
            assert!(
                s.chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-'),
                "{s}"
            );
        }
    }

    #[test]
    fn display_includes_position_and_hint() {
        let d = Diagnostic::error(
            Code::UnknownField,
            "a.yaml",
            Some(Pos { line: 3, column: 5 }),
            "unknown field `replica`",
        )
        .with_hint("did you mean `replicas`?");
        assert_eq!(
            d.to_string(),
            "a.yaml:3:5: error[unknown-field]: unknown field `replica`\n  hint: did you mean `replicas`?"
        );
    }
}
