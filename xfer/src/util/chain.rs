//! An error of a layer that has no typed error yet (the store's scan, the
//! transport's address lookup, the registry client, the Hub's pull): its
//! whole chain kept and printed on one line, `outer: cause: cause`, as
//! `anyhow`'s `{:#}` prints it. Not permanent: whoever knows better wraps
//! it in a variant that says so.

use std::fmt;

/// An untyped error chain, kept whole.
pub struct Chain(anyhow::Error);

impl Chain {
    /// Each link of the chain, outermost first (for the layer that owns a
    /// link's type to recognise it).
    pub fn links(&self) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
        self.0.chain()
    }

    /// The chain as the layer below gave it.
    pub fn into_inner(self) -> anyhow::Error {
        self.0
    }
}

impl From<anyhow::Error> for Chain {
    fn from(e: anyhow::Error) -> Chain {
        Chain(e)
    }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Its Display is the whole chain: it names no source, so a chain printed
/// again with `{:#}` says each cause once.
impl std::error::Error for Chain {}

impl super::permanence::Permanence for Chain {
    fn is_permanent(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_prints_every_cause_once_as_anyhow_did() {
        let e = anyhow::anyhow!("disk gone").context("cannot read /m");
        let want = format!("{e:#}");
        let c = Chain::from(e);
        assert_eq!(c.to_string(), "cannot read /m: disk gone");
        assert_eq!(c.to_string(), want);
        assert_eq!(format!("{:#}", anyhow::Error::new(c)), want);
    }
}
