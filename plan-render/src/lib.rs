//! How a plan reads, shared by `pl plan` (text and Markdown) and the daemon's web view (the
//! text, without colour, as HTML): the same lines from the same code. Pure: a plan and its
//! header in, text out; whether colour is on is the caller's decision (`Paint`).

pub mod markdown;
pub mod plan_text;
pub mod verdict;

use anstyle::{AnsiColor, Style};

/// Colour on or off, decided once from `--color`, `--no-color`, `NO_COLOR` and the terminal.
#[derive(Clone, Copy, Debug)]
pub struct Paint {
    on: bool,
}

impl Paint {
    pub fn new(on: bool) -> Self {
        Paint { on }
    }

    fn style(&self, style: Style, text: &str) -> String {
        if self.on {
            format!("{}{text}{}", style.render(), style.render_reset())
        } else {
            text.to_owned()
        }
    }

    pub fn green(&self, t: &str) -> String {
        self.style(AnsiColor::Green.on_default(), t)
    }
    pub fn red(&self, t: &str) -> String {
        self.style(AnsiColor::Red.on_default(), t)
    }
    pub fn yellow(&self, t: &str) -> String {
        self.style(AnsiColor::Yellow.on_default(), t)
    }
    pub fn cyan(&self, t: &str) -> String {
        self.style(AnsiColor::Cyan.on_default(), t)
    }
    pub fn bold(&self, t: &str) -> String {
        self.style(Style::new().bold(), t)
    }
    pub fn dim(&self, t: &str) -> String {
        self.style(Style::new().dimmed(), t)
    }
}

/// What a plan compared: shown in every format's header.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Side {
    /// The revision as given, or `null` for the working tree.
    pub rev: Option<String>,
    /// The commit read, or `null` for the working tree.
    pub commit: Option<String>,
}

impl Side {
    pub fn describe(&self) -> String {
        match (&self.rev, &self.commit) {
            (Some(r), Some(c)) => format!("{r} ({})", short(c)),
            _ => "working tree".to_owned(),
        }
    }
}

pub fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

/// The inputs every plan renderer needs besides the plan itself.
pub struct PlanHeader {
    pub base: Side,
    pub head: Side,
    /// Set when base and head diverged and the plan starts from their merge base.
    pub merge_base: Option<String>,
    /// The head commit's signature verdict, when an allowed-signers file was given.
    pub signature: Option<verdict::VerdictJson>,
}
