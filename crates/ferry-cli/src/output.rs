//! What the binary prints for people: text from elsewhere (remote names, a server's error
//! message) made safe for a terminal. JSON output is left exact: serde escapes it already.

use std::borrow::Cow;
use std::fmt::Write;

/// `s` with every control character written as an escape (`\n`, `\t`, `\x1b`, `\u{9b}`), and
/// the invisible direction overrides too, so that a file name or a message a server chose
/// cannot move the cursor, recolour the terminal, set its title or hide text.
pub fn clean(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && needs_escape(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// C0 and C1 controls, DEL, and the bidirectional embeddings, overrides and isolates.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes a line of data to stdout. A reader that has gone (a pipe closed by `head`) ends the
/// process at once with status 0, as a tool whose output nobody reads is done; any other
/// write error is said on stderr and ends it with 1.
pub fn print_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("ferry: writing to stdout: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn controls_are_escaped_and_the_rest_kept() {
        assert_eq!(clean("plain ä 名前.txt"), "plain ä 名前.txt");
        assert_eq!(clean("a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(clean("\x1b[31mred\x07"), "\\x1b[31mred\\x07");
        assert_eq!(clean("\u{9b}2J\u{7f}"), "\\u{9b}2J\\x7f");
        assert_eq!(clean("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
    }
}
