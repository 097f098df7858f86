//! Where in a text file a parser stopped, said on one line.

/// `message` at byte `span.start` of `text`, as "line L, column C:
/// message" (1-based, columns in characters); the message alone when the
/// parser gave no position. TOML's own rendering quotes the line over
/// several lines; a command line reports one.
pub fn at_position(text: &str, span: Option<std::ops::Range<usize>>, message: &str) -> String {
    let message = message.trim();
    let Some(span) = span else {
        return message.to_string();
    };
    let start = span.start.min(text.len());
    let before = text.get(..start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |newline| newline + 1);
    let column = before[line_start..].chars().count() + 1;
    format!("line {line}, column {column}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_its_line_and_column_from_one() {
        let text = "a = 1\nb = [[\n";
        assert_eq!(
            at_position(text, Some(10..11), "expected `.`\n"),
            "line 2, column 5: expected `.`"
        );
        assert_eq!(
            at_position(text, Some(0..1), "bad"),
            "line 1, column 1: bad"
        );
        assert_eq!(at_position(text, None, "bad"), "bad");
        // "é" is two bytes and one column: "x" is byte 5 and column 5.
        assert_eq!(
            at_position("é = x", Some(5..6), "bad"),
            "line 1, column 5: bad"
        );
        assert_eq!(
            at_position("x", Some(99..100), "end"),
            "line 1, column 2: end"
        );
    }
}
