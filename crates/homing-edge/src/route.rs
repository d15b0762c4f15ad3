//! Which key a request is for: the key header, else the `/k/<key>/` path
//! prefix; and the path the actor sees.

use std::borrow::Cow;

use homing_core::{KeyRef, LabelError};
use hyper::Uri;
use hyper::header::HeaderMap;
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
pub struct Routed<'t> {
    /// The key, borrowed from the request and the configured namespace
    /// (checked, not copied: a cached resolve then allocates nothing).
    pub key: KeyRef<'t>,
    /// Path and query for the actor (the prefix removed, if it named the
    /// key): a slice of the request's own target unless the key was all
    /// of its path (`/k/<key>` forwards `/`).
    pub path_and_query: Cow<'t, str>,
}

/// Finds the key of a request parsed by hyper (see [`route`]).
pub fn route_parts<'u>(
    headers: &'u HeaderMap,
    uri: &'u Uri,
    config: &'u EdgeConfig,
) -> Result<Routed<'u>, KeyError> {
    let header = headers.get(&config.key_header).map(|v| v.as_bytes());
    let path_and_query = uri.path_and_query().map_or("/", |p| p.as_str());
    route(header, path_and_query, config)
}

/// Finds the key of a request from its key header's value (if it has one)
/// and its target in origin form (`/path?query`, see [`origin_form`]). The
/// key name is taken as written (no percent-decoding): routers and hosts
/// must agree on names byte for byte.
pub fn route<'t>(
    key_header: Option<&'t [u8]>,
    path_and_query: &'t str,
    config: &'t EdgeConfig,
) -> Result<Routed<'t>, KeyError> {
    if let Some(value) = key_header {
        // What hyper's `HeaderValue::to_str` accepts.
        let name = std::str::from_utf8(value)
            .ok()
            .filter(|v| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)))
            .ok_or_else(|| KeyError::Invalid("key header is not visible ascii".to_string()))?;
        return Ok(Routed {
            key: key(config, name)?,
            path_and_query: Cow::Borrowed(path_and_query),
        });
    }
    let (path, query) = match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    };
    let rest = config
        .path_prefix
        .then(|| path.strip_prefix(PATH_PREFIX))
        .flatten()
        .ok_or(KeyError::Missing)?;
    let (name, tail) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let key = key(config, name)?;
    let path_and_query = if tail.is_empty() {
        Cow::Owned(match query {
            Some(query) => format!("/?{query}"),
            None => "/".to_string(),
        })
    } else {
        // The tail of the path and the query after it, as the client wrote them.
        Cow::Borrowed(&path_and_query[PATH_PREFIX.len() + name.len()..])
    };
    Ok(Routed {
        key,
        path_and_query,
    })
}

/// A request target in origin form, as the router forwards it: origin
/// form (and `*`) as it is, the path and query of an absolute-form target
/// (`/` if it has none), `/` for authority form (CONNECT); `None` if it is
/// none of these.
pub fn origin_form(target: &str) -> Option<&str> {
    if target.starts_with('/') || target == "*" {
        return Some(target);
    }
    let uri: Uri = target.parse().ok()?;
    Some(match uri.path_and_query() {
        // Stored as written: the same bytes end the target.
        Some(pq) if target.ends_with(pq.as_str()) => &target[target.len() - pq.as_str().len()..],
        _ => "/",
    })
}

fn key<'t>(config: &'t EdgeConfig, name: &'t str) -> Result<KeyRef<'t>, KeyError> {
    Ok(KeyRef::new(&config.namespace, name)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, header: Option<&str>) -> hyper::http::request::Parts {
        let mut builder = hyper::Request::builder().uri(uri);
        if let Some(value) = header {
            builder = builder.header("x-homing-key", value);
        }
        builder.body(()).expect("valid test request").into_parts().0
    }

    #[test]
    fn route_header_wins_and_path_is_kept() {
        let parts = parts("/k/other/x?y=1", Some("room"));
        let config = EdgeConfig::default();
        let routed = route_parts(&parts.headers, &parts.uri, &config);
        let routed = routed.expect("routed");
        assert_eq!(routed.key.name(), "room");
        assert_eq!(routed.path_and_query, "/k/other/x?y=1");
    }

    #[test]
    fn route_path_prefix_names_the_key_and_is_stripped() {
        let config = EdgeConfig::default();
        let parts = parts("/k/room/a/b?q=2", None);
        let routed = route_parts(&parts.headers, &parts.uri, &config).expect("routed");
        assert_eq!(routed.key.name(), "room");
        assert_eq!(routed.path_and_query, "/a/b?q=2");
        let bare = route(None, "/k/room", &config).expect("routed");
        assert_eq!(bare.path_and_query, "/");
        let bare = route(None, "/k/room?q=1", &config).expect("routed");
        assert_eq!(bare.path_and_query, "/?q=1");
    }

    #[test]
    fn route_without_key_or_with_empty_key_is_refused() {
        let config = EdgeConfig::default();
        assert_eq!(route(None, "/x", &config), Err(KeyError::Missing));
        assert!(matches!(
            route(None, "/k//x", &config),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(
            route(Some(b"caf\xc3\xa9"), "/", &config),
            Err(KeyError::Invalid(_))
        ));
        let no_prefix = EdgeConfig {
            path_prefix: false,
            ..EdgeConfig::default()
        };
        assert_eq!(route(None, "/k/room/", &no_prefix), Err(KeyError::Missing));
    }

    #[test]
    fn targets_in_other_forms_are_forwarded_in_origin_form() {
        assert_eq!(origin_form("/a?b"), Some("/a?b"));
        assert_eq!(origin_form("*"), Some("*"));
        assert_eq!(origin_form("http://h:1/a/b?c"), Some("/a/b?c"));
        assert_eq!(origin_form("http://h:1"), Some("/"));
        assert_eq!(origin_form("h:443"), Some("/"));
        assert_eq!(origin_form("::bad::"), None);
    }
}
