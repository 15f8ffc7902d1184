//! What every state-changing request of the view is checked for before anything is read: it
//! comes from the view's own origin, and carries the session's CSRF token.

use super::{Signed, refusal_page};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

/// Whether a POST comes from the view's own pages: browsers send `Sec-Fetch-Site` (and
/// `Origin` on every POST); a request with neither is not a browser's cross-site one.
pub fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return site == "same-origin" || site == "none";
    }
    match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
        (Some(origin), Some(host)) => origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("https://"))
            .zip(host.to_str().ok())
            .is_some_and(|(o, h)| o == h),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// Whether a posted CSRF token is the session's (compared in constant time).
pub fn csrf_ok(who: &Signed, posted: &str) -> bool {
    let want = who.viewer.csrf.as_bytes();
    let got = posted.as_bytes();
    want.len() == got.len() && want.iter().zip(got).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
}

pub fn bad_csrf(who: &Signed) -> Response {
    refusal_page(
        StatusCode::FORBIDDEN,
        "bad-csrf-token",
        "the form's token is not this session's; reload the page and try again",
        Some(&who.viewer),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_cross_site_post_is_told_apart() {
        let mut h = HeaderMap::new();
        assert!(same_origin(&h), "no browser headers: not a browser's cross-site post");
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("localhost:8443"));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://evil.invalid"));
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("https://localhost:8443"));
        assert!(same_origin(&h));
    }
}
