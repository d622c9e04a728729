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
//!
//! A rotation writes in an order a crash cannot break: the new key first
//! (`next.key`), then `previous.crt` and `cross.crt`, then the new key
//! renamed over `ca.key`, and the new `ca.crt` last, each durably
//! (temporary, fsync, rename, folder fsync). The next `rotate` reads what
//! a crash left and finishes it (a staged `next.key`, or a `ca.crt` that
//! is not `ca.key`'s), or undoes it when its new key was never kept (a
//! crash of an older xfer, which wrote `ca.crt` first); [`Rotated`] says
//! which.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

use super::identity::{Identity, ORGANISATION};
use super::{key_id, write_private, CredError, SERVER_NAME};
use crate::util::beneath::{create_dir_all_durable_mode, rename_durable, write_file_durable};
use xfer_proto::hash::Hash;

/// How long an issued certificate lasts unless `--days` says otherwise:
/// short enough that a stolen one expires, long enough for a monthly
/// renewal.
pub const DEFAULT_DAYS: u32 = 30;

/// The longest validity `issue` accepts.
pub const MAX_DAYS: u32 = 398;

/// What the CA folder's operations return.
type Result<T> = std::result::Result<T, CredError>;

const KEY: &str = "ca.key";
const CERT: &str = "ca.crt";
const PREVIOUS: &str = "previous.crt";
const CROSS: &str = "cross.crt";
/// The new key of a rotation, before it replaces `ca.key`.
const NEXT: &str = "next.key";
/// Where an older xfer staged the new key.
const LEGACY_NEXT: &str = "ca.key.new";

#[cfg(test)]
thread_local! {
    /// Makes [`CaDir::rotate`] stop (as a crash would) after this many of
    /// its durable writes.
    static CRASH_AFTER: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Makes the next rotations on this thread stop after `n` durable writes
/// (`None`: never).
#[cfg(test)]
pub(crate) fn crash_after(n: Option<u32>) {
    CRASH_AFTER.with(|c| c.set(n));
}

/// A crash point of [`CaDir::rotate`] in tests: `Err` once the writes
/// allowed by `CRASH_AFTER` are done.
fn step() -> Result<()> {
    #[cfg(test)]
    if let Some(n) = CRASH_AFTER.with(|c| c.get()) {
        if n == 0 {
            return Err(CredError::CaState("crash (test)".into()));
        }
        CRASH_AFTER.with(|c| c.set(Some(n - 1)));
    }
    Ok(())
}

/// What `rotate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    /// The CA key id now in `ca.key`.
    pub id: Hash,
    /// What it did about a rotation a crash interrupted, in one line.
    pub recovered: Option<String>,
}

/// An operator's CA folder.
pub struct CaDir {
    dir: PathBuf,
}

/// What `issue` wrote.
pub struct Issued {
    /// The name and role the certificate states.
    pub identity: Identity,
    /// The cluster (the CA's key id) it belongs to.
    pub cluster: Hash,
    /// When the certificate expires.
    pub not_after: time::OffsetDateTime,
    /// Whether a CA rotation is under way (the credential carries the
    /// cross-signed certificate).
    pub rotating: bool,
}

