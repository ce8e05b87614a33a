//! Output as a terminal shows it, for the model's view of a run: a carriage return moves
//! back to the start of its line and what follows overwrites it, so a progress bar redrawn
//! a thousand times shows its last frame, not a thousand of them. (The HTTP API's `stdout`
//! keeps the bytes as the program wrote them.)

use std::borrow::Cow;

/// `text` with each line as a terminal would leave it after its carriage returns.
pub fn render_carriage_returns(text: &str) -> Cow<'_, str> {
    if !text.contains('\r') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if !line.contains('\r') {
            out.push_str(line);
            continue;
        }
        let mut cells: Vec<char> = Vec::new();
        let mut column = 0;
        for c in line.chars() {
            if c == '\r' {
                column = 0;
                continue;
            }
            match cells.get_mut(column) {
                Some(cell) => *cell = c,
                None => cells.push(c),
            }
            column += 1;
        }
        out.extend(cells);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redrawn_line_keeps_what_a_terminal_shows() {
        let bar = "\r  0%|   |\r 50%|#  |\r100%|###|\nANSWER = 42\n";
        assert_eq!(render_carriage_returns(bar), "100%|###|\nANSWER = 42\n");
        // A shorter frame overwrites only the start of a longer one, as on a terminal.
        assert_eq!(render_carriage_returns("loading...\rdone"), "doneing...");
    }

    #[test]
    fn crlf_line_ends_and_plain_text_are_unchanged() {
        assert_eq!(render_carriage_returns("a\r\nb\r\n"), "a\nb\n");
        assert!(matches!(
            render_carriage_returns("plain\ntext"),
            Cow::Borrowed("plain\ntext")
        ));
    }
}
