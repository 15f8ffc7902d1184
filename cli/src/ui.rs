//! `pl ui`: the web view's address, and a one-time link that signs a browser in as the
//! token `pl` uses (the local control plane's admin token under `pl up`), like a notebook
//! server's. The link works once, within ten minutes; `--sign-out-everywhere` ends every
//! session the token has.

use crate::client::{Client, OutFormat, ServerArgs, print_json};

use anyhow::Result;

/// Prints the view's URL and a fresh sign-in link.
pub fn ui(args: &ServerArgs, sign_out_everywhere: bool) -> Result<u8> {
    let client = Client::new(args)?;
    if sign_out_everywhere {
        let out = client.sign_out_everywhere()?;
        if args.format == OutFormat::Json {
            return print_json(&out);
        }
        outln!("ended {} web view sessions of this token", out.sessions);
        return Ok(0);
    }
    let link = client.sign_in_link()?;
    if args.format == OutFormat::Json {
        return print_json(&link);
    }
    outln!("web view   {}/ui/", client.base());
    outln!("sign in    {}{}", client.base(), link.path);
    outln!("           (opens a session once, within 10 minutes; then the view's own sign-in page takes a token)");
    Ok(0)
}

/// The lines `pl up` prints about the view, or nothing when the link cannot be had.
pub fn lines_for_up(client: &Client) -> Option<[String; 2]> {
    let link = client.sign_in_link().ok()?;
    Some([
        format!("pl up: the web view: {}/ui/", client.base()),
        format!(
            "pl up: sign in with one click (once, within 10 minutes; `pl ui` prints another): {}{}",
            client.base(),
            link.path
        ),
    ])
}
