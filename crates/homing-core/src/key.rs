//! Keys: `(namespace, name)` pairs that at most one actor holds at a time,
//! the optional `Tag` that must match for connect to return an existing
//! actor, and `KeyConfig`, the connect request's view of a key.

use serde::{Deserialize, Serialize};

use crate::label::{LabelRule, label_type};

/// Longest namespace, in bytes. The empty namespace is the default.
pub const NAMESPACE_BYTES_MAX: usize = 128;
/// Longest key name, in bytes.
pub const KEY_NAME_BYTES_MAX: usize = 256;
/// Longest tag, in bytes.
pub const TAG_BYTES_MAX: usize = 128;

const NAMESPACE_RULE: LabelRule = LabelRule {
    what: "namespace",
    bytes_min: 0,
    bytes_max: NAMESPACE_BYTES_MAX,
    alphabet: None,
};
const KEY_NAME_RULE: LabelRule = LabelRule {
    what: "key name",
    bytes_min: 1,
    bytes_max: KEY_NAME_BYTES_MAX,
    alphabet: None,
};
const TAG_RULE: LabelRule = LabelRule {
    what: "tag",
    bytes_min: 1,
    bytes_max: TAG_BYTES_MAX,
    alphabet: None,
};

label_type!(
    /// Scopes key names: 0–128 bytes, no control characters. `""` is the default.
    Namespace,
    NAMESPACE_RULE
);
label_type!(
    /// The name of a key within its namespace: 1–256 bytes, no control characters.
    KeyName,
    KEY_NAME_RULE
);
label_type!(
    /// Distinguishes non-interchangeable actors sharing a key space: 1–128 bytes.
    Tag,
    TAG_RULE
);

// Not derived: the label macro is shared with types whose empty value is invalid.
#[allow(clippy::derivable_impls)]
impl Default for Namespace {
    fn default() -> Self {
        Namespace(String::new())
    }
}

impl KeyName {
    /// A fresh name for a connect request that gave none. The caller supplies
    /// the randomness (homing-core reads no entropy of its own), so a seeded
    /// simulator gets the same names every run.
    pub fn random(random_bits: u128) -> KeyName {
        KeyName(format!("r-{random_bits:032x}"))
    }
}

/// A key: unique within its namespace; at most one live actor holds it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    /// Scope of the name; `""` by default.
    pub namespace: Namespace,
    /// The name within the namespace.
    pub name: KeyName,
}

impl Key {
    /// A key in the default (empty) namespace.
    pub fn new(name: KeyName) -> Key {
        Key {
            namespace: Namespace::default(),
            name,
        }
    }

    /// A key in `namespace`.
    pub fn in_namespace(namespace: Namespace, name: KeyName) -> Key {
        Key { namespace, name }
    }
}

impl std::fmt::Display for Key {
    /// `name` in the default namespace, `namespace/name` otherwise. For
    /// humans only: names may contain `/`, so this is not a parse format.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.as_str().is_empty() {
            write!(f, "{}", self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// What a connect (acquire) request says about its key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyConfig {
    /// The key name; `None` asks for a fresh random one.
    pub name: Option<KeyName>,
    /// The namespace; the default is `""`.
    pub namespace: Namespace,
    /// If set, an existing actor is returned only when its tag is equal.
    pub tag: Option<Tag>,
}

impl KeyConfig {
    /// A config naming `name` in the default namespace, without a tag.
    pub fn named(name: KeyName) -> KeyConfig {
        KeyConfig {
            name: Some(name),
            ..KeyConfig::default()
        }
    }

    /// The key this config designates; a missing name becomes
    /// [`KeyName::random`] of `random_bits`.
    pub fn key(&self, random_bits: u128) -> Key {
        Key {
            namespace: self.namespace.clone(),
            name: self
                .name
                .clone()
                .unwrap_or_else(|| KeyName::random(random_bits)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::label::LabelError;
    use proptest::prelude::*;

    #[test]
    fn namespace_may_be_empty_but_name_may_not() {
        assert_eq!(Namespace::new("").unwrap(), Namespace::default());
        assert!(matches!(
            KeyName::new(""),
            Err(LabelError::Empty { what: "key name" })
        ));
        assert!(matches!(
            Tag::new(""),
            Err(LabelError::Empty { what: "tag" })
        ));
    }

    #[test]
    fn key_parts_reject_control_characters_and_overlong_text() {
        assert!(matches!(
            KeyName::new("room\u{0}1"),
            Err(LabelError::ControlCharacter {
                what: "key name",
                at: 4
            })
        ));
        assert!(matches!(
            Namespace::new("n".repeat(NAMESPACE_BYTES_MAX + 1)),
            Err(LabelError::TooLong {
                what: "namespace",
                ..
            })
        ));
        assert!(KeyName::new("ключ/🔑 with spaces").is_ok());
    }

    #[test]
    fn connect_without_a_name_gets_a_random_valid_name() {
        let config = KeyConfig::default();
        let a = config.key(1);
        let b = config.key(2);
        assert_ne!(a, b);
        assert!(KeyName::new(a.name.as_str()).is_ok());
        let named = KeyConfig::named(KeyName::new("room").unwrap());
        assert_eq!(named.key(1), named.key(2));
    }

    proptest! {
        #[test]
        fn key_name_display_parse_round_trips(text in "\\PC{1,64}") {
            let name = KeyName::new(text.clone()).unwrap();
            prop_assert_eq!(name.to_string().parse::<KeyName>().unwrap(), name);
        }

        #[test]
        fn key_postcard_round_trips(ns in "\\PC{0,16}", name in "\\PC{1,32}") {
            let key = Key::in_namespace(Namespace::new(ns).unwrap(), KeyName::new(name).unwrap());
            let bytes = postcard::to_allocvec(&key).unwrap();
            prop_assert_eq!(postcard::from_bytes::<Key>(&bytes).unwrap(), key);
        }
    }
}
