//! An RDMA port's state and link layer, as sysfs writes them ("4:
//! ACTIVE", "InfiniBand"): parsed once by the node's sysfs reader
//! (`xfer::sysinfo::rdma`) and carried typed in the preflight's facts.
//! Both travel as their text, so a JSON report keeps sysfs's words.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A port's state, parsed from what sysfs writes ("4: ACTIVE").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortState {
    /// "1: DOWN".
    Down,
    /// "2: INIT".
    Init,
    /// "3: ARMED".
    Armed,
    /// "4: ACTIVE": the port can carry data.
    Active,
    /// "5: ACTIVE_DEFER".
    ActiveDefer,
    /// A name this reader does not know, as written.
    Other(String),
    /// The `state` file could not be read.
    Unreadable,
}

impl PortState {
    /// Parses sysfs's `state` text ("4: ACTIVE"; the number is optional);
    /// `None` is an unreadable file.
    pub fn parse(text: Option<&str>) -> PortState {
        let Some(text) = text else {
            return PortState::Unreadable;
        };
        match text.split_once(':').map_or(text, |(_, n)| n).trim() {
            "DOWN" => PortState::Down,
            "INIT" => PortState::Init,
            "ARMED" => PortState::Armed,
            "ACTIVE" => PortState::Active,
            "ACTIVE_DEFER" => PortState::ActiveDefer,
            other => PortState::Other(other.to_string()),
        }
    }

    /// The state's name ("ACTIVE", "DOWN", ...) without its number;
    /// "unreadable" when the file could not be read.
    pub fn name(&self) -> &str {
        match self {
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
            PortState::Other(name) => name,
            PortState::Unreadable => "unreadable",
        }
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A port's link layer, parsed from sysfs's `link_layer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// "InfiniBand".
    InfiniBand,
    /// "Ethernet": RoCE.
    Ethernet,
    /// Any other text, as written.
    Other(String),
}

impl LinkLayer {
    /// Parses sysfs's `link_layer` text.
    pub fn parse(text: &str) -> LinkLayer {
        match text.trim() {
            "InfiniBand" => LinkLayer::InfiniBand,
            "Ethernet" => LinkLayer::Ethernet,
            other => LinkLayer::Other(other.to_string()),
        }
    }

    /// As sysfs writes it ("InfiniBand", "Ethernet").
    pub fn as_str(&self) -> &str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Other(text) => text,
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Serialized as sysfs writes it, so reports keep the text.
impl Serialize for LinkLayer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for LinkLayer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(LinkLayer::parse(&String::deserialize(d)?))
    }
}

/// Serialized by its name ("ACTIVE"; "unreadable" when sysfs's file
/// could not be read).
impl Serialize for PortState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for PortState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "unreadable" => PortState::Unreadable,
            t => PortState::parse(Some(t)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_layers_travel_as_their_text() {
        for s in [
            PortState::Active,
            PortState::Down,
            PortState::Unreadable,
            PortState::Other("POLLING".into()),
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(
                serde_json::from_str::<PortState>(&json).unwrap(),
                s,
                "{json}"
            );
        }
        assert_eq!(PortState::parse(Some("4: ACTIVE")), PortState::Active);
        for l in [
            LinkLayer::InfiniBand,
            LinkLayer::Ethernet,
            LinkLayer::Other("x".into()),
        ] {
            let json = serde_json::to_string(&l).unwrap();
            assert_eq!(
                serde_json::from_str::<LinkLayer>(&json).unwrap(),
                l,
                "{json}"
            );
        }
    }
}
