//! The credentials of a cluster and the mutual-TLS configurations built
//! from them. Two kinds of credential file are accepted:
//!
//! - **Issued** (`xfer ca issue`): a node's own certificate and key,
//!   named after the node and carrying its role, plus the CA certificates
//!   to trust. The CA's key stays with the operator ([`ca`]). A stolen
//!   node disk yields that node's identity until its certificate expires,
//!   and nothing more.
//! - **Simple mode** (`xfer keygen`): one CA private key that every node
//!   holds. Each process mints a fresh leaf from it at start-up. Anyone
//!   holding the file is equivalent to root on every node.
//!
//! Either way rustls does every verification with its standard WebPKI
//! verifiers, in both directions, over TLS 1.3 only; nothing here skips or
//! weakens a check. Who the peer is ([`Peer`]) is read from its verified
//! certificate afterwards.

pub mod ca;
mod error;
pub mod identity;
mod live;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

pub use self::error::CredError;
use self::identity::{identity_of, Identity, IdentityError, Peer, Role};
use self::live::{Live, Tls};
use xfer_proto::hash::Hash;
use xfer_proto::names::alpn_offers;

/// The name every node's certificate carries and every client checks in
/// the handshake; which node it is, is read from the subject afterwards.
pub const SERVER_NAME: &str = "xfer-node";
const CA_NAME: &str = "xfer cluster CA";

/// A loaded credential, reloadable in place ([`Credential::reload`]).
pub struct Credential {
    path: PathBuf,
    live: Live,
    facts: RwLock<Facts>,
}

/// What a credential says about its holder.
#[derive(Clone, Debug)]
pub struct Facts {
    /// BLAKE3 of the public key of the CA that signed this credential:
    /// equal on every node of one cluster. Safe to print.
    pub cluster: Hash,
    /// The holder's name and role; `None` in simple mode.
    pub me: Option<Identity>,
    /// When the certificate expires; `None` in simple mode.
    pub not_after: Option<time::OffsetDateTime>,
    /// The credential trusts more than one CA (a rotation is under way).
    pub rotating: bool,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let facts = self.facts();
        match &facts.me {
            Some(me) => write!(f, "Credential({me}, cluster {})", facts.cluster.short()),
            None => write!(f, "Credential(cluster key {})", facts.cluster.short()),
        }
    }
}

/// Writes a new simple-mode cluster key to `out` (mode 0600). Refuses to
/// overwrite an existing file unless `force`, and never writes through a
/// symlink.
pub fn keygen(out: &Path, force: bool) -> Result<Credential, CredError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let text = format!(
        "# xfer cluster key (simple mode): every node of one cluster uses this same file.\n\
         # Anyone who holds it is equivalent to root on every node; keep it secret (mode 0600).\n{}",
        key.serialize_pem()
    );
    write_private(out, text.as_bytes(), force)?;
    Credential::load(out)
}

/// Why a peer is not who it may be, or not who was asked for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The peer sent no certificate.
    #[error("the peer presented no certificate")]
    NoCertificate,
    /// With issued credentials, its certificate names no xfer identity.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The agent asked for as `node` holds a certificate that is not a node's.
    #[error("the agent that answered for {node} holds the certificate of {id}, not of a node; give that agent its node's credential (xfer ca issue {node})")]
    NotANode {
        /// The node asked for.
        node: String,
        /// Who answered.
        id: Identity,
    },
    /// The agent asked for as `node` is another node.
    #[error("the agent that answered for {node} is {id}; fix {node}'s address in the cluster file, or reissue that agent's credential")]
    OtherNode {
        /// The node asked for.
        node: String,
        /// Who answered.
        id: Identity,
    },
}

/// Writes a secret file: mode 0600, never through a symlink, and an
/// existing file is replaced only with `force`.
pub(crate) fn write_private(out: &Path, bytes: &[u8], force: bool) -> Result<(), CredError> {
    if fs::symlink_metadata(out).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(CredError::Symlink(out.to_path_buf()));
    }
    if out.exists() && !force {
        return Err(CredError::Exists(out.to_path_buf()));
    }
    let mut opts = fs::OpenOptions::new();
    opts.write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    if force {
        opts.create(true).truncate(true);
    } else {
        // Exclusive: a file that appeared since the check is not replaced.
        opts.create_new(true);
    }
    let mut f = opts
        .open(out)
        .map_err(CredError::io(format!("cannot write {}", out.display())))?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    if let Some(dir) = out.parent() {
        sync_dir(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })?;
    }
    Ok(())
}

