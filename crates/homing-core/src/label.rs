//! The rules every textual identifier obeys (length bounds, no control
//! characters, an optional restricted alphabet), and the error that names the
//! rule an input broke.

use std::cell::RefCell;

use thiserror::Error;

thread_local! {
    /// The last rule a value decoded on this thread broke. postcard drops
    /// serde's custom error messages, so `wire::decode` reads the reason here
    /// to name the rule in its error instead of a bare "deserialization error".
    static LAST_REFUSED: RefCell<Option<LabelError>> = const { RefCell::new(None) };
}

/// Records `error` as the reason a decode on this thread failed.
pub(crate) fn note_refused(error: &LabelError) {
    LAST_REFUSED.with(|last| *last.borrow_mut() = Some(error.clone()));
}

/// Takes (and clears) the last recorded reason, if any.
pub(crate) fn take_refused() -> Option<LabelError> {
    LAST_REFUSED.with(|last| last.borrow_mut().take())
}

/// Why a piece of text was refused as an identifier. `what` names the field
/// (`"dc id"`, `"key name"`, …) so the message points at the culprit.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LabelError {
    /// The field must not be empty.
    #[error("{what} must not be empty")]
    Empty {
        /// The field that was empty.
        what: &'static str,
    },
    /// The field is longer than its limit (in bytes of UTF-8).
    #[error("{what} is {len} bytes, over the limit of {max} bytes")]
    TooLong {
        /// The field that was too long.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The field holds a control character (U+0000–U+001F, U+007F–U+009F).
    #[error("{what} contains a control character at byte {at}")]
    ControlCharacter {
        /// The field.
        what: &'static str,
        /// Byte offset of the first control character.
        at: usize,
    },
    /// The field holds a character outside its alphabet.
    #[error("{what} may only contain {alphabet}, found {found:?} at byte {at}")]
    Alphabet {
        /// The field.
        what: &'static str,
        /// A description of the allowed alphabet.
        alphabet: &'static str,
        /// The offending character.
        found: char,
        /// Its byte offset.
        at: usize,
    },
    /// A `/`-separated field has an empty segment (leading, trailing or
    /// doubled `/`).
    #[error(
        "{what} has an empty segment at byte {at}: segments are separated by single `/`, with none at the start or end"
    )]
    EmptySegment {
        /// The field.
        what: &'static str,
        /// Byte offset of the empty segment.
        at: usize,
    },
    /// A reservation ID is not `<dc>.<unique>`.
    #[error("reservation id {input:?} is not `<dc>.<unique>`: {reason}")]
    ReservationId {
        /// The input as given (truncated to a printable length).
        input: String,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// A session ID is not `<dc>~<unique>`.
    #[error("session id {input:?} is not `<dc>~<unique>`: {reason}")]
    SessionId {
        /// The input as given (truncated to a printable length).
        input: String,
        /// What was wrong with it.
        reason: &'static str,
    },
}

/// How a field's text is checked.
pub(crate) struct LabelRule {
    pub what: &'static str,
    pub bytes_min: usize,
    pub bytes_max: usize,
    /// `Some` restricts the characters allowed.
    pub alphabet: Option<Alphabet>,
    /// Non-empty text is `/`-separated segments, none of them empty.
    pub segmented: bool,
}

/// A restricted set of characters and how to describe it in an error.
pub(crate) struct Alphabet {
    pub allowed: fn(char) -> bool,
    pub description: &'static str,
}

impl LabelRule {
    /// Checks `text` against the rule; the first broken rule is reported.
    pub fn check(&self, text: &str) -> Result<(), LabelError> {
        let what = self.what;
        if text.is_empty() && self.bytes_min > 0 {
            return Err(LabelError::Empty { what });
        }
        if text.len() > self.bytes_max {
            return Err(LabelError::TooLong {
                what,
                len: text.len(),
                max: self.bytes_max,
            });
        }
        for (at, found) in text.char_indices() {
            if found.is_control() {
                return Err(LabelError::ControlCharacter { what, at });
            }
            if let Some(alphabet) = &self.alphabet
                && !(alphabet.allowed)(found)
            {
                return Err(LabelError::Alphabet {
                    what,
                    alphabet: alphabet.description,
                    found,
                    at,
                });
            }
        }
        if self.segmented && !text.is_empty() {
            let mut at = 0;
            for segment in text.split('/') {
                if segment.is_empty() {
                    return Err(LabelError::EmptySegment { what, at });
                }
                at += segment.len() + 1;
            }
        }
        Ok(())
    }
}

/// The empty text every empty label shares (the default namespace is in
/// most keys): no allocation per key for it.
pub(crate) fn shared_text(text: &str) -> std::sync::Arc<str> {
    static EMPTY: std::sync::LazyLock<std::sync::Arc<str>> =
        std::sync::LazyLock::new(|| std::sync::Arc::from(""));
    if text.is_empty() {
        EMPTY.clone()
    } else {
        std::sync::Arc::from(text)
    }
}

/// Declares a validated string newtype: constructor through `LabelRule`,
/// `Display`, `FromStr`, `AsRef<str>`, and serde as the plain string (so a
/// decoded value went through the same checks as a constructed one). The
/// text is shared (`Arc<str>`, one allocation when made, none for the
/// empty text): labels never change once made, and keys, DC names and
/// reservation IDs are cloned into every request, record, cache entry and
/// chain walk, so a clone is a count, not a copy.
macro_rules! label_type {
    ($(#[$meta:meta])* $name:ident, $rule:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(std::sync::Arc<str>);

        /// Serialized as the plain string, borrowed (no copy per encode).
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        /// Decoded from the plain string through the same checks as
        /// [`Self::new`]; a refusal is also noted for `wire::decode`'s error.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Text;
                impl serde::de::Visitor<'_> for Text {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<$name, E> {
                        $name::new(text)
                            .inspect_err($crate::label::note_refused)
                            .map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(Text)
            }
        }

        impl $name {
            /// Validates `text`; the error names the rule it broke.
            pub fn new(text: impl AsRef<str>) -> Result<Self, $crate::label::LabelError> {
                let text = text.as_ref();
                $rule.check(text)?;
                Ok(Self($crate::label::shared_text(text)))
            }

            /// Checks `text` as [`Self::new`] would, without taking it (no
            /// copy: for hot paths that look a value up by its text).
            pub fn check(text: &str) -> Result<(), $crate::label::LabelError> {
                $rule.check(text)
            }

            /// The text itself.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::label::LabelError;
            fn try_from(text: String) -> Result<Self, Self::Error> {
                Self::new(text)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0.as_ref().to_owned()
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::label::LabelError;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Self::new(text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}
pub(crate) use label_type;
