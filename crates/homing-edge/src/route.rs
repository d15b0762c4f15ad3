//! Which key a request is for: the key header, else the `/k/<key>/` path
//! prefix; and the path the actor sees.

use homing_core::{Key, KeyName, LabelError};
use hyper::http::request::Parts;
use hyper::http::uri::PathAndQuery;
use thiserror::Error;

use crate::config::EdgeConfig;

/// Path prefix that names the key: `/k/<key>/rest` routes `<key>`, forwards `/rest`.
pub const PATH_PREFIX: &str = "/k/";

/// Why a request names no routable key; both are answered 400.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// Neither the key header nor the path prefix is present.
    #[error("no key: set the key header or use a /k/<key>/ path")]
    Missing,
    /// The header is not visible ASCII, or the name breaks a key-name rule.
    #[error("invalid key: {0}")]
    Invalid(String),
}

impl From<LabelError> for KeyError {
    fn from(e: LabelError) -> KeyError {
        KeyError::Invalid(e.to_string())
    }
}

/// A request's key and the path and query to forward to the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The key.
    pub key: Key,
    /// Path and query for the actor (the prefix removed, if it named the key).
    pub path_and_query: PathAndQuery,
}

/// Finds the key of a request. The key name is taken as written (no
/// percent-decoding): routers and hosts must agree on names byte for byte.
pub fn route(parts: &Parts, config: &EdgeConfig) -> Result<Routed, KeyError> {
    if let Some(value) = parts.headers.get(&config.key_header) {
        let name = value
            .to_str()
            .map_err(|_| KeyError::Invalid("key header is not visible ascii".to_string()))?;
        // Shared with the request's own URI: no copy.
        let path_and_query = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        return Ok(Routed {
            key: key(config, name)?,
            path_and_query,
        });
    }
    let rest = config
        .path_prefix
        .then(|| parts.uri.path().strip_prefix(PATH_PREFIX))
        .flatten()
        .ok_or(KeyError::Missing)?;
    let (name, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, "/"),
    };
    let key = key(config, name)?;
    let mut forwarded = path.to_string();
    if let Some(query) = parts.uri.query() {
        forwarded.push('?');
        forwarded.push_str(query);
    }
    // A tail of a valid path and its query is a valid path and query.
    let path_and_query = PathAndQuery::try_from(forwarded)
        .map_err(|e| KeyError::Invalid(format!("path after the key: {e}")))?;
    Ok(Routed {
        key,
        path_and_query,
    })
}

fn key(config: &EdgeConfig, name: &str) -> Result<Key, KeyError> {
    Ok(Key::in_namespace(
        config.namespace.clone(),
        KeyName::new(name)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, header: Option<&str>) -> Parts {
        let mut builder = hyper::Request::builder().uri(uri);
        if let Some(value) = header {
            builder = builder.header("x-homing-key", value);
        }
        builder.body(()).expect("valid test request").into_parts().0
    }

    #[test]
    fn route_header_wins_and_path_is_kept() {
        let routed = route(
            &parts("/k/other/x?y=1", Some("room")),
            &EdgeConfig::default(),
        );
        let routed = routed.expect("routed");
        assert_eq!(routed.key.name.as_str(), "room");
        assert_eq!(routed.path_and_query, "/k/other/x?y=1");
    }

    #[test]
    fn route_path_prefix_names_the_key_and_is_stripped() {
        let config = EdgeConfig::default();
        let routed = route(&parts("/k/room/a/b?q=2", None), &config).expect("routed");
        assert_eq!(routed.key.name.as_str(), "room");
        assert_eq!(routed.path_and_query, "/a/b?q=2");
        let bare = route(&parts("/k/room", None), &config).expect("routed");
        assert_eq!(bare.path_and_query, "/");
    }

    #[test]
    fn route_without_key_or_with_empty_key_is_refused() {
        let config = EdgeConfig::default();
        assert_eq!(route(&parts("/x", None), &config), Err(KeyError::Missing));
        assert!(matches!(
            route(&parts("/k//x", None), &config),
            Err(KeyError::Invalid(_))
        ));
        let no_prefix = EdgeConfig {
            path_prefix: false,
            ..EdgeConfig::default()
        };
        assert_eq!(
            route(&parts("/k/room/", None), &no_prefix),
            Err(KeyError::Missing)
        );
    }
}