/// A key others can read is a key others hold: refused, not warned of.
pub(crate) fn refuse_shared_secret(path: &Path) -> Result<(), CredError> {
    let mode = fs::metadata(path)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(CredError::Shared {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Makes the entries of `dir` (a rename, a new file) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CredError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CredError::io(format!("cannot sync {}", dir.display())))
}

/// The id of a CA key: BLAKE3 of its SubjectPublicKeyInfo.
pub(crate) fn key_id(key: &KeyPair) -> Hash {
    blake3::hash(&key.public_key_der()).into()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Credential {
    /// Loads a credential file: one `xfer ca issue` wrote, or a simple-mode
    /// key from `xfer keygen`.
    pub fn load(path: &Path) -> Result<Credential, CredError> {
        let (tls, facts) = read(path)?;
        Ok(Credential {
            path: path.to_path_buf(),
            live: Live::new(tls),
            facts: RwLock::new(facts),
        })
    }

    /// Reads the file again (after a renewal or during a rotation): every
    /// handshake from now on uses it. On error the loaded one stays.
    pub fn reload(&self) -> Result<Facts, CredError> {
        let (tls, facts) = read(&self.path)?;
        let before = self.facts();
        if before.me.as_ref().map(|m| &m.name) != facts.me.as_ref().map(|m| &m.name) {
            return Err(CredError::Renamed {
                path: self.path.clone(),
                now: who(&facts),
                was: who(&before),
            });
        }
        self.live.replace(tls);
        *self.facts.write().unwrap() = facts.clone();
        Ok(facts)
    }

    /// What this credential says about its holder.
    pub fn facts(&self) -> Facts {
        self.facts.read().unwrap().clone()
    }

    /// A short public identifier of the cluster: BLAKE3 of the CA public key.
    pub fn cluster_id(&self) -> Hash {
        self.facts().cluster
    }

    /// Who the holder of `leaf` (the peer's verified certificate) is.
    pub fn peer(&self, leaf: Option<&CertificateDer<'_>>) -> Result<Peer, PeerError> {
        let Some(leaf) = leaf else {
            return Err(PeerError::NoCertificate);
        };
        match (identity_of(leaf), &self.facts().me) {
            (Ok(id), _) => Ok(Peer::Issued(id)),
            (Err(_), None) => Ok(Peer::ClusterKey),
            (Err(e), Some(_)) => Err(e.into()),
        }
    }

    /// Checks that the agent that answered (its verified certificate
    /// `leaf`) is `node`: with issued credentials a node's answers can
    /// only come from that node. Simple mode has no names to check.
    pub fn check_node(
        &self,
        leaf: Option<&CertificateDer<'_>>,
        node: &str,
    ) -> Result<(), PeerError> {
        let node = node.to_string();
        match self.peer(leaf)? {
            Peer::ClusterKey => Ok(()),
            Peer::Issued(id) if id.role != Role::Node => Err(PeerError::NotANode { node, id }),
            Peer::Issued(id) if id.name.as_str() != node => Err(PeerError::OtherNode { node, id }),
            Peer::Issued(_) => Ok(()),
        }
    }

    /// TLS 1.3 server config that demands a client certificate from this
    /// cluster.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, CredError> {
        let live = Arc::new(self.live.clone());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(live.clone())
            .with_cert_resolver(live);
        cfg.alpn_protocols = alpn_offers();
        Ok(cfg)
    }

    /// TLS 1.3 client config that presents this credential's certificate
    /// and only trusts servers of this cluster. (`dangerous()` is rustls'
    /// door to a custom verifier; ours forwards to its WebPKI verifier.)
    pub fn client_config(&self) -> Result<rustls::ClientConfig, CredError> {
        let live = Arc::new(self.live.clone());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(live.clone())
            .with_client_cert_resolver(live);
        cfg.alpn_protocols = alpn_offers();
        Ok(cfg)
    }
}

fn who(facts: &Facts) -> String {
    match &facts.me {
        Some(me) => me.to_string(),
        None => "the cluster key".into(),
    }
}

/// Parses a credential file into its TLS pieces and facts.
fn read(path: &Path) -> Result<(Tls, Facts), CredError> {
    let text = fs::read_to_string(path).map_err(CredError::io(
        format!(
            "cannot read credential {}; issue one with `xfer ca issue NAME --dir CA --out {}` (see `xfer ca --help`)",
            path.display(),
            path.display()
        ),
    ))?;
    let mut certs = Vec::new();
    let mut key = None;
    for item in rustls_pemfile::read_all(&mut text.as_bytes()) {
        match item.map_err(|e| CredError::not_a(path, format!(" is not a PEM file: {e}")))? {
            rustls_pemfile::Item::X509Certificate(c) => certs.push(c),
            rustls_pemfile::Item::Pkcs8Key(k) => key = Some(PrivateKeyDer::Pkcs8(k)),
            rustls_pemfile::Item::Sec1Key(k) => key = Some(PrivateKeyDer::Sec1(k)),
            _ => {}
        }
    }
    let key = key.ok_or_else(|| {
        CredError::not_a(
            path,
            " holds no private key; it is not an xfer credential (issue one with `xfer ca issue NAME --dir CA --out FILE`)",
        )
    })?;
    let parsed = if certs.is_empty() {
        simple(path, key)?
    } else {
        issued(path, certs, key)?
    };
    refuse_shared_secret(path)?;
    Ok(parsed)
}

/// Simple mode: the file is the CA key; mint a leaf from it.
fn simple(path: &Path, key: PrivateKeyDer<'static>) -> Result<(Tls, Facts), CredError> {
    let PrivateKeyDer::Pkcs8(pkcs8) = key else {
        return Err(CredError::not_a(
            path,
            " is not a PKCS#8 key written by `xfer keygen`",
        ));
    };
    let ca_key = KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CredError::not_a(path, format!(" is not an xfer cluster key: {e}")))?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = p.self_signed(&ca_key)?;
    let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut p = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
    p.distinguished_name.push(DnType::CommonName, "xfer node");
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let leaf = p.signed_by(&leaf_key, &ca, &ca_key)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let tls = tls(vec![leaf.der().clone()], key, vec![ca.der().clone()])?;
    let facts = Facts {
        cluster: key_id(&ca_key),
        me: None,
        not_after: None,
        rotating: false,
    };
    Ok((tls, facts))
}

