//! Standard output that never panics when its reader goes away (`pl events | head`): every
//! line is a `Result`, and `main` ends quietly on a broken pipe.

/// Writes one line to standard output.
pub fn line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")
}

/// True when `e` (or what caused it) is a write to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `println!` that returns the write's error instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))?
    };
}
