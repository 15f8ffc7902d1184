//! Outgoing webhooks: an event posted as JSON to a receiver the operator configured, signed
//! like the webhooks Pushleft receives (HMAC-SHA256 of the body, `sha256=<hex>` in
//! `X-Pushleft-Signature-256`), with the event's kind in `X-Pushleft-Event` and its delivery id
//! (the same on every retry, so a receiver can drop one it has) in `X-Pushleft-Delivery`.

use crate::{Header, Request, Secret};
use hmac::{KeyInit, Mac};
use sha2::Sha256;

/// A receiver: its URL and the secret its signatures are made with.
#[derive(Clone, Debug)]
pub struct Hook {
    url: String,
    secret: Secret,
}

impl Hook {
    /// `None` when `url` may not be called ([`crate::status::allowed_url`]).
    pub fn new(url: &str, secret: Secret) -> Option<Hook> {
        crate::status::allowed_url(url).then(|| Hook {
            url: url.to_owned(),
            secret,
        })
    }

    /// The call delivering `body` (the event as JSON) as delivery `id` of kind `event`.
    pub fn request(&self, id: i64, event: &str, body: &[u8]) -> Request {
        Request {
            url: self.url.clone(),
            headers: vec![
                ("x-pushleft-event", Header::Plain(event.to_owned())),
                ("x-pushleft-delivery", Header::Plain(id.to_string())),
                ("x-pushleft-signature-256", Header::Plain(signature(&self.secret, body))),
            ],
            body: body.to_vec(),
        }
    }
}

/// `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub fn signature(secret: &Secret, body: &[u8]) -> String {
    // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
    let Ok(mut mac) = hmac::Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()) else {
        return String::new();
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_githubs_scheme_and_the_delivery_id_is_stable() {
        // RFC 4231's test case 2: key "Jefe", data "what do ya want for nothing?".
        let s = Secret::new("Jefe".into());
        assert_eq!(
            signature(&s, b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let hook = Hook::new("https://hooks.example.invalid/p", s).expect("hook");
        let r = hook.request(42, "deployment-rollout-done", b"{}");
        let names: Vec<&str> = r.headers.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            ["x-pushleft-event", "x-pushleft-delivery", "x-pushleft-signature-256"]
        );
        assert!(Hook::new("http://hooks.example.invalid/p", Secret::new("x".into())).is_none());
    }
}