/// An issued credential: leaf first, then its chain (certificates signed
/// by another) and the anchors (self-signed), in any order.
fn issued(
    path: &Path,
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<(Tls, Facts), CredError> {
    let leaf = certs[0].clone();
    let me = identity_of(&leaf).map_err(|e| CredError::not_a(path, format!(": {e}")))?;
    let unreadable = |e| CredError::not_a(path, format!(": unreadable certificate: {e}"));
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf).map_err(unreadable)?;
    let not_after = parsed.validity().not_after.to_datetime();
    let not_before = parsed.validity().not_before.to_datetime();
    let now = time::OffsetDateTime::now_utc();
    let renew = format!(
        "renew it with `xfer ca issue {} --role {} --out {} --force`",
        me.name,
        me.role,
        path.display()
    );
    if not_after < now {
        return Err(CredError::Expired {
            path: path.to_path_buf(),
            on: not_after.date(),
            renew,
        });
    }
    if not_before > now {
        return Err(CredError::NotYet {
            path: path.to_path_buf(),
            from: not_before,
        });
    }
    let mut chain = vec![leaf];
    let mut anchors = Vec::new();
    let mut cluster = None;
    for c in &certs[1..] {
        let (_, x) = x509_parser::parse_x509_certificate(c).map_err(unreadable)?;
        if x.subject() == x.issuer() {
            cluster.get_or_insert_with(|| blake3::hash(x.public_key().raw).into());
            anchors.push(c.clone());
        } else {
            chain.push(c.clone());
        }
    }
    let Some(cluster) = cluster else {
        return Err(CredError::not_a(
            path,
            " holds no CA certificate to trust; reissue it with `xfer ca issue`",
        ));
    };
    let rotating = anchors.len() > 1;
    let tls = tls(chain, key, anchors)?;
    let facts = Facts {
        cluster,
        me: Some(me),
        not_after: Some(not_after),
        rotating,
    };
    Ok((tls, facts))
}

fn tls(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    anchors: Vec<CertificateDer<'static>>,
) -> Result<Tls, CredError> {
    let provider = provider();
    let mut roots = rustls::RootCertStore::empty();
    for a in anchors {
        roots.add(a)?;
    }
    let roots = Arc::new(roots);
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()?;
    let servers =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()?;
    let signing = provider.key_provider.load_private_key(key)?;
    Ok(Tls {
        certified: Arc::new(CertifiedKey::new(chain, signing)),
        clients,
        servers,
    })
}

#[cfg(test)]
mod tests;
