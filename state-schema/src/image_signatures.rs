//! Image signatures in the state tree: `image-signatures/sha256-<64 hex>.sig`, each holding one
//! or more armored SSH signatures (as `ssh-keygen -Y sign` writes them) over that digest.
//! Here they are only read as text and kept by digest; whether they verify, and whose keys
//! made them, is `pushleft-image-trust`'s to say (this crate does no cryptography).
//!
//! They live in Git beside the YAML (not as OCI referrers in a registry) so that one signed
//! commit says both what runs and the proof that it may, `pl validate` sees them offline, a
//! rollback carries the signatures its generation was checked with, and a node gets them over
//! the control plane's mutual TLS with its task, without asking a registry for referrers.

use crate::diag::{Code, Diagnostic, Pos};

/// The folder, at the state tree's root.
pub const DIR: &str = "image-signatures/";

/// Most signatures one file may hold.
pub const MAX_SIGNATURES: usize = 16;

/// Largest armored signature, in bytes (an RSA-4096 one is under 2 KiB).
pub const MAX_SIGNATURE_BYTES: usize = 8 * 1024;

const BEGIN: &str = "-----BEGIN SSH SIGNATURE-----";
const END: &str = "-----END SSH SIGNATURE-----";

/// Whether a path of the tree is a signature file: a `.sig` file anywhere below [`DIR`]
/// (one in a sub-folder, or with another name, is listed so that it is refused, not ignored).
pub fn is_signature_path(path: &str) -> bool {
    path.starts_with(DIR) && path.ends_with(".sig")
}

/// The digest a signature file's name says (`image-signatures/sha256-<hex>.sig`).
pub fn digest_of_path(path: &str) -> Option<String> {
    let hex = path.strip_prefix(DIR)?.strip_prefix("sha256-")?.strip_suffix(".sig")?;
    (hex.len() == 64 && hex.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
        .then(|| format!("sha256:{hex}"))
}

/// The path the signatures of `digest` are kept at.
pub fn path_of(digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:")?;
    Some(format!("{DIR}sha256-{hex}.sig"))
}

/// The armored signature blocks in `text`, each with the 1-based line it starts on. Text
/// outside blocks is an error with its line: a file is all signatures, or refused.
pub fn blocks(text: &str) -> Result<Vec<(u32, String)>, (u32, String)> {
    let mut out = Vec::new();
    let mut open: Option<(u32, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let line = line.trim_end_matches('\r');
        match &mut open {
            None if line.trim().is_empty() => {}
            None if line == BEGIN => open = Some((n, format!("{line}\n"))),
            None => {
                let shown: String = line.chars().take(40).collect();
                return Err((n, format!("`{shown}` is outside a signature block")));
            }
            Some((start, block)) => {
                block.push_str(line);
                block.push('\n');
                if block.len() > MAX_SIGNATURE_BYTES {
                    return Err((
                        *start,
                        format!("a signature is larger than {MAX_SIGNATURE_BYTES} bytes"),
                    ));
                }
                if line == END {
                    out.push((*start, std::mem::take(block)));
                    open = None;
                    if out.len() > MAX_SIGNATURES {
                        return Err((n, format!("more than {MAX_SIGNATURES} signatures in one file")));
                    }
                }
            }
        }
    }
    match open {
        Some((start, _)) => Err((start, format!("a signature block is never closed by `{END}`"))),
        None => Ok(out),
    }
}

/// What one signature file holds (its digest and blocks, each with its line), or what is wrong
/// with it. `parse::parse_file` calls it for paths [`is_signature_path`] accepts.
pub fn read_signature_file(path: &str, bytes: &[u8]) -> Result<(String, Vec<(u32, String)>), Diagnostic> {
    let hint = "name it image-signatures/sha256-<64 hex>.sig and fill it with `pl image sign` or `ssh-keygen -Y sign -n pushleft-image`";
    let refuse = |line: Option<u32>, message: &str| {
        Diagnostic::error(
            Code::ImageSignatureInvalid,
            path,
            line.map(|line| Pos { line, column: 1 }),
            message,
        )
        .with_hint(hint)
    };
    let Some(digest) = digest_of_path(path) else {
        return Err(refuse(
            None,
            "a signature file's name is not `sha256-<64 lowercase hex>.sig` directly in image-signatures/",
        ));
    };
    let text = std::str::from_utf8(bytes).map_err(|_| refuse(None, "not UTF-8 text"))?;
    match blocks(text) {
        Ok(found) if found.is_empty() => Err(refuse(None, "holds no signature")),
        Ok(found) => Ok((digest, found)),
        Err((line, message)) => Err(refuse(Some(line), &message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: &str = "-----BEGIN SSH SIGNATURE-----\nU1NIU0lHAAAAAQ==\n-----END SSH SIGNATURE-----\n";
    const HEX: &str = "5b0bcabd1ed22e9fb1310cf6c2dec7cdef19f0ad69efa1f392e94a4333501270";

    #[test]
    fn files_hold_blocks_and_nothing_else() {
        let two = format!("{BLOCK}\n{BLOCK}");
        let found = blocks(&two).expect("two blocks");
        assert_eq!(found.iter().map(|b| b.0).collect::<Vec<_>>(), [1, 5]);
        assert_eq!(found[0].1, BLOCK);
        let (line, why) = blocks(&format!("{BLOCK}trailing words\n")).expect_err("junk");
        assert_eq!(line, 4);
        assert!(why.contains("outside a signature block"), "{why}");
        assert!(
            blocks("-----BEGIN SSH SIGNATURE-----\nAAAA\n")
                .expect_err("open")
                .1
                .contains("never closed")
        );
        assert!(blocks(&BLOCK.repeat(MAX_SIGNATURES + 1)).is_err());
        let big = format!("-----BEGIN SSH SIGNATURE-----\n{}\n", "A".repeat(MAX_SIGNATURE_BYTES));
        assert!(blocks(&big).expect_err("big").1.contains("larger"));
    }

    #[test]
    fn names_say_the_digest() {
        let path = format!("image-signatures/sha256-{HEX}.sig");
        assert!(is_signature_path(&path));
        assert_eq!(digest_of_path(&path), Some(format!("sha256:{HEX}")));
        assert_eq!(path_of(&format!("sha256:{HEX}")), Some(path.clone()));
        let ok = read_signature_file(&path, BLOCK.as_bytes()).expect("read");
        assert_eq!(ok.1, vec![(1, BLOCK.to_owned())]);
        for bad in ["image-signatures/api.sig", "image-signatures/x/sha256-00.sig"] {
            assert!(is_signature_path(bad));
            let e = read_signature_file(bad, BLOCK.as_bytes()).expect_err(bad);
            assert_eq!(e.code, Code::ImageSignatureInvalid, "{bad}");
        }
        let junk = read_signature_file(&path, b"hello\n").expect_err("junk");
        assert_eq!(junk.line, Some(1));
        assert!(!is_signature_path("projects/api.sig") && !is_signature_path("image-signatures/a.yaml"));
    }
}
