//! Who the registry is told we are: credentials from the environment
//! (`XFER_REGISTRY_USERNAME`, `XFER_REGISTRY_PASSWORD`) or from Docker's
//! own `config.json` (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`: its `auths` entry for the registry, the
//! base64 `user:password` that `docker login` writes), and how the
//! registry asks for them (its `WWW-Authenticate` challenge: a bearer token
//! from a realm, as Docker Hub, GHCR and NGC do, or basic auth).
//!
//! Where the credentials may go ([`check_realm`]): the realm is a URL the
//! registry names, so a hostile registry could name any host. A realm is
//! asked over plain HTTP only when the registry itself speaks plain HTTP
//! (`--insecure`); with credentials, only a realm on the registry's own
//! host (any port), on a host known to serve its tokens ([`KNOWN_REALMS`]:
//! Docker Hub's `auth.docker.io`, NGC's `authn.nvidia.com`), or on a host
//! the operator allowed in [`AUTH_HOSTS`] is sent them. Without
//! credentials, an anonymous token may come from any https realm. A
//! refused realm fails the pull in one line naming the realm, the
//! registry and the fix.

use std::path::PathBuf;

use base64::Engine as _;
use reqwest::Url;

/// Registries whose token service is on another host, as their operators
/// run them: (the registry's API host, its realm's host).
pub const KNOWN_REALMS: &[(&str, &str)] = &[
    ("registry-1.docker.io", "auth.docker.io"),
    ("nvcr.io", "authn.nvidia.com"),
];

/// The environment variable naming more hosts (comma-separated) that may
/// be sent a registry's credentials as its token realm.
pub const AUTH_HOSTS: &str = "XFER_REGISTRY_AUTH_HOSTS";

/// Why a registry's token realm is not asked: `what` says which
/// registry named which realm.
#[derive(Debug, thiserror::Error)]
pub enum RealmError {
    /// An https registry named a plain-HTTP realm.
    #[error("{what} over plain HTTP; xfer asks an https registry's tokens only over https (a token or the credentials would cross the network readable): have the registry name an https realm (auth.token.realm in its configuration)")]
    PlainHttp {
        /// "registry NAME named the token realm REALM".
        what: String,
    },
    /// The realm is not an http(s) URL.
    #[error("{what}, a `{scheme}` URL; xfer asks tokens over http(s) only: fix the registry's realm (auth.token.realm in its configuration)")]
    Scheme {
        /// "registry NAME named the token realm REALM".
        what: String,
        /// The realm's scheme.
        scheme: String,
    },
    /// The realm is on a host the credentials may not be sent to.
    #[error("{what} on another host, {host}; xfer sends {name}'s credentials only to {own} itself and to hosts allowed to serve its tokens: if {host} is {name}'s token service, allow it with {AUTH_HOSTS}={host} (for `xfer sync`, in the environment of the agent that pulls), else pull from a registry you trust")]
    OtherHost {
        /// "registry NAME named the token realm REALM".
        what: String,
        /// The realm's host.
        host: String,
        /// The registry's name as the reference spells it.
        name: String,
        /// The registry's own host.
        own: String,
    },
}

/// Whether the registry at `registry` (its API base URL; `name` as the
/// reference spells it, for messages) may be asked for a token at `realm`,
/// sending its credentials when `with_credentials`; `allowed` is the
/// operator's [`AUTH_HOSTS`] value. The refusal is one line with the fix.
pub fn check_realm(
    registry: &Url,
    name: &str,
    realm: &Url,
    with_credentials: bool,
    allowed: Option<&str>,
) -> Result<(), RealmError> {
    let what = format!("registry {name} named the token realm {realm}");
    match (realm.scheme(), registry.scheme()) {
        ("https", _) | ("http", "http") => {}
        ("http", _) => return Err(RealmError::PlainHttp { what }),
        (s, _) => {
            return Err(RealmError::Scheme {
                what,
                scheme: s.to_string(),
            })
        }
    }
    if !with_credentials {
        return Ok(());
    }
    let host = realm.host_str().unwrap_or("").to_ascii_lowercase();
    let own = registry.host_str().unwrap_or("").to_ascii_lowercase();
    let known = KNOWN_REALMS.iter().any(|(r, a)| *r == own && *a == host);
    let listed = allowed
        .unwrap_or("")
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .any(|h| !h.is_empty() && h == host);
    if host == own || known || listed {
        return Ok(());
    }
    Err(RealmError::OtherHost {
        what,
        host,
        name: name.to_string(),
        own,
    })
}

/// A user name and password (or token).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub user: String,
    /// The password or token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, ****)", self.user)
    }
}

