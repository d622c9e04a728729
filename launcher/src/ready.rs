//! Readiness of a started engine, as a user would see it: the head's
//! `/health` answers 200 (vLLM and SGLang bind their API port only once the
//! engine is up, and answer 503 once it died), then a one-token completion
//! succeeds. Then a short completion measures the first tokens per second.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

/// What readiness measured.
#[derive(Clone, Debug, Serialize)]
pub struct Readiness {
    /// The API's base URL.
    pub url: String,
    /// The one-token completion's latency.
    pub first_token_ms: f64,
    /// Tokens of the measuring completion.
    pub completion_tokens: u64,
    /// How long it took.
    pub completion_s: f64,
    /// `completion_tokens / completion_s`.
    pub tokens_per_s: f64,
    /// What the engine answered.
    pub text: String,
    /// When the one-token completion answered: the model serves from then.
    #[serde(skip)]
    pub answered_at: Option<std::time::Instant>,
}

/// Why the API did not answer as a ready engine does; each names the URL.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No HTTP answer (connection refused, timeout...), with every cause.
    #[error("{url}: {cause}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// The error and its causes, joined by `: `.
        cause: String,
    },
    /// `/health` answered, but not 200.
    #[error("{url} answered {status}")]
    Unhealthy {
        /// The URL asked.
        url: String,
        /// What it answered.
        status: reqwest::StatusCode,
    },
    /// A completion was refused, with the engine's message (or the start
    /// of its answer).
    #[error("{url} answered {status}: {message}")]
    Refused {
        /// The URL asked.
        url: String,
        /// What it answered.
        status: reqwest::StatusCode,
        /// The engine's `error.message`, or the first 200 characters.
        message: String,
    },
    /// A completion's answer is not JSON.
    #[error("{url} answered something that is not JSON: {source}")]
    NotJson {
        /// The URL asked.
        url: String,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// A client for the engine's OpenAI-compatible API.
pub struct Api {
    base: String,
    model: String,
    http: reqwest::Client,
}

impl Api {
    /// A client of the API at `base` (`http://HOST:PORT`), asking `model`.
    pub fn new(base: String, model: String) -> Api {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .expect("a client with no TLS roots to load always builds");
        Api { base, model, http }
    }

    /// The API's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether `/health` answers 200 now; the error says what it answered.
    pub async fn healthy(&self) -> Result<(), ApiError> {
        let url = format!("{}/health", self.base);
        let r = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(3))
            .send()
            .await
            .map_err(|e| unreachable(&url, &e))?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(ApiError::Unhealthy {
                url,
                status: r.status(),
            })
        }
    }

    /// One completion of `max_tokens`: (tokens generated, text, seconds).
    pub async fn complete(
        &self,
        prompt: &str,
        max_tokens: u64,
    ) -> Result<(u64, String, f64), ApiError> {
        let url = format!("{}/v1/completions", self.base);
        let body = json!({"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
        let t = Instant::now();
        let r = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| unreachable(&url, &e))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| unreachable(&url, &e))?;
        let secs = t.elapsed().as_secs_f64();
        if !status.is_success() {
            let msg = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| text.chars().take(200).collect());
            return Err(ApiError::Refused {
                url,
                status,
                message: msg,
            });
        }
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ApiError::NotJson { url, source })?;
        let out = v["choices"][0]["text"].as_str().unwrap_or("").to_string();
        let tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        Ok((tokens, out, secs))
    }

    /// The one-token readiness completion, then the tokens-per-second one.
    pub async fn measure(&self) -> Result<Readiness, ApiError> {
        let (_, _, first) = self.complete("Hello", 1).await?;
        let answered_at = Some(std::time::Instant::now());
        let (tokens, text, secs) = self.complete("The capital of France is", 32).await?;
        Ok(Readiness {
            url: self.base.clone(),
            first_token_ms: first * 1000.0,
            completion_tokens: tokens,
            completion_s: secs,
            tokens_per_s: if secs > 0.0 {
                tokens as f64 / secs
            } else {
                0.0
            },
            text,
            answered_at,
        })
    }
}

fn unreachable(url: &str, e: &reqwest::Error) -> ApiError {
    ApiError::Unreachable {
        url: url.to_string(),
        cause: describe(e),
    }
}

fn describe(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s = format!("{s}: {c}");
        src = c.source();
    }
    s
}
