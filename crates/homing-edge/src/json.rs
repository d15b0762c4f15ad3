//! The few JSON objects this crate writes: flat, string and number fields,
//! escaped here so no JSON library is needed on the hot path.

use std::fmt::Write;

/// A flat JSON object written field by field.
pub(crate) struct Object {
    text: String,
}

impl Object {
    pub(crate) fn new() -> Object {
        Object {
            text: String::from("{"),
        }
    }

    fn name(&mut self, name: &str) {
        if self.text.len() > 1 {
            self.text.push(',');
        }
        quote(&mut self.text, name);
        self.text.push(':');
    }

    /// Adds `"name":"value"`.
    pub(crate) fn string(mut self, name: &str, value: &str) -> Object {
        self.name(name);
        quote(&mut self.text, value);
        self
    }

    /// Adds `"name":value`.
    pub(crate) fn number(mut self, name: &str, value: u64) -> Object {
        self.name(name);
        // Writing to a String cannot fail.
        let _ = write!(self.text, "{value}");
        self
    }

    /// The object's text, with a trailing newline for terminals.
    pub(crate) fn finish(mut self) -> String {
        self.text.push_str("}\n");
        self.text
    }
}

fn quote(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_escapes_quotes_backslashes_and_control_characters() {
        let text = Object::new()
            .string("error", "not_found")
            .string("key", "a\"b\\c\n")
            .number("token", 7)
            .finish();
        assert_eq!(
            text,
            "{\"error\":\"not_found\",\"key\":\"a\\\"b\\\\c\\u000a\",\"token\":7}\n"
        );
    }
}
