use state_schema::synthetic::{Params, generate};
fn main() {
    let files = generate(&Params::new(10_000));
    let bytes: usize = files.iter().map(|(_, t)| t.len()).sum();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let mut n = 0;
        for (p, text) in &files {
            n += state_schema::yaml::load_bytes(text.as_bytes())
                .map(|d| d.len())
                .unwrap_or(0);
            let _ = p;
        }
        let load = t.elapsed();
        let t = std::time::Instant::now();
        let parsed: Vec<_> = files
            .iter()
            .map(|(p, t)| state_schema::parse::parse_file(p, t.as_bytes()))
            .collect();
        let full = t.elapsed();
        let t = std::time::Instant::now();
        let l = state_schema::state::assemble(parsed, Vec::new());
        let asm = t.elapsed();
        let t = std::time::Instant::now();
        let mut ev = 0;
        for (_, text) in &files {
            ev += saphyr_parser::Parser::new_from_str(text).count();
        }
        let sap = t.elapsed();
        println!(
            "{} files {} bytes: saphyr events {:?} ({ev}), load {:?} ({n} docs), parse_file {:?}, assemble {:?} ({} objs)",
            files.len(),
            bytes,
            sap,
            load,
            full,
            asm,
            l.state.len()
        );
    }
}
