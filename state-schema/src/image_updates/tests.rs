use super::*;

const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn tags(list: &[&str]) -> Vec<String> {
    list.iter().map(|t| (*t).to_owned()).collect()
}

fn semver(range: &str) -> Pick {
    Pick::Semver { semver: range.into() }
}

#[test]
fn semver_picks_the_newest_in_range_and_skips_pre_releases() {
    let t = tags(&["1.2.0", "v1.4.1", "1.4.0", "2.0.0", "1.5.0-rc.1", "latest", "1.3.9"]);
    assert_eq!(newest(&semver(">=1.2, <2"), &t), Some("v1.4.1"));
    assert_eq!(newest(&semver("^2"), &t), Some("2.0.0"));
    assert_eq!(
        newest(&semver(">=1.5.0-rc.0, <2"), &t),
        Some("1.5.0-rc.1"),
        "named, a pre-release counts"
    );
    assert_eq!(newest(&semver("^3"), &t), None);
    assert!(invalid(&semver("not a range")).is_some());
}

#[test]
fn patterns_order_by_their_key() {
    let t = tags(&["main-9", "main-10", "main-x", "dev-99", "main-2"]);
    let numeric = Pick::Pattern {
        pattern: "^main-(?P<key>[0-9a-z]+)$".into(),
        order: Order::Numeric,
    };
    assert_eq!(newest(&numeric, &t), Some("main-10"), "10 after 9, `x` is no number");
    let alpha = Pick::Pattern {
        pattern: "^main-".into(),
        order: Order::Alphabetical,
    };
    assert_eq!(newest(&alpha, &t), Some("main-x"), "the whole tag, as text");
    assert!(
        invalid(&Pick::Pattern {
            pattern: "(".into(),
            order: Order::Numeric
        })
        .is_some()
    );
}

#[test]
fn decisions() {
    let track = ImageUpdates {
        pick: semver("^1"),
        digests: Digests::Track,
        branch: Branch::Own,
    };
    let image = format!("127.0.0.1:5000/team/api:1.4.0@{D1}");
    assert_eq!(repository_of(&image), ("127.0.0.1:5000/team/api", Some("1.4.0")));
    assert_eq!(
        repository_of(&format!("127.0.0.1:5000/api@{D1}")),
        ("127.0.0.1:5000/api", None)
    );
    assert_eq!(decide(&track, &image, Some(("1.4.0", D1))), Decision::Current);
    assert_eq!(
        decide(&track, &image, Some(("1.4.1", D2))),
        Decision::Update {
            image: format!("127.0.0.1:5000/team/api:1.4.1@{D2}"),
            tag: "1.4.1".into()
        }
    );
    // The same tag moved to new bytes: followed.
    assert!(matches!(
        decide(&track, &image, Some(("1.4.0", D2))),
        Decision::Update { .. }
    ));
    assert_eq!(decide(&track, &image, None), Decision::NoTag);
    let pinned = ImageUpdates {
        digests: Digests::Pin,
        ..track
    };
    assert_eq!(decide(&pinned, &image, Some(("1.4.1", D2))), Decision::Pinned);
}
