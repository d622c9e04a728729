//! The environment conventions of `huggingface_hub`: which endpoint, which
//! token, which cache folder. Read through a lookup function so tests do not
//! touch the process environment.

use std::path::{Path, PathBuf};

/// The default Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A Hugging Face access token. Its `Debug` form never shows it, so no
/// log line or error dump can leak it; [`Token::expose`] is the one way to
/// the text, for the `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token's text, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// What is wrong with the Hub's environment ([`HubEnv::from_lookup`]).
#[derive(Debug, thiserror::Error)]
pub enum HubEnvError {
    /// `HF_ENDPOINT` is not an http(s) URL.
    #[error("HF_ENDPOINT `{0}` is not an http(s) URL; set it like https://hf-mirror.com")]
    NotHttp(String),
    /// Neither a cache folder nor a home to put one in is set.
    #[error("cannot tell where the Hugging Face cache is: set HF_HUB_CACHE or HOME")]
    NoCache,
    /// The token file exists but cannot be read.
    #[error("cannot read the Hugging Face token at {}: {source}; fix its permissions or set HF_TOKEN", path.display())]
    TokenFile {
        /// The token file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// `HF_HUB_OFFLINE` is set, and the command would ask the Hub for this
    /// repo.
    #[error("HF_HUB_OFFLINE is set, so the Hub is not asked for {0} (as `hf download` refuses); unset HF_HUB_OFFLINE (or set it to 0) to download, or use the copy the nodes already hold")]
    Offline(String),
    /// A token is set and the endpoint is plain http to another machine.
    #[error("HF_ENDPOINT {0} is plain http and a Hugging Face token is set, which would cross the network unencrypted; use an https endpoint, or unset HF_TOKEN (and HF_TOKEN_PATH) for this mirror")]
    TokenOverHttp(String),
}

/// Permanent: the setting stays wrong until someone fixes it.
impl crate::util::permanence::Permanence for HubEnvError {
    fn is_permanent(&self) -> bool {
        true
    }
}

/// What the environment says about the Hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEnv {
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub endpoint: String,
    /// The access token, if any.
    pub token: Option<Token>,
    /// Where the `models--org--name` folders live.
    pub cache_root: PathBuf,
}