impl Credentials {
    /// The `Authorization: Basic` value.
    pub fn basic(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// Where the credentials for `registry` come from: the environment first,
/// then Docker's config file; `None` pulls anonymously.
pub fn lookup(registry: &str) -> Option<Credentials> {
    if let (Ok(user), Ok(password)) = (
        std::env::var("XFER_REGISTRY_USERNAME"),
        std::env::var("XFER_REGISTRY_PASSWORD"),
    ) {
        return Some(Credentials { user, password });
    }
    let path = docker_config()?;
    let text = std::fs::read_to_string(path).ok()?;
    from_docker_config(&text, registry)
}

/// Docker's config file: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json`.
fn docker_config() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The `auths` entry for `registry` in a Docker config file's text
/// (Docker Hub's is keyed `https://index.docker.io/v1/`).
pub fn from_docker_config(text: &str, registry: &str) -> Option<Credentials> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let auths = v.get("auths")?.as_object()?;
    let keys: Vec<String> = if registry == super::reference::DOCKER_HUB {
        vec![
            "https://index.docker.io/v1/".into(),
            "index.docker.io".into(),
            "docker.io".into(),
            "registry-1.docker.io".into(),
        ]
    } else {
        vec![
            registry.to_string(),
            format!("https://{registry}"),
            format!("http://{registry}"),
        ]
    };
    let entry = keys
        .iter()
        .find_map(|k| auths.get(k).or_else(|| auths.get(&format!("{k}/"))))?;
    let raw = entry.get("auth")?.as_str()?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(raw.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some(Credentials {
        user: user.into(),
        password: password.into(),
    })
}

/// How a registry asks to be authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// Get a token from `realm` for `service` and `scope`.
    Bearer {
        /// The token endpoint.
        realm: String,
        /// The service the token is for.
        service: Option<String>,
        /// The access asked for, if the registry named it.
        scope: Option<String>,
    },
    /// Send the credentials themselves.
    Basic,
}

/// Reads a `WWW-Authenticate` header's value.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => {
            let mut realm = None;
            let (mut service, mut scope) = (None, None);
            for (k, v) in params(rest) {
                match k.to_ascii_lowercase().as_str() {
                    "realm" => realm = Some(v),
                    "service" => service = Some(v),
                    "scope" => scope = Some(v),
                    _ => {}
                }
            }
            Some(Challenge::Bearer {
                realm: realm?,
                service,
                scope,
            })
        }
        _ => None,
    }
}

/// `k="v",k2="v2"` (values may hold commas inside quotes).
fn params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while let Some((k, after)) = rest.split_once('=') {
        let k = k.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            match q.find('"') {
                Some(end) => (q[..end].to_string(), &q[end + 1..]),
                None => (q.to_string(), ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (after[..end].to_string(), &after[end..]),
                None => (after.to_string(), ""),
            }
        };
        out.push((k, v));
        rest = next.trim_start().trim_start_matches(',');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_of_docker_hub_and_a_basic_registry() {
        let h = r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/ubuntu:pull,push""#;
        assert_eq!(
            parse_challenge(h),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/ubuntu:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None, "no realm");
    }

    #[test]
    fn credentials_go_only_to_the_registrys_own_host_or_an_allowed_one() {
        let u = |s: &str| Url::parse(s).unwrap();
        let https = u("https://reg.example:5000/");
        let http = u("http://reg.example:5000/");
        let check = |reg: &Url, realm: &str, creds: bool, allowed: Option<&str>| {
            check_realm(reg, "reg.example:5000", &u(realm), creds, allowed)
        };
        // The registry's own host, any port, over https.
        assert!(check(&https, "https://reg.example/token", true, None).is_ok());
        assert!(check(&https, "https://REG.example:5001/token", true, None).is_ok());
        // Another host: anonymous only, unless allowed.
        let e = check(&https, "https://evil.example/token", true, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("https://evil.example/token")
                && e.contains("registry reg.example:5000")
                && e.contains("XFER_REGISTRY_AUTH_HOSTS=evil.example"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        assert!(check(&https, "https://evil.example/token", false, None).is_ok());
        assert!(check(
            &https,
            "https://auth.example/t",
            true,
            Some("x, AUTH.example")
        )
        .is_ok());
        // Plain HTTP: only for a plain HTTP registry, with or without
        // credentials.
        for creds in [true, false] {
            let e = check(&https, "http://reg.example/token", creds, None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("plain HTTP") && e.contains("http://reg.example/token"),
                "{e}"
            );
        }
        assert!(check(&http, "http://reg.example:5001/token", true, None).is_ok());
        assert!(check(&http, "http://127.0.9.99:17099/token", true, None).is_err());
        assert!(check(&http, "http://127.0.9.99:17099/token", false, None).is_ok());
        assert!(check(&https, "file:///etc/passwd", false, None).is_err());
        // Docker Hub's and NGC's own token services.
        let hub = u("https://registry-1.docker.io/");
        assert!(check_realm(
            &hub,
            "docker.io",
            &u("https://auth.docker.io/token"),
            true,
            None
        )
        .is_ok());
        let ngc = u("https://nvcr.io/");
        assert!(check_realm(
            &ngc,
            "nvcr.io",
            &u("https://authn.nvidia.com/token"),
            true,
            None
        )
        .is_ok());
        assert!(check_realm(
            &ngc,
            "nvcr.io",
            &u("https://auth.docker.io/token"),
            true,
            None
        )
        .is_err());
    }

    #[test]
    fn docker_config_entries_by_registry() {
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let text = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"127.0.0.1:5000":{{"auth":"{auth}"}}}}}}"#
        );
        let c = from_docker_config(&text, "docker.io").unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("alice", "s3cret"));
        assert!(from_docker_config(&text, "127.0.0.1:5000").is_some());
        assert!(from_docker_config(&text, "ghcr.io").is_none());
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "the password is never shown"
        );
        assert_eq!(c.basic(), format!("Basic {auth}"));
    }
}
