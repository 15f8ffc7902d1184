//! The parser's input: a `&str` that the scanner may read only so far ahead of the last event
//! the loader received.
//!
//! Why: a YAML scanner must look past a flow collection (`[…]`, `{…}`) that starts where a key
//! could (`[[a, b]: c]` is valid YAML) before it emits anything inside it, and saphyr-parser
//! keeps every token of that collection in memory meanwhile: 60 nested anchored sequences
//! around 440,000 scalars cost 150 MB of tokens before the first event. The YAML spec limits
//! implicit keys to 1,024 characters, so nothing valid needs such a look-ahead; only long
//! scalars (a block of text) legitimately make the scanner read far ahead. The loader moves
//! the window forward after every event, and a scanner that reaches its end sees the input
//! end there, which the loader reports as `lookahead-limit`.

use saphyr_parser::Input;
use std::cell::Cell;
use std::rc::Rc;

/// The most characters the scanner may read past the end of the last event: more than any
/// scalar a state file needs (an age-armoured 64 KiB secret is about 88 KiB).
pub const MAX_LOOKAHEAD: usize = 128 * 1024;

/// Shared between the input and the loader: how far the scanner may read (in characters from
/// the start), and whether it was stopped there.
#[derive(Debug, Default)]
pub struct Window {
    allowed: Cell<usize>,
    cut: Cell<bool>,
}

impl Window {
    pub fn new() -> Rc<Window> {
        let w = Window::default();
        w.allowed.set(MAX_LOOKAHEAD);
        Rc::new(w)
    }

    /// The loader received an event ending at character `end`.
    pub fn advance(&self, end: usize) {
        self.allowed.set(end.saturating_add(MAX_LOOKAHEAD));
    }

    /// True when the scanner wanted to read past the window.
    pub fn was_cut(&self) -> bool {
        self.cut.get()
    }
}

/// A `&str` read through a [`Window`].
pub struct WindowedInput<'a> {
    rest: &'a str,
    /// Characters consumed so far.
    consumed: usize,
    lookahead: usize,
    window: Rc<Window>,
}

impl<'a> WindowedInput<'a> {
    pub fn new(text: &'a str, window: Rc<Window>) -> Self {
        WindowedInput {
            rest: text,
            consumed: 0,
            lookahead: 0,
            window,
        }
    }

    /// Characters the scanner may still read.
    fn visible(&self) -> usize {
        self.window.allowed.get().saturating_sub(self.consumed)
    }

    /// The `n`-th character ahead, or `None` past the end or the window.
    fn nth(&self, n: usize) -> Option<char> {
        if n >= self.visible() {
            if !self.rest.is_empty() && self.rest.chars().nth(n).is_some() {
                self.window.cut.set(true);
            }
            return None;
        }
        self.rest.chars().nth(n)
    }
}

impl Input for WindowedInput<'_> {
    fn lookahead(&mut self, count: usize) {
        // Everything is in memory already; only the count is kept, for `buflen`.
        self.lookahead = self.lookahead.max(count);
    }

    fn buflen(&self) -> usize {
        self.lookahead
    }

    fn bufmaxlen(&self) -> usize {
        // As saphyr-parser's own `StrInput`.
        16
    }

    fn raw_read_ch(&mut self) -> char {
        match self.nth(0) {
            Some(c) => {
                self.rest = &self.rest[c.len_utf8()..];
                self.consumed += 1;
                c
            }
            None => '\0',
        }
    }

    fn raw_read_non_breakz_ch(&mut self) -> Option<char> {
        let c = self.nth(0)?;
        // Not a break, not the end, not a byte order mark (YAML 1.2, 5.4).
        if matches!(c, '\n' | '\r' | '\0' | '\u{feff}') {
            return None;
        }
        self.rest = &self.rest[c.len_utf8()..];
        self.consumed += 1;
        Some(c)
    }

    fn skip(&mut self) {
        if let Some(c) = self.nth(0) {
            self.rest = &self.rest[c.len_utf8()..];
            self.consumed += 1;
        }
    }

    fn skip_n(&mut self, count: usize) {
        for _ in 0..count {
            self.skip();
        }
    }

    fn peek(&self) -> char {
        self.nth(0).unwrap_or('\0')
    }

    fn peek_nth(&self, n: usize) -> char {
        self.nth(n).unwrap_or('\0')
    }

    fn peek_opt(&self) -> Option<char> {
        self.nth(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_within_the_window() {
        let w = Window::new();
        w.allowed.set(3);
        let mut input = WindowedInput::new("abcdef", Rc::clone(&w));
        assert_eq!(input.raw_read_ch(), 'a');
        assert_eq!(input.peek_nth(1), 'c');
        assert_eq!(input.peek_nth(2), '\0', "past the window");
        assert!(w.was_cut());
        w.advance(4);
        assert_eq!(input.peek_nth(2), 'd');
        input.skip_n(10);
        assert_eq!(input.peek_opt(), None);
        let w = Window::new();
        let mut input = WindowedInput::new("é\nx", Rc::clone(&w));
        assert_eq!(input.raw_read_non_breakz_ch(), Some('é'));
        assert_eq!(input.raw_read_non_breakz_ch(), None, "a break is not consumed");
        assert_eq!(input.raw_read_ch(), '\n');
        assert_eq!(input.peek(), 'x');
        assert!(!w.was_cut());
    }
}