impl CaDir {
    /// The CA folder at `dir` (nothing is read or created yet).
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
            return Err(CredError::CaState(format!(
                "{} already holds a CA; replacing it would invalidate every credential it issued. Use `xfer ca rotate` to change it, or pass --force",
                self.dir.display()
            )));
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
        let text = fs::read_to_string(&path).map_err(CredError::io(format!(
            "cannot read {}; create the CA with `xfer ca init --dir {}`",
            path.display(),
            self.dir.display()
        )))?;
        super::refuse_shared_secret(&path)?;
        KeyPair::from_pem(&text).map_err(|e| {
            CredError::not_a(
                &path,
                format!(" is not a CA key written by `xfer ca init`: {e}"),
            )
        })
    }

    fn read_public(&self, name: &str) -> Result<Option<String>> {
        match fs::read_to_string(self.path(name)) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).map_err(CredError::io(format!(
                "cannot read {}",
                self.path(name).display()
            ))),
        }
    }

    /// Writes a credential for `identity`, valid for `days`, to `out`
    /// (0600; an existing file only with `force`, never through a symlink).
    pub fn issue(&self, identity: &Identity, days: u32, out: &Path, force: bool) -> Result<Issued> {
        if days == 0 || days > MAX_DAYS {
            return Err(CredError::CaState(format!("--days {days}: give 1 to {MAX_DAYS} days (renew with `xfer ca issue` before it ends)")));
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
    /// A rotation a crash interrupted is finished (or, if its new key was
    /// lost, undone and begun afresh) instead; [`Rotated::recovered`] says so.
    pub fn rotate(&self) -> Result<Rotated> {
        if let Some(done) = self.recover()? {
            return Ok(done);
        }
        if self.path(PREVIOUS).exists() {
            return Err(CredError::CaState(format!(
                "a rotation is already under way in {}; reissue every credential, then run `xfer ca rotate --finish --dir {}`",
                self.dir.display(),
                self.dir.display()
            )));
        }
        let old_key = self.key()?;
        let new_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        self.rotate_to(&old_key, &new_key)?;
        Ok(Rotated {
            id: key_id(&new_key),
            recovered: None,
        })
    }

    /// The rotation from `old_key` to `new_key`, in crash-safe order (see
    /// the module header). Each step may be redone.
    fn rotate_to(&self, old_key: &KeyPair, new_key: &KeyPair) -> Result<()> {
        if !self.path(NEXT).exists() {
            self.write(NEXT, new_key.serialize_pem().as_bytes(), 0o600)?;
        }
        step()?;
        let old = ca_certificate(old_key)?;
        let cross = ca_params(new_key)?.signed_by(new_key, &old, old_key)?;
        self.write(PREVIOUS, old.pem().as_bytes(), 0o644)?;
        step()?;
        self.write(CROSS, cross.pem().as_bytes(), 0o644)?;
        step()?;
        rename_durable(&self.path(NEXT), &self.path(KEY)).map_err(CredError::io(format!(
            "cannot put the new CA key in {}",
            self.dir.display()
        )))?;
        step()?;
        self.write(CERT, ca_certificate(new_key)?.pem().as_bytes(), 0o644)
    }

    /// One file of the folder, replaced durably.
    fn write(&self, name: &str, bytes: &[u8], mode: u32) -> Result<()> {
        write_file_durable(&self.path(name), bytes, mode).map_err(CredError::io(format!(
            "cannot write {}",
            self.path(name).display()
        )))
    }

    /// Reads a staged next key, if one is there and whole.
    fn staged_key(&self) -> Result<Option<KeyPair>> {
        for name in [NEXT, LEGACY_NEXT] {
            let path = self.path(name);
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            match KeyPair::from_pem(&text) {
                Ok(k) => {
                    if name == LEGACY_NEXT {
                        self.write(NEXT, text.as_bytes(), 0o600)?;
                        fs::remove_file(&path)?;
                    }
                    return Ok(Some(k));
                }
                // Torn by a crash (an older xfer wrote it in place): the
                // old key is still in ca.key, so this one was never used.
                Err(_) => fs::remove_file(&path).map_err(CredError::io(format!(
                    "cannot remove the torn {}",
                    path.display()
                )))?,
            }
        }
        Ok(None)
    }

    /// Finishes or undoes a rotation a crash interrupted, judged from what
    /// is on disk; `None` when there is none.
    fn recover(&self) -> Result<Option<Rotated>> {
        let staged = self.staged_key()?;
        let key = self.key()?;
        if let Some(next) = staged {
            // Crashed before the new key was renamed in: ca.key is the old
            // key, intact. Finish with the staged key.
            self.rotate_to(&key, &next)?;
            let id = key_id(&next);
            return Ok(Some(Rotated {
                id,
                recovered: Some(format!(
                    "finished the rotation to CA {} that a crash interrupted before its new key was in place",
                    id.short()
                )),
            }));
        }
        let Some(previous) = self.read_public(PREVIOUS)? else {
            return Ok(None);
        };
        let id = key_id(&key);
        let cert = self.read_public(CERT)?.unwrap_or_default();
        if cert_holds_key(&cert, &key) {
            // A rotation under way, whole.
            return Ok(None);
        }
        if cert_holds_key(&previous, &key) {
            // ca.key is still the old key and the new key is gone (an older
            // xfer wrote ca.crt first and crashed): undo, then rotate anew.
            for name in [CROSS, PREVIOUS] {
                fs::remove_file(self.path(name)).or_else(ignore_missing)?;
            }
            self.write(CERT, ca_certificate(&key)?.pem().as_bytes(), 0o644)?;
            let new_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
            self.rotate_to(&key, &new_key)?;
            let new_id = key_id(&new_key);
            return Ok(Some(Rotated {
                id: new_id,
                recovered: Some(format!(
                    "undid a rotation a crash interrupted after its new key was lost (CA {} was still in ca.key) and began a new one, to CA {}",
                    id.short(),
                    new_id.short()
                )),
            }));
        }
        // ca.key is the new key, ca.crt still the old CA's: crashed before
        // the certificate was written. The cross certificate came before the
        // key, so it is there.
        if self.read_public(CROSS)?.is_none() {
            return Err(CredError::CaState(format!(
                "{} holds a new CA key but neither its certificate nor cross.crt; restore the folder from a backup, or start over with `xfer ca init --force --dir {}` and reissue every credential",
                self.dir.display(),
                self.dir.display()
            )));
        }
        self.write(CERT, ca_certificate(&key)?.pem().as_bytes(), 0o644)?;
        Ok(Some(Rotated {
            id,
            recovered: Some(format!(
                "finished the rotation to CA {} that a crash interrupted before its certificate was written",
                id.short()
            )),
        }))
    }

    /// Ends a rotation: the old CA is no longer trusted by credentials
    /// issued from now on.
    pub fn finish(&self) -> Result<Hash> {
        if !self.path(PREVIOUS).exists() {
            return Err(CredError::CaState(format!(
                "no rotation is under way in {}; start one with `xfer ca rotate --dir {}`",
                self.dir.display(),
                self.dir.display()
            )));
        }
        if let Some(r) = self.recover()? {
            return Err(CredError::CaState(format!(
                "{}; reissue every credential and reload each agent before `xfer ca rotate --finish --dir {}`",
                r.recovered.unwrap_or_default(),
                self.dir.display()
            )));
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
    create_dir_all_durable_mode(dir, 0o700)
        .map_err(CredError::io(format!("cannot create {}", dir.display())))?;
    Ok(())
}

/// Whether the PEM certificate `pem` is `key`'s (same public key).
fn cert_holds_key(pem: &str, key: &KeyPair) -> bool {
    let Some(Ok(der)) = rustls_pemfile::certs(&mut pem.as_bytes()).next() else {
        return false;
    };
    x509_parser::parse_x509_certificate(&der)
        .is_ok_and(|(_, c)| c.tbs_certificate.subject_pki.raw == key.public_key_der())
}

/// A public file of the CA folder, replaced durably.
fn write_public(path: &Path, text: &str) -> Result<()> {
    write_file_durable(path, text.as_bytes(), 0o644)
        .map_err(CredError::io(format!("cannot write {}", path.display())))
}
