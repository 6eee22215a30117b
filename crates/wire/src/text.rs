//! Text that came from a peer, a broker or a device, made fit for a terminal or a log line.
//!
//! A close reason, a refusal, a claim on a NATS subject: anyone on the path may have written
//! it, with escape sequences that move the cursor, recolour or clear the screen, newlines that
//! forge log lines, or megabytes. [`printable`] escapes every control and formatting character
//! (`\n`, `\u{1b}`, the bidirectional overrides) as Rust's `escape_debug` writes them and cuts
//! the text at a number of characters, saying how many bytes were left out.

/// The longest text from a peer shown in one message, in characters.
pub const MAX_SHOWN: usize = 200;
/// The longest reason from a peer shown (a CLOSE, a refusal): ours quote fingerprints, names,
/// stacks and the command that fixes it.
pub const MAX_REASON: usize = 1000;

/// `text` with control and formatting characters escaped (`\n`, `\u{1b}`, `\u{202e}`), at
/// most `max` characters of it, and `… (N more bytes)` when it was longer.
pub fn printable(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max + 32));
    for (shown, (at, c)) in text.char_indices().enumerate() {
        if shown == max {
            out.push_str(&format!("… ({} more bytes)", text.len() - at));
            return out;
        }
        if c.is_control() || is_format(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`printable`] of bytes that may not be UTF-8 (bad sequences become U+FFFD).
pub fn printable_bytes(bytes: &[u8], max: usize) -> String {
    printable(&String::from_utf8_lossy(bytes), max)
}

/// `text` with what could steer a terminal escaped (control characters other than newline
/// and tab, and the invisible format characters), whole: for messages of this program's own
/// that may carry words from the network or a broker (an error's chain), whose lines it keeps.
pub fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if (c.is_control() && c != '\n' && c != '\t') || is_format(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// Characters that change how the text around them shows without being seen: the
/// bidirectional embeddings, overrides and isolates, zero-width joiners and marks.
fn is_format(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_codes_and_newlines_are_shown_as_text() {
        assert_eq!(
            printable("busy\x1b[2J\nndd: error: forged\r", 100),
            "busy\\u{1b}[2J\\nndd: error: forged\\r"
        );
        assert_eq!(printable("a\u{202e}b\tc", 100), "a\\u{202e}b\\tc");
        // Plain text, accents included, is left as it is.
        assert_eq!(
            printable("run 0a1b, process 7 on hôte", 100),
            "run 0a1b, process 7 on hôte"
        );
    }

    #[test]
    fn long_text_is_cut_with_the_count_of_what_was_left_out() {
        let long = "é".repeat(300);
        assert_eq!(printable(&long, 3), "ééé… (594 more bytes)");
        assert_eq!(printable("abc", 3), "abc");
        assert_eq!(printable_bytes(b"ok\xff\x07", 10), "ok\u{fffd}\\u{7}");
    }
}
