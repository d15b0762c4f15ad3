//! Keys: `(namespace, name)` pairs that at most one actor holds at a time,
//! the optional `Tag` that must match for connect to return an existing
//! actor, and `KeyConfig`, the connect request's view of a key.

use serde::{Deserialize, Serialize};

use crate::label::{LabelError, LabelRule, label_type};

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
    segmented: true,
};
const KEY_NAME_RULE: LabelRule = LabelRule {
    what: "key name",
    bytes_min: 1,
    bytes_max: KEY_NAME_BYTES_MAX,
    alphabet: None,
    segmented: false,
};
const TAG_RULE: LabelRule = LabelRule {
    what: "tag",
    bytes_min: 1,
    bytes_max: TAG_BYTES_MAX,
    alphabet: None,
    segmented: false,
};

label_type!(
    /// Scopes key names: 0–128 bytes, no control characters. `""` is the
    /// default. Namespaces are hierarchical: `/` separates segments
    /// (`games/eu/lobbies` is a child of `games/eu`), and no segment may be
    /// empty (no leading, trailing or doubled `/`).
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
        Namespace(crate::label::shared_text(""))
    }
}

impl Namespace {
    /// Whether this namespace is `ancestor` or lies under it. Every namespace
    /// lies under the default (empty) one.
    pub fn is_within(&self, ancestor: &Namespace) -> bool {
        let (me, up) = (self.as_str(), ancestor.as_str());
        up.is_empty()
            || me == up
            || (me.len() > up.len() && me.starts_with(up) && me.as_bytes()[up.len()] == b'/')
    }

    /// The `/`-separated segments (none for the default namespace).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.as_str().split('/').filter(|s| !s.is_empty())
    }
}

/// Which namespaces a query covers: one, or one with every namespace under it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NamespaceScope {
    /// The namespace named by the query.
    pub namespace: Namespace,
    /// Also every namespace under it (`games/eu` covers `games/eu/lobbies`).
    pub include_children: bool,
}

impl NamespaceScope {
    /// Exactly `namespace`.
    pub fn exact(namespace: Namespace) -> NamespaceScope {
        NamespaceScope {
            namespace,
            include_children: false,
        }
    }

    /// `namespace` and every namespace under it.
    pub fn subtree(namespace: Namespace) -> NamespaceScope {
        NamespaceScope {
            namespace,
            include_children: true,
        }
    }

    /// Every namespace (the default namespace's subtree).
    pub fn everything() -> NamespaceScope {
        NamespaceScope::subtree(Namespace::default())
    }

    /// Whether `namespace` is in scope.
    pub fn contains(&self, namespace: &Namespace) -> bool {
        if self.include_children {
            namespace.is_within(&self.namespace)
        } else {
            namespace == &self.namespace
        }
    }
}

impl std::fmt::Display for NamespaceScope {
    /// `games/eu`, `games/eu/**` with children, `""` / `**` for the default.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.namespace.as_str(), self.include_children) {
            ("", false) => f.write_str("\"\""),
            ("", true) => f.write_str("**"),
            (ns, false) => f.write_str(ns),
            (ns, true) => write!(f, "{ns}/**"),
        }
    }
}

impl KeyName {
    /// A fresh name for a connect request that gave none. The caller supplies
    /// the randomness (homing-core reads no entropy of its own), so a seeded
    /// simulator gets the same names every run.
    pub fn random(random_bits: u128) -> KeyName {
        KeyName(format!("r-{random_bits:032x}").into())
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

impl Key {
    /// This key, borrowed.
    pub fn borrowed(&self) -> KeyRef<'_> {
        KeyRef {
            namespace: self.namespace.as_str(),
            name: self.name.as_str(),
        }
    }
}

/// A key borrowed from text that is already checked: what a hot path
/// looks keys up by without copying them into a [`Key`]. Displayed, and
/// made into a `Key`, exactly as the `Key` it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef<'a> {
    namespace: &'a str,
    name: &'a str,
}

