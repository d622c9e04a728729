//! The cluster credential and the mutual-TLS configurations built from it.
//!
//! `xfer keygen` writes one secret: the private key of a cluster certificate
//! authority. Every node holds the same file. At start-up each process
//! rebuilds the CA certificate from that key (same name, same public key, so
//! the same trust anchor), mints a fresh leaf certificate signed by it, and
//! requires the peer's leaf to chain to that CA, in both directions. rustls
//! does all verification with its standard WebPKI verifiers; nothing here
//! skips or weakens a check. A process without the key cannot get a leaf the
//! others accept, so it can neither read nor write anything.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use xfer_proto::hash::Hash;
use xfer_proto::names::alpn_offers;

/// The name every node's certificate carries and every client checks.
pub const SERVER_NAME: &str = "xfer-node";
const CA_NAME: &str = "xfer cluster CA";

/// A loaded cluster credential.
pub struct Credential {
    ca_key: KeyPair,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential(cluster {})", self.cluster_id().short())
    }
}

/// Writes a new credential to `out` (mode 0600). Refuses to overwrite an
/// existing file unless `force`, and never writes through a symlink.
pub fn keygen(out: &Path, force: bool) -> Result<Credential> {
    if fs::symlink_metadata(out).is_ok_and(|m| m.file_type().is_symlink()) {
        bail!(
            "{} is a symlink; xfer keygen never writes through one. Remove it, or give --out the real path",
            out.display()
        );
    }
    if out.exists() && !force {
        bail!(
            "{} already exists; it may be the key your agents use. Pass --force to replace it",
            out.display()
        );
    }
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
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
        .with_context(|| format!("cannot write {}", out.display()))?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    writeln!(
        f,
        "# xfer cluster credential: every node of one cluster uses this same file.\n\
         # Keep it secret (mode 0600); anyone holding it can join the cluster."
    )?;
    f.write_all(key.serialize_pem().as_bytes())?;
    f.sync_all()?;
    Ok(Credential { ca_key: key })
}

impl Credential {
    /// Loads the credential file written by `xfer keygen`.
    pub fn load(path: &Path) -> Result<Credential> {
        let text = fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read cluster key {}; create one with `xfer keygen --out {}` and copy it to every node",
                path.display(),
                path.display()
            )
        })?;
        let der = rustls_pemfile::private_key(&mut text.as_bytes())
            .ok()
            .flatten()
            .with_context(|| {
                format!(
                    "{} holds no private key; it is not an xfer cluster key (make one with `xfer keygen`)",
                    path.display()
                )
            })?;
        let PrivateKeyDer::Pkcs8(pkcs8) = der else {
            bail!(
                "{} is not a PKCS#8 key written by `xfer keygen`",
                path.display()
            );
        };
        let ca_key = KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &PKCS_ECDSA_P256_SHA256)
            .with_context(|| format!("{} is not an xfer cluster key", path.display()))?;
        // A key others can read is a key others hold: refused, not warned of.
        let mode = fs::metadata(path)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            bail!(
                "{} is open to other users (mode {mode:o}), and anyone who can read it can join the cluster; run `chmod 600 {}`",
                path.display(),
                path.display()
            );
        }
        Ok(Credential { ca_key })
    }

    /// A short public identifier of the cluster: BLAKE3 of the CA public key.
    /// Safe to print; equal on every node of one cluster.
    pub fn cluster_id(&self) -> Hash {
        blake3::hash(&self.ca_key.public_key_der()).into()
    }

    fn ca(&self) -> Result<rcgen::Certificate> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, CA_NAME);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(p.self_signed(&self.ca_key)?)
    }

    fn identity(
        &self,
    ) -> Result<(
        rustls::RootCertStore,
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
    )> {
        let ca = self.ca()?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der().clone())?;
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut p = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
        p.distinguished_name.push(DnType::CommonName, "xfer node");
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf = p.signed_by(&leaf_key, &ca, &self.ca_key)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        Ok((roots, vec![leaf.der().clone()], key))
    }

    /// TLS 1.3 server config that demands a client certificate from this cluster.
    pub fn server_config(&self) -> Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (roots, chain, key) = self.identity()?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)?;
        cfg.alpn_protocols = alpn_offers();
        Ok(cfg)
    }

    /// TLS 1.3 client config that presents this node's certificate and only
    /// trusts servers of this cluster.
    pub fn client_config(&self) -> Result<rustls::ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (roots, chain, key) = self.identity()?;
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        cfg.alpn_protocols = alpn_offers();
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_then_load_gives_the_same_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        let a = keygen(&p, false).unwrap();
        assert!(keygen(&p, false).is_err(), "must not overwrite silently");
        let b = Credential::load(&p).unwrap();
        assert_eq!(a.cluster_id(), b.cluster_id());
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        b.server_config().unwrap();
        b.client_config().unwrap();
    }

    #[test]
    fn junk_keys_are_refused_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        fs::write(&p, "hello").unwrap();
        let e = format!("{:#}", Credential::load(&p).unwrap_err());
        assert!(e.contains("xfer keygen"), "{e}");
        let e = format!(
            "{:#}",
            Credential::load(&dir.path().join("missing")).unwrap_err()
        );
        assert!(e.contains("xfer keygen"), "{e}");
    }
}
