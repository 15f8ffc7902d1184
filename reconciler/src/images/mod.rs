//! The control plane's own image store: `store.rs` (blobs on disk by digest, uploads, the
//! quota), and here the collection's decision, pure: which blobs nothing the ledger keeps
//! names. The HTTP surfaces are `http/registry.rs` (push and the agents' fetch); the use case
//! is `ops/images.rs`.

pub mod grants;
pub mod store;

use registry::oci::Digest;
use std::collections::BTreeSet;
use std::time::Duration;

/// The store's digests a text names as images (`pushleft.invalid/<name>@sha256:<hex>`).
pub fn named_in(text: &str) -> BTreeSet<Digest> {
    let prefix = format!("{}/", agent_proto::images::STORE_HOST);
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(&prefix) {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "._/-@:".contains(c)))
            .unwrap_or(tail.len());
        if let Some((_, d)) = agent_proto::images::in_store(&tail[..end])
            && let Some(d) = Digest::parse(d)
        {
            out.insert(d);
        }
        rest = &tail[prefix.len()..];
    }
    out
}

/// What a collection removes (`gone`) and how many unreferenced blobs it keeps for being
/// younger than `grace`: every held blob that no root names, directly or through the
/// manifests and indexes it reaches (`references` reads one held manifest; indexes nest at most
/// twice, as the spec's images do).
pub fn unreferenced(
    held: &[(Digest, u64, Duration)],
    roots: &BTreeSet<Digest>,
    references: impl Fn(&Digest) -> Vec<Digest>,
    grace: Duration,
) -> (Vec<(Digest, u64, Duration)>, u32) {
    let mut reachable: BTreeSet<Digest> = roots.clone();
    let mut frontier: Vec<Digest> = roots.iter().cloned().collect();
    for _ in 0..3 {
        let mut next = Vec::new();
        for d in &frontier {
            for r in references(d) {
                if reachable.insert(r.clone()) {
                    next.push(r);
                }
            }
        }
        frontier = next;
    }
    let mut young = 0;
    let gone = held
        .iter()
        .filter(|(d, _, _)| !reachable.contains(d))
        .filter(|(_, _, age)| {
            let old = *age >= grace;
            young += u32::from(!old);
            old
        })
        .cloned()
        .collect();
    (gone, young)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).expect("digest")
    }

    #[test]
    fn references_are_read_from_documents_and_specs() {
        let text = format!(
            r#"{{"image":"pushleft.invalid/web@{}","other":"registry.example.invalid/x@{}","cron":"pushleft.invalid/shop/job@{}"}}"#,
            d('a'),
            d('b'),
            d('c')
        );
        assert_eq!(named_in(&text), BTreeSet::from([d('a'), d('c')]));
        assert!(named_in("pushleft.invalid/web:latest pushleft.invalid/").is_empty());
    }

    #[test]
    fn what_a_root_reaches_stays_and_young_blobs_wait() {
        let hour = Duration::from_secs(3600);
        // a: manifest (root) → b, c; 1: index (root) → 2 → e; f: old, unreferenced; d: young.
        let held = vec![
            (d('a'), 1, 10 * hour),
            (d('b'), 1, 10 * hour),
            (d('c'), 1, 10 * hour),
            (d('e'), 1, 10 * hour),
            (d('f'), 7, 10 * hour),
            (d('d'), 1, Duration::from_secs(60)),
            (d('1'), 1, 10 * hour),
            (d('2'), 1, 10 * hour),
        ];
        let refs = |x: &Digest| match x.hex().chars().next() {
            Some('a') => vec![d('b'), d('c')],
            Some('1') => vec![d('2')],
            Some('2') => vec![d('e')],
            _ => vec![],
        };
        let roots = BTreeSet::from([d('a'), d('1')]);
        let (gone, young) = unreferenced(&held, &roots, refs, hour);
        assert_eq!(gone, vec![(d('f'), 7, 10 * hour)]);
        assert_eq!(young, 1);
    }
}
