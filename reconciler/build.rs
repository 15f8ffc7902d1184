//! Rebuilds the crate when a migration changes: `sqlx::migrate!` embeds the files at compile
//! time, and without this a changed one would leave an old schema in the binary.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
