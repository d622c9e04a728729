//! The cluster certificate authority, kept by the operator in one folder
//! and never copied to a node: `xfer ca init`, `issue`, `rotate` and
//! `rotate --finish`.
//!
//! The folder holds:
//! - `ca.key` (0600): the CA's private key, the one secret that can mint
//!   identities;
//! - `ca.crt`: its certificate, the trust anchor every credential carries;
//! - during a rotation only, `previous.crt` (the old CA, still trusted)
//!   and `cross.crt` (the new CA's certificate signed by the old key).
//!
//! A credential `issue` writes holds the node's own certificate (named
//! after the node, carrying its role, valid for `--days`), its private
//! key, and the anchors to trust. During a rotation the chain also holds
//! `cross.crt`, so an agent that still trusts only the old CA accepts the
//! new certificate, while new credentials trust both CAs: the cluster
//! moves over one node at a time, without a flag day. The old private key
//! is deleted when the rotation begins: only its certificate is needed.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

use super::identity::{Identity, ORGANISATION};
use super::{key_id, write_private, SERVER_NAME};
use xfer_proto::hash::Hash;

/// How long an issued certificate lasts unless `--days` says otherwise:
/// short enough that a stolen one expires, long enough for a monthly
/// renewal.
pub const DEFAULT_DAYS: u32 = 30;

/// The longest validity `issue` accepts.
pub const MAX_DAYS: u32 = 398;

const KEY: &str = "ca.key";
const CERT: &str = "ca.crt";
const PREVIOUS: &str = "previous.crt";
const CROSS: &str = "cross.crt";

/// An operator's CA folder.
pub struct CaDir {
    dir: PathBuf,
}

/// What `issue` wrote.
pub struct Issued {
    pub identity: Identity,
    pub cluster: Hash,
    pub not_after: time::OffsetDateTime,
    pub rotating: bool,
}

