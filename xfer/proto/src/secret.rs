//! A secret a request carries (the operator's Hub token), whose `Debug`
//! form never shows it: shared by the admin service (a sync job's token)
//! and the transfer service (an intake ask's), so neither imports the
//! other for it.

use serde::{Deserialize, Serialize};

/// A secret carried by a request (the operator's Hub token). Its `Debug`
/// form never shows it, so no log line or error dump can leak it;
/// [`Secret::expose`] is the one way to the text.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: String) -> Secret {
        Secret(text)
    }

    /// The secret's text, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
