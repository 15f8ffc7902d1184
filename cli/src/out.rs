//! Standard output that never panics when its reader goes away (`pl events | head`): every
//! write is a `Result`. A whole output (`text`, `stream`) that meets a closed pipe ends quietly
//! and the command's exit code stands; a line (`outln!`) returns the error, and `main` ends
//! quietly on it. The one place `pl` writes to standard output.

use anyhow::Context;
use std::io::Write;

fn closed(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// Writes a whole output (`pl plan`, `pl show`, …) to standard output.
/// `2026-12-02 03:00:04 UTC`.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

pub fn text(text: &str) -> anyhow::Result<()> {
    stream(|w| w.write_all(text.as_bytes()))
}

/// Streams an output through a buffer to standard output (a large JSON plan, say).
pub fn stream(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> anyhow::Result<()> {
    let mut w = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    match write(&mut w).and_then(|()| w.flush()) {
        Err(e) if closed(&e) => Ok(()),
        other => other.context("writing to stdout"),
    }
}

/// Writes one line to standard output.
pub fn line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")
}

/// True when `e` (or what caused it) is a write to a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(closed))
}

/// `println!` that returns the write's error instead of panicking.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))?
    };
}