impl<'a> KeyRef<'a> {
    /// The key `name` in `namespace`; `name` is checked as [`KeyName::new`]
    /// checks it (the namespace was checked when it was made).
    pub fn new(namespace: &'a Namespace, name: &'a str) -> Result<KeyRef<'a>, LabelError> {
        KeyName::check(name)?;
        Ok(KeyRef {
            namespace: namespace.as_str(),
            name,
        })
    }

    /// The namespace's text.
    pub fn namespace(&self) -> &'a str {
        self.namespace
    }

    /// The name's text.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The key, owned.
    pub fn to_key(&self) -> Key {
        // Invariant: both parts were checked (by `new`, or by the `Key`
        // this was borrowed from).
        Key {
            namespace: Namespace(crate::label::shared_text(self.namespace)),
            name: KeyName(crate::label::shared_text(self.name)),
        }
    }
}

impl<'a> From<&'a Key> for KeyRef<'a> {
    fn from(key: &'a Key) -> KeyRef<'a> {
        key.borrowed()
    }
}

impl std::fmt::Display for KeyRef<'_> {
    /// As [`Key`]'s `Display`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(self.name)
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
    fn a_borrowed_key_is_checked_shown_and_owned_as_the_key() {
        let games = Namespace::new("games/eu").unwrap();
        for namespace in [Namespace::default(), games] {
            let key = Key::in_namespace(namespace.clone(), KeyName::new("room-1").unwrap());
            let borrowed = KeyRef::new(&namespace, "room-1").unwrap();
            assert_eq!(borrowed, key.borrowed());
            assert_eq!(borrowed.to_string(), key.to_string());
            assert_eq!(borrowed.to_key(), key);
        }
        let namespace = Namespace::default();
        assert_eq!(
            KeyRef::new(&namespace, ""),
            Err(LabelError::Empty { what: "key name" })
        );
        assert!(KeyRef::new(&namespace, "a\u{7}b").is_err());
    }

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
    fn namespaces_are_slash_separated_segments() {
        assert!(Namespace::new("games/eu/lobbies").is_ok());
        for (bad, at) in [("/games", 0), ("games/", 6), ("games//eu", 6), ("/", 0)] {
            assert_eq!(
                Namespace::new(bad),
                Err(LabelError::EmptySegment {
                    what: "namespace",
                    at
                }),
                "{bad}"
            );
        }
        let ns = |s: &str| Namespace::new(s).unwrap();
        assert_eq!(
            ns("games/eu").segments().collect::<Vec<_>>(),
            ["games", "eu"]
        );
        assert_eq!(ns("").segments().count(), 0);
        assert!(ns("games/eu/lobbies").is_within(&ns("games/eu")));
        assert!(ns("games/eu").is_within(&ns("games/eu")));
        assert!(ns("games").is_within(&ns("")));
        assert!(!ns("games/europe").is_within(&ns("games/eu")));
        assert!(!ns("games").is_within(&ns("games/eu")));
        let eu = NamespaceScope::subtree(ns("games/eu"));
        assert!(eu.contains(&ns("games/eu/lobbies")) && eu.contains(&ns("games/eu")));
        assert!(!eu.contains(&ns("games/eu-west")));
        let exact = NamespaceScope::exact(ns("games/eu"));
        assert!(!exact.contains(&ns("games/eu/lobbies")) && exact.contains(&ns("games/eu")));
        assert!(NamespaceScope::everything().contains(&ns("x/y")));
        assert!(!NamespaceScope::exact(ns("")).contains(&ns("x")));
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
        fn key_postcard_round_trips(ns in "([^/\\p{C}]{1,6}(/[^/\\p{C}]{1,6}){0,2})?", name in "\\PC{1,32}") {
            let key = Key::in_namespace(Namespace::new(ns).unwrap(), KeyName::new(name).unwrap());
            let bytes = postcard::to_allocvec(&key).unwrap();
            prop_assert_eq!(postcard::from_bytes::<Key>(&bytes).unwrap(), key);
        }
    }
}
