//! Who a certificate says its holder is. `xfer ca issue` writes a node's
//! name and role into its leaf certificate's subject (CN = the node's name
//! in the cluster file, OU = its role, O = `xfer`); an agent reads them
//! back from a peer's verified certificate to decide what that peer may
//! ask, and a client reads them to check that the agent it reached is
//! the node it meant.

use std::fmt;

use xfer_proto::names::NodeName;

/// The organisation every issued certificate carries.
pub const ORGANISATION: &str = "xfer";

/// What a certificate's holder may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An agent: serves and receives models, reports status, and asks
    /// the nodes of a run it belongs to to stop it.
    Node,
    /// A person or tool driving the cluster: sync jobs from any exported
    /// path, removals, launches, logs.
    Operator,
}

impl Role {
    /// The word written into certificates and shown to users.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Operator => "operator",
        }
    }

    /// The role a certificate's OU names.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "node" => Some(Role::Node),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name and role, as an issued certificate states them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The holder's name (a node, or an operator).
    pub name: NodeName,
    /// What the holder may do.
    pub role: Role,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.role, self.name)
    }
}

/// Who is on the other end of an authenticated connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Simple mode: a holder of the one cluster key. It is equivalent to
    /// root on every node, so it may ask anything.
    ClusterKey,
    /// A holder of a certificate the cluster CA issued.
    Issued(Identity),
}

impl Peer {
    /// Whether this peer may do what only an operator may.
    pub fn is_operator(&self) -> bool {
        match self {
            Peer::ClusterKey => true,
            Peer::Issued(id) => id.role == Role::Operator,
        }
    }

    /// The node name its certificate carries (none in simple mode).
    pub fn name(&self) -> Option<&NodeName> {
        match self {
            Peer::ClusterKey => None,
            Peer::Issued(id) => Some(&id.name),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::ClusterKey => f.write_str("a holder of the cluster key"),
            Peer::Issued(id) => id.fmt(f),
        }
    }
}

/// Why a certificate names no xfer identity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not a certificate that parses (the parser's words).
    #[error("unreadable certificate: {0}")]
    Unreadable(String),
    /// Its subject has no `O=xfer`.
    #[error("the certificate was not issued by `xfer ca issue` (its subject has no O=xfer)")]
    NotXfer,
    /// Its subject has no common name.
    #[error("the certificate names no node (no CN); reissue it with `xfer ca issue`")]
    NoName,
    /// Its common name is not a valid node name (why).
    #[error(transparent)]
    BadName(xfer_proto::names::NodeNameError),
    /// Its subject has no known role.
    #[error(
        "the certificate names no role (OU node or operator); reissue it with `xfer ca issue`"
    )]
    NoRole,
}

/// Reads the identity from a leaf certificate (DER). The chain has been
/// verified by rustls before this is asked; this only reads the subject.
pub fn identity_of(der: &[u8]) -> Result<Identity, IdentityError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| IdentityError::Unreadable(e.to_string()))?;
    let subject = cert.subject();
    let first = |it: &mut dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue>| {
        it.next().and_then(|a| a.as_str().ok()).map(str::to_string)
    };
    let org = first(&mut subject.iter_organization());
    let name = first(&mut subject.iter_common_name());
    let role = first(&mut subject.iter_organizational_unit());
    if org.as_deref() != Some(ORGANISATION) {
        return Err(IdentityError::NotXfer);
    }
    let name = name.ok_or(IdentityError::NoName)?;
    let name = NodeName::new(&name).map_err(IdentityError::BadName)?;
    let role = role
        .as_deref()
        .and_then(Role::parse)
        .ok_or(IdentityError::NoRole)?;
    Ok(Identity { name, role })
}