impl CaDir {
    pub fn new(dir: &Path) -> CaDir {
        CaDir {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Creates a new CA in the folder (made 0700 if missing). Refuses to
    /// replace one unless `force`: every credential it issued would stop
    /// working.
    pub fn init(&self, force: bool) -> Result<Hash> {
        make_private_dir(&self.dir)?;
        if self.path(KEY).exists() && !force {
            bail!(
                "{} already holds a CA; replacing it would invalidate every credential it issued. Use `xfer ca rotate` to change it, or pass --force",
                self.dir.display()
            );
        }
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        write_private(&self.path(KEY), key.serialize_pem().as_bytes(), force)?;
        write_public(&self.path(CERT), &ca_certificate(&key)?.pem())?;
        for stale in [PREVIOUS, CROSS] {
            let _ = fs::remove_file(self.path(stale));
        }
        Ok(key_id(&key))
    }

    fn key(&self) -> Result<KeyPair> {
        let path = self.path(KEY);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {}; create the CA with `xfer ca init --dir {}`",
                path.display(),
                self.dir.display()
            )
        })?;
        super::refuse_shared_secret(&path)?;
        KeyPair::from_pem(&text).with_context(|| {
            format!(
                "{} is not a CA key written by `xfer ca init`",
                path.display()
            )
        })
    }

    fn read_public(&self, name: &str) -> Result<Option<String>> {
        match fs::read_to_string(self.path(name)) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", self.path(name).display())),
        }
    }

    /// Writes a credential for `identity`, valid for `days`, to `out`
    /// (0600; an existing file only with `force`, never through a symlink).
    pub fn issue(&self, identity: &Identity, days: u32, out: &Path, force: bool) -> Result<Issued> {
        if days == 0 || days > MAX_DAYS {
            bail!("--days {days}: give 1 to {MAX_DAYS} days (renew with `xfer ca issue` before it ends)");
        }
        let ca_key = self.key()?;
        let ca = ca_certificate(&ca_key)?;
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let now = time::OffsetDateTime::now_utc();
        let not_after = now + time::Duration::days(days.into());
        let mut p = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
        p.distinguished_name
            .push(DnType::OrganizationName, ORGANISATION);
        p.distinguished_name
            .push(DnType::OrganizationalUnitName, identity.role.as_str());
        p.distinguished_name
            .push(DnType::CommonName, identity.name.as_str());
        // A little slack for clocks that disagree by a few minutes.
        p.not_before = now - time::Duration::minutes(10);
        p.not_after = not_after;
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf = p.signed_by(&leaf_key, &ca, &ca_key)?;
        let cross = self.read_public(CROSS)?;
        let previous = self.read_public(PREVIOUS)?;
        let cluster = key_id(&ca_key);
        let mut text = format!(
            "# xfer credential of {identity}, cluster {}, valid until {} (UTC).\n\
             # Keep it secret (mode 0600) on {} only; renew it with `xfer ca issue`.\n",
            cluster.short(),
            not_after.date(),
            identity.name
        );
        text.push_str(&leaf.pem());
        if let Some(cross) = &cross {
            text.push_str(cross);
        }
        text.push_str(&leaf_key.serialize_pem());
        text.push_str(&ca.pem());
        if let Some(previous) = &previous {
            text.push_str(previous);
        }
        write_private(out, text.as_bytes(), force)?;
        Ok(Issued {
            identity: identity.clone(),
            cluster,
            not_after,
            rotating: cross.is_some(),
        })
    }

    /// Begins a rotation: a new CA key replaces the old, whose certificate
    /// stays trusted (`previous.crt`) and signs the new one (`cross.crt`).
    pub fn rotate(&self) -> Result<Hash> {
        if self.path(PREVIOUS).exists() {
            bail!(
                "a rotation is already under way in {}; reissue every credential, then run `xfer ca rotate --finish --dir {}`",
                self.dir.display(),
                self.dir.display()
            );
        }
        let old_key = self.key()?;
        let old = ca_certificate(&old_key)?;
        let new_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cross = ca_params(&new_key)?.signed_by(&new_key, &old, &old_key)?;
        write_public(&self.path(PREVIOUS), &old.pem())?;
        write_public(&self.path(CROSS), &cross.pem())?;
        write_public(&self.path(CERT), &ca_certificate(&new_key)?.pem())?;
        // The new key replaces the old in place, atomically.
        let tmp = self.path("ca.key.new");
        let _ = fs::remove_file(&tmp);
        write_private(&tmp, new_key.serialize_pem().as_bytes(), false)?;
        fs::rename(&tmp, self.path(KEY))?;
        super::sync_dir(&self.dir)?;
        Ok(key_id(&new_key))
    }

    /// Ends a rotation: the old CA is no longer trusted by credentials
    /// issued from now on.
    pub fn finish(&self) -> Result<Hash> {
        if !self.path(PREVIOUS).exists() {
            bail!(
                "no rotation is under way in {}; start one with `xfer ca rotate --dir {}`",
                self.dir.display(),
                self.dir.display()
            );
        }
        let key = self.key()?;
        fs::remove_file(self.path(CROSS)).or_else(ignore_missing)?;
        fs::remove_file(self.path(PREVIOUS))?;
        super::sync_dir(&self.dir)?;
        Ok(key_id(&key))
    }
}

fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound {
        Ok(())
    } else {
        Err(e)
    }
}

/// The parameters of a CA certificate for `key`. Its name includes the
/// key's id, so an old and a new CA never share a subject.
fn ca_params(key: &KeyPair) -> Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name
        .push(DnType::OrganizationName, ORGANISATION);
    p.distinguished_name.push(
        DnType::CommonName,
        format!("xfer cluster CA {}", key_id(key).short()),
    );
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// The self-signed certificate of a CA key (rebuilt from the key alone:
/// same subject and public key, so the same trust anchor).
fn ca_certificate(key: &KeyPair) -> Result<Certificate> {
    Ok(ca_params(key)?.self_signed(key)?)
}

fn make_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    Ok(())
}

/// A public file of the CA folder, replaced atomically.
fn write_public(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(())
}