/// Whether `HF_HUB_OFFLINE` asks that the Hub not be contacted, read as
/// `huggingface_hub` reads a boolean (`1`, `ON`, `YES`, `TRUE`, any case).
pub fn offline(lookup: &dyn Fn(&str) -> Option<String>) -> bool {
    lookup("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

/// [`offline`] in the process environment: `Err` naming `repo` when set.
pub fn check_online(repo: &str) -> Result<(), HubEnvError> {
    if offline(&|k| std::env::var(k).ok()) {
        return Err(HubEnvError::Offline(repo.to_string()));
    }
    Ok(())
}

impl HubEnv {
    /// From the process environment.
    pub fn from_process() -> Result<Self, HubEnvError> {
        Self::from_lookup(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// From `lookup(NAME)`, as `huggingface_hub` reads it:
    /// - endpoint: `HF_ENDPOINT`, else huggingface.co;
    /// - token: `HF_TOKEN`, else the file `HF_TOKEN_PATH`, else
    ///   `$HF_HOME/token` (a missing file means no token);
    /// - cache: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    ///   `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, HubEnvError> {
        let endpoint = endpoint_of(lookup)?.unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let hf_home = hf_home_of(lookup);
        let cache_root = match (lookup("HF_HUB_CACHE"), &hf_home) {
            (Some(c), _) => PathBuf::from(c),
            (None, Some(h)) => h.join("hub"),
            (None, None) => return Err(HubEnvError::NoCache),
        };
        let token = token_of(lookup, hf_home.as_deref())?;
        if token.is_some() && !token_may_go_to(&endpoint) {
            return Err(HubEnvError::TokenOverHttp(endpoint));
        }
        Ok(HubEnv {
            endpoint,
            token,
            cache_root,
        })
    }

    /// This (the agent's own) environment with a job's settings taking
    /// over: the job's endpoint if it names one, the job's token if it
    /// carries one. The agent's own token goes only to the agent's own
    /// endpoint, never to one a job named.
    pub fn with_job(self, job: &HubSettings) -> Result<HubEnv, HubEnvError> {
        let endpoint = job
            .endpoint
            .clone()
            .unwrap_or_else(|| self.endpoint.clone());
        let token = match &job.token {
            Some(t) => Some(t.clone()),
            None if endpoint == self.endpoint => self.token,
            None => None,
        };
        if token.is_some() && !token_may_go_to(&endpoint) {
            return Err(HubEnvError::TokenOverHttp(endpoint));
        }
        Ok(HubEnv {
            endpoint,
            token,
            cache_root: self.cache_root,
        })
    }
}

/// The Hub settings an operator's `xfer sync` sends with a job: its own
/// `HF_ENDPOINT` and token, each `None` when the operator set none (the
/// source agent's environment decides then).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HubSettings {
    /// `HF_ENDPOINT`, without a trailing `/`.
    pub endpoint: Option<String>,
    /// `HF_TOKEN`, else the token file `huggingface_hub` reads.
    pub token: Option<Token>,
}

impl HubSettings {
    /// From the process environment.
    pub fn from_process() -> Result<Self, HubEnvError> {
        Self::from_lookup(&|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// From `lookup(NAME)`, by the rules of [`HubEnv::from_lookup`] (no
    /// cache folder is needed).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, HubEnvError> {
        let endpoint = endpoint_of(lookup)?;
        let token = token_of(lookup, hf_home_of(lookup).as_deref())?;
        let goes_to = endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT);
        if token.is_some() && !token_may_go_to(goes_to) {
            return Err(HubEnvError::TokenOverHttp(goes_to.to_string()));
        }
        Ok(HubSettings { endpoint, token })
    }
}

impl Token {
    /// Wraps a token's text (as a job carried it).
    pub fn new(text: &str) -> Option<Token> {
        let t = text.trim();
        (!t.is_empty()).then(|| Token(t.to_string()))
    }
}

/// `HF_ENDPOINT`, checked and without a trailing `/`; `None` when unset.
fn endpoint_of(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, HubEnvError> {
    let Some(endpoint) = lookup("HF_ENDPOINT") else {
        return Ok(None);
    };
    let endpoint = endpoint.trim_end_matches('/').to_string();
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(HubEnvError::NotHttp(endpoint));
    }
    Ok(Some(endpoint))
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
fn hf_home_of(lookup: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let home = lookup("HOME").map(PathBuf::from);
    lookup("HF_HOME").map(PathBuf::from).or_else(|| {
        lookup("XDG_CACHE_HOME")
            .map(|x| Path::new(&x).join("huggingface"))
            .or_else(|| home.as_ref().map(|h| h.join(".cache/huggingface")))
    })
}

/// `HF_TOKEN`, else the file `HF_TOKEN_PATH`, else `$HF_HOME/token`.
fn token_of(
    lookup: &dyn Fn(&str) -> Option<String>,
    hf_home: Option<&Path>,
) -> Result<Option<Token>, HubEnvError> {
    let token = match lookup("HF_TOKEN") {
        Some(t) => Some(t),
        None => {
            let path = lookup("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .or_else(|| hf_home.map(|h| h.join("token")));
            match path {
                Some(p) => read_token(&p)?,
                None => None,
            }
        }
    };
    Ok(token.as_deref().and_then(Token::new))
}

/// Whether a token may be sent to `endpoint`: over https, or over plain
/// http only to this machine (a loopback address or `localhost`).
fn token_may_go_to(endpoint: &str) -> bool {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        return true;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A token file's contents; a missing file is no token.
fn read_token(path: &Path) -> Result<Option<String>, HubEnvError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HubEnvError::TokenFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<HubEnv, HubEnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubEnv::from_lookup(&|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_follow_home() {
        let e = env(&[("HOME", "/home/u")]).unwrap();
        assert_eq!(e.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(
            e.cache_root,
            PathBuf::from("/home/u/.cache/huggingface/hub")
        );
        assert_eq!(e.token, None);
        let e = env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]).unwrap();
        assert_eq!(e.cache_root, PathBuf::from("/xdg/huggingface/hub"));
    }

    #[test]
    fn precedence_matches_huggingface_hub() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("hf");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("token"), "hf_home_token\n").unwrap();
        let other = t.path().join("tok");
        std::fs::write(&other, "hf_path_token").unwrap();
        let h = home.to_str().unwrap();
        let o = other.to_str().unwrap();

        let e = env(&[("HF_HOME", h), ("HF_ENDPOINT", "http://127.0.0.1:8090/")]).unwrap();
        assert_eq!(e.endpoint, "http://127.0.0.1:8090");
        assert_eq!(e.cache_root, home.join("hub"));
        assert_eq!(e.token.as_ref().map(Token::expose), Some("hf_home_token"));

        let e = env(&[("HF_HOME", h), ("HF_TOKEN_PATH", o)]).unwrap();
        assert_eq!(e.token.as_ref().map(Token::expose), Some("hf_path_token"));

        let e = env(&[("HF_HOME", h), ("HF_TOKEN_PATH", o), ("HF_TOKEN", "hf_env")]).unwrap();
        assert_eq!(e.token.as_ref().map(Token::expose), Some("hf_env"));

        let e = env(&[("HF_HOME", h), ("HF_HUB_CACHE", "/fast/hub")]).unwrap();
        assert_eq!(e.cache_root, PathBuf::from("/fast/hub"));

        // A token path that does not exist is no token, not an error.
        let e = env(&[
            ("HF_HOME", "/nonexistent"),
            ("HF_TOKEN_PATH", "/nonexistent/t"),
        ])
        .unwrap();
        assert_eq!(e.token, None);
    }

    #[test]
    fn bad_endpoint_and_no_home_are_clear_errors() {
        let e = env(&[("HOME", "/h"), ("HF_ENDPOINT", "hf-mirror.com")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("HF_ENDPOINT") && e.contains("https://"), "{e}");
        let e = env(&[]).unwrap_err().to_string();
        assert!(e.contains("HF_HUB_CACHE"), "{e}");
    }

    #[test]
    fn a_token_goes_over_plain_http_only_to_this_machine_and_never_shows_in_debug() {
        for local in [
            "http://127.0.0.1:8080",
            "http://localhost:1",
            "http://[::1]:9/hub",
            "https://hf-mirror.com",
        ] {
            let e = env(&[
                ("HOME", "/h"),
                ("HF_ENDPOINT", local),
                ("HF_TOKEN", "hf_secret"),
            ])
            .unwrap_or_else(|e| panic!("{local}: {e}"));
            assert!(!format!("{e:?}").contains("hf_secret"), "{e:?}");
        }
        let why = env(&[
            ("HOME", "/h"),
            ("HF_ENDPOINT", "http://mirror.example:8080"),
            ("HF_TOKEN", "hf_secret"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            why.contains("plain http") && why.contains("unset HF_TOKEN"),
            "{why}"
        );
        assert!(!why.contains("hf_secret"), "{why}");
        // Without a token a plain-http mirror is fine.
        assert!(env(&[("HOME", "/h"), ("HF_ENDPOINT", "http://mirror.example")]).is_ok());
    }

    fn settings(vars: &[(&str, &str)]) -> Result<HubSettings, HubEnvError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubSettings::from_lookup(&|k| map.get(k).cloned())
    }

    #[test]
    fn a_jobs_settings_take_over_and_the_agents_token_stays_with_its_endpoint() {
        // The operator set nothing: nothing is sent, the agent decides.
        let none = settings(&[("HF_HOME", "/nonexistent")]).unwrap();
        assert_eq!(none, HubSettings::default());
        let agent = env(&[
            ("HOME", "/h"),
            ("HF_ENDPOINT", "https://agent.example"),
            ("HF_TOKEN", "hf_agent"),
        ])
        .unwrap();
        let same = agent.clone().with_job(&none).unwrap();
        assert_eq!(same, agent);

        // The operator's endpoint and token win.
        let op = settings(&[
            ("HF_HOME", "/nonexistent"),
            ("HF_ENDPOINT", "http://127.0.0.1:8090/"),
            ("HF_TOKEN", "hf_op"),
        ])
        .unwrap();
        assert_eq!(op.endpoint.as_deref(), Some("http://127.0.0.1:8090"));
        assert!(!format!("{op:?}").contains("hf_op"), "{op:?}");
        let e = agent.clone().with_job(&op).unwrap();
        assert_eq!(e.endpoint, "http://127.0.0.1:8090");
        assert_eq!(e.token.as_ref().map(Token::expose), Some("hf_op"));
        assert_eq!(e.cache_root, agent.cache_root);

        // An endpoint without a token: the agent's token does not follow.
        let ep_only = HubSettings {
            endpoint: Some("https://elsewhere.example".into()),
            token: None,
        };
        assert_eq!(agent.clone().with_job(&ep_only).unwrap().token, None);

        // A token to a plain-http endpoint of another machine is refused,
        // at the operator and at the agent alike.
        let why = settings(&[
            ("HF_HOME", "/nonexistent"),
            ("HF_ENDPOINT", "http://mirror.example"),
            ("HF_TOKEN", "hf_op"),
        ])
        .unwrap_err()
        .to_string();
        assert!(why.contains("plain http"), "{why}");
        let plain = env(&[("HOME", "/h"), ("HF_ENDPOINT", "http://mirror.example")]).unwrap();
        let token_only = HubSettings {
            endpoint: None,
            token: Token::new("hf_op"),
        };
        assert!(plain.with_job(&token_only).is_err());
        assert!(settings(&[("HF_ENDPOINT", "mirror.example")]).is_err());
    }
}
