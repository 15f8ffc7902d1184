//! Times parsing alone (no Git, no I/O) on a synthetic 10,000-environment tree:
//! `cargo run --release -p state-schema --example parse_speed`.

use state_schema::synthetic::{Params, generate};
use std::time::Instant;

fn main() {
    let files = generate(&Params::new(10_000));
    let bytes: usize = files.iter().map(|(_, t)| t.len()).sum();
    println!("{} files, {} bytes; single thread, best of 3:", files.len(), bytes);
    let mut best = [f64::MAX; 4];
    for _ in 0..3 {
        let t = Instant::now();
        let events: usize = files
            .iter()
            .map(|(_, text)| saphyr_parser::Parser::new_from_str(text).count())
            .sum();
        best[0] = best[0].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let docs: usize = files
            .iter()
            .map(|(_, text)| state_schema::yaml::load_bytes(text.as_bytes()).map_or(0, |d| d.len()))
            .sum();
        best[1] = best[1].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let parsed: Vec<_> = files
            .iter()
            .map(|(p, text)| state_schema::parse::parse_file(p, text.as_bytes()))
            .collect();
        best[2] = best[2].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let loaded = state_schema::state::assemble(parsed, Vec::new());
        best[3] = best[3].min(t.elapsed().as_secs_f64());
        assert!(events > 0 && docs == files.len() && loaded.is_valid());
    }
    for (what, s) in [
        "saphyr events",
        "spanned tree (yaml::load_bytes)",
        "typed objects (parse_file)",
        "assemble and check",
    ]
    .iter()
    .zip(best)
    {
        println!("  {what:34} {:8.1} ms", s * 1000.0);
    }
}
