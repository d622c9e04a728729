//! The OCI distribution API, as a client that pulls: the `/v2/` manifest
//! and blob endpoints of one repository, authenticated the way the
//! registry's challenge asks ([`super::auth`]; its credentials go to a
//! token realm only as [`super::auth::check_realm`] allows), with
//! redirects followed by hand so the registry's credentials never reach
//! another host (a blob's CDN), every manifest and blob hashed and
//! compared with its digest before use, and a blob that stops mid-way
//! resumed with a range request.
//!
//! A blob's bytes never exceed its declared size: an answer that says or
//! sends more is cut off and refused. Its partial file and the blob are
//! reached through [`Files`]: with `O_NOFOLLOW` in a folder the operator
//! names, or beneath an agent's root ([`Registry::confined`]); a symlink
//! planted there fails the pull at once ([`Refused`]), naming it. A blob
//! is hashed and placed off the runtime's threads, so that several fetch
//! at once; small ones fetched as a batch ([`Registry::blob_batched`])
//! are made durable and trusted together ([`Registry::settle`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, LOCATION, RANGE, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode, Url};
use sha2::{Digest as _, Sha256};
use xfer_proto::image::Digest;

use super::auth::{self, Challenge, Credentials};
use super::manifest::{self, Descriptor, ImageManifest, Manifest, Platform};
use super::reference::ImageRef;
use crate::image::archive;
use crate::image::files::Files;
use crate::util::beneath::Root;

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;
/// Tries of one blob: a transfer cut mid-way resumes, a blob that does not
/// hash to its digest is fetched again from its start.
const BLOB_TRIES: u32 = 4;
/// Blobs smaller than this are made durable a batch at a time
/// ([`Registry::blob_batched`]): the fsyncs of a model of many small
/// files cost more than their bytes, and a crash costs their fetch again.
pub const BATCH_BELOW: u64 = 1 << 20;

/// Told how a blob's partial file grows while it is fetched, so what is in
/// can be passed on before the blob is whole ([`Registry::blob_watched`]).
/// The bytes below the length last said are final unless
/// [`BlobWatch::restarted`] follows.
pub trait BlobWatch: Send + Sync {
    /// The partial file holds the blob's first `len` bytes.
    fn grew(&self, len: u64);
    /// The partial file was emptied (it held more than the blob, or the
    /// whole did not hash to the digest): what was said is void, and the
    /// fetch starts again from the blob's first byte.
    fn restarted(&self);
    /// The partial file holds the whole blob and it hashed to its digest;
    /// it is made durable and moved into the cache next.
    fn matched(&self) {}
}

/// How to reach a registry.
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// Plain HTTP (a registry configured as insecure, on a trusted LAN).
    pub insecure: bool,
    /// A PEM file of CAs to trust besides the system's (a private CA).
    pub ca_file: Option<PathBuf>,
}

/// A registry's answer that trying again does not change until someone
/// acts (a 401 or 403, no such name or tag): the line says what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Permanent, always: the registry's answer does not change by itself.
impl crate::util::permanence::Permanence for Refused {
    fn is_permanent(&self) -> bool {
        true
    }
}

/// A failed call of the registry client (its errors are not typed yet):
/// its chain, permanent when one of its links is a [`Refused`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RegistryFailure(pub crate::util::chain::Chain);

impl From<anyhow::Error> for RegistryFailure {
    fn from(e: anyhow::Error) -> RegistryFailure {
        RegistryFailure(e.into())
    }
}

impl crate::util::permanence::Permanence for RegistryFailure {
    fn is_permanent(&self) -> bool {
        self.0.links().any(|c| c.is::<Refused>())
    }
}

/// One repository of one registry.
pub struct Registry {
    http: reqwest::Client,
    base: Url,
    image: ImageRef,
    creds: Option<Credentials>,
    /// The `Authorization` value the registry last granted.
    auth: tokio::sync::Mutex<Option<String>>,
    /// How the blob cache's files are reached.
    files: Files,
    /// Blobs of a batch placed but not yet durable nor stamped
    /// ([`Registry::blob_batched`]).
    pending: std::sync::Mutex<Vec<Digest>>,
}

/// An image manifest chosen for a platform, with its digest.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The image (or artifact) manifest.
    pub manifest: ImageManifest,
    /// Its digest.
    pub digest: Digest,
    /// The platform picked from an index, if the reference named one.
    pub platform: Option<Platform>,
}

impl Registry {
    /// A client for `image`'s repository, with the credentials
    /// [`auth::lookup`] finds for its registry.
    pub fn new(image: &ImageRef, opts: &RegistryOptions) -> Result<Registry> {
        let pem = match &opts.ca_file {
            Some(ca) => Some((
                std::fs::read(ca)
                    .with_context(|| format!("cannot read the CA file {}", ca.display()))?,
                ca.display().to_string(),
            )),
            None => None,
        };
        Self::build(image, opts.insecure, pem)
    }

    /// [`Registry::new`], trusting the CAs of the PEM text `ca_pem` besides
    /// the system's (a job's `--ca-file`, sent with it).
    pub fn with_ca_pem(
        image: &ImageRef,
        insecure: bool,
        ca_pem: Option<&[u8]>,
    ) -> Result<Registry> {
        let pem = ca_pem.map(|p| (p.to_vec(), "the job's --ca-file".to_string()));
        Self::build(image, insecure, pem)
    }

    /// The client; `pem` is a CA bundle and what to call it in messages.
    fn build(image: &ImageRef, insecure: bool, pem: Option<(Vec<u8>, String)>) -> Result<Registry> {
        let scheme = if insecure { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{}/", image.api_host()))
            .with_context(|| format!("`{}` is no registry host", image.registry))?;
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("xfer/", env!("CARGO_PKG_VERSION")));
        if let Some((pem, what)) = &pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .ok()
                .filter(|c| !c.is_empty())
                .with_context(|| {
                    format!("{what} holds no PEM certificate; pass the CA that signed the registry's certificate")
                })?;
            for cert in certs {
                b = b.add_root_certificate(cert);
            }
        }
        Ok(Registry {
            http: b.build()?,
            base,
            image: image.clone(),
            creds: auth::lookup(&image.registry),
            auth: tokio::sync::Mutex::new(None),
            files: Files::plain(),
            pending: std::sync::Mutex::default(),
        })
    }

    /// This client, writing its blob cache beneath `root` (an agent's
    /// root): every path resolved without following a symlink.
    pub fn confined(mut self, root: Root) -> Registry {
        self.files = Files::beneath(root);
        self
    }

    /// How the blob cache's files are reached.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// The reference this client pulls.
    pub fn image(&self) -> &ImageRef {
        &self.image
    }

    /// The URL of `/v2/<repository>/<kind>/<reference>`.
    fn url(&self, kind: &str, reference: &str) -> Url {
        self.base
            .join(&format!("v2/{}/{kind}/{reference}", self.image.repository))
            .expect("a valid path")
    }

    /// GETs `url`, authenticating once if the registry asks, following
    /// redirects by hand (credentials only to the registry's own origin).
    async fn get(&self, url: Url, accept: Option<&str>, from: u64) -> Result<Response> {
        for attempt in 0..2 {
            let r = self.follow(url.clone(), accept, from).await?;
            if r.status() == StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = r
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(auth::parse_challenge);
                if let Some(c) = challenge {
                    self.authenticate(c).await?;
                    continue;
                }
            }
            return Ok(r);
        }
        unreachable!("the loop returns")
    }

    async fn follow(&self, mut url: Url, accept: Option<&str>, from: u64) -> Result<Response> {
        let auth = self.auth.lock().await.clone();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.http.get(url.clone());
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if from > 0 {
                req = req.header(RANGE, format!("bytes={from}-"));
            }
            if let Some(a) = &auth {
                if url.origin() == self.base.origin() {
                    req = req.header(AUTHORIZATION, a);
                }
            }
            let r = req.send().await.map_err(|e| self.unreachable(&e))?;
            if !r.status().is_redirection() {
                return Ok(r);
            }
            let to = r
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| url.join(l).ok())
                .with_context(|| {
                    format!("{} redirected without a usable Location", self.where_())
                })?;
            url = to;
        }
        bail!(
            "{} redirected more than {MAX_REDIRECTS} times; check the registry's address",
            self.where_()
        )
    }

    /// Answers a challenge: a bearer token for pulling this repository, or
    /// basic auth.
    async fn authenticate(&self, c: Challenge) -> Result<()> {
        let value = match c {
            Challenge::Basic => match &self.creds {
                Some(cr) => cr.basic(),
                None => {
                    return Err(
                        Refused(self.login_hint("asks for a user name and password")).into(),
                    )
                }
            },
            Challenge::Bearer { realm, service, .. } => {
                let mut url = Url::parse(&realm).with_context(|| {
                    format!(
                        "{} named a token realm that is no URL: {realm}",
                        self.where_()
                    )
                })?;
                let allowed = std::env::var(auth::AUTH_HOSTS).ok();
                auth::check_realm(
                    &self.base,
                    &self.image.registry,
                    &url,
                    self.creds.is_some(),
                    allowed.as_deref(),
                )
                .map_err(|e| Refused(e.to_string()))?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = &service {
                        q.append_pair("service", s);
                    }
                    q.append_pair(
                        "scope",
                        &format!("repository:{}:pull", self.image.repository),
                    );
                }
                let mut req = self.http.get(url);
                if let Some(cr) = &self.creds {
                    req = req.header(AUTHORIZATION, cr.basic());
                }
                let r = req.send().await.map_err(|e| {
                    anyhow::anyhow!("the token service of {} did not answer: {e}", self.where_())
                })?;
                if r.status() == StatusCode::UNAUTHORIZED || r.status() == StatusCode::FORBIDDEN {
                    return Err(Refused(
                        self.login_hint(&format!("refused a token (HTTP {})", r.status().as_u16())),
                    )
                    .into());
                }
                if !r.status().is_success() {
                    bail!(
                        "the token service of {} answered HTTP {}; try again later",
                        self.where_(),
                        r.status().as_u16()
                    );
                }
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let body = read_capped(r, 1 << 20).await.with_context(|| {
                    format!("the token service of {} did not answer", self.where_())
                })?;
                let t: Token = serde_json::from_slice(&body).with_context(|| {
                    format!("the token service of {} sent no token", self.where_())
                })?;
                let t = t.token.or(t.access_token).with_context(|| {
                    format!("the token service of {} sent no token", self.where_())
                })?;
                format!("Bearer {t}")
            }
        };
        *self.auth.lock().await = Some(value);
        Ok(())
    }

    /// One line for a request that got no answer: an untrusted
    /// certificate names `--ca-file`, plain HTTP against TLS `--insecure`.
    fn unreachable(&self, e: &reqwest::Error) -> anyhow::Error {
        let mut chain = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(s) = src {
            chain += &format!(": {s}");
            src = s.source();
        }
        let lower = chain.to_lowercase();
        if lower.contains("certificate") || lower.contains("unknownissuer") {
            anyhow::anyhow!(
                "{}'s TLS certificate is not trusted ({chain}); pass --ca-file with the CA that signed it (or --insecure if it speaks plain HTTP)",
                self.where_()
            )
        } else {
            anyhow::anyhow!(
                "{} did not answer at {} ({chain}); check its address and that it runs{}",
                self.where_(),
                self.base,
                if self.base.scheme() == "https" {
                    " (and --insecure if it speaks plain HTTP)"
                } else {
                    ""
                }
            )
        }
    }

    fn where_(&self) -> String {
        format!("registry {}", self.image.registry)
    }

    fn login_hint(&self, what: &str) -> String {
        let creds = if self.creds.is_some() {
            "with the credentials xfer found (XFER_REGISTRY_USERNAME/PASSWORD or ~/.docker/config.json)"
        } else {
            "and xfer found no credentials for it"
        };
        format!(
            "{} {what} for {} {creds}: run `docker login {}` (xfer reads ~/.docker/config.json) or set XFER_REGISTRY_USERNAME and XFER_REGISTRY_PASSWORD, with access to pull it",
            self.where_(),
            self.image,
            self.image.registry
        )
    }

    /// Turns a refusal into one line with the fix.
    fn refused(&self, what: &str, status: StatusCode) -> anyhow::Error {
        match status.as_u16() {
            401 | 403 => anyhow::Error::new(Refused(
                self.login_hint(&format!("refused {what} (HTTP {})", status.as_u16())),
            )),
            404 => anyhow::Error::new(Refused(format!(
                "{} has no {what} of {}: check the name and tag (`skopeo list-tags docker://{}/{}` lists the tags)",
                self.where_(),
                self.image,
                self.image.registry,
                self.image.repository
            ))),
            429 => anyhow::anyhow!(
                "{} is rate-limiting pulls of {} (HTTP 429); wait, or log in for a higher limit, then run again",
                self.where_(),
                self.image
            ),
            s => anyhow::anyhow!(
                "{} answered HTTP {s} for {what} of {}; try again later",
                self.where_(),
                self.image
            ),
        }
    }

    /// The manifest `reference` names (a tag or digest), checked against
    /// its digest: the requested one, and the one the registry states.
    pub async fn manifest(&self, reference: &str) -> Result<(Manifest, Digest)> {
        let r = self
            .get(self.url("manifests", reference), Some(manifest::ACCEPT), 0)
            .await?;
        if !r.status().is_success() {
            return Err(self.refused("manifest", r.status()));
        }
        let kind = r
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let stated = r
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v).ok());
        let bytes = read_capped(r, manifest::MAX_MANIFEST)
            .await
            .with_context(|| {
                format!(
                    "reading the manifest of {} from {}",
                    self.image,
                    self.where_()
                )
            })?;
        let got = Digest(Sha256::digest(&bytes).into());
        let asked = Digest::parse(reference).ok();
        for want in [asked, stated].into_iter().flatten() {
            if want != got {
                bail!(
                    "the manifest of {} from {} hashes to {got}, not {want}: the registry or a proxy altered it; run again, or pull by another route",
                    self.image,
                    self.where_()
                );
            }
        }
        Ok((manifest::parse(&kind, &bytes)?, got))
    }

    /// The image manifest for `platform`: the reference's own, or its
    /// index's entry for the platform.
    pub async fn resolve(&self, platform: &Platform) -> Result<Resolved> {
        let (m, digest) = self.manifest(&self.image.manifest_reference()).await?;
        match m {
            Manifest::Image(manifest) => Ok(Resolved {
                manifest,
                digest,
                platform: None,
            }),
            Manifest::Index(ix) => {
                let entry = manifest::pick(&ix, platform).map_err(|has| {
                    anyhow::anyhow!(
                        "{} has no image for {platform} (it has {}); pass --platform with one of those, or use a tag built for {platform}",
                        self.image,
                        if has.is_empty() { "none named".to_string() } else { has.join(", ") }
                    )
                })?;
                let (m, digest) = self.manifest(&entry.digest.to_string()).await?;
                match m {
                    Manifest::Image(manifest) => Ok(Resolved {
                        manifest,
                        digest,
                        platform: entry.platform.clone(),
                    }),
                    Manifest::Index(_) => bail!(
                        "{}'s index for {platform} names another index; xfer follows one level",
                        self.image
                    ),
                }
            }
        }
    }

    /// Fetches the blob `desc` into the blob cache at `cache` (unless it
    /// holds it already), checked against its digest; a transfer that
    /// stops resumes where it stopped, and a blob that does not hash to its
    /// digest is fetched again. Returns the bytes downloaded.
    pub async fn blob(&self, desc: &Descriptor, cache: &Path) -> Result<u64> {
        self.blob_watched(desc, cache, None).await
    }

    /// Where [`Registry::blob`] keeps `desc` while it is fetched.
    pub fn partial_path(cache: &Path, desc: &Descriptor) -> PathBuf {
        cache
            .join(".incoming")
            .join(format!("{}.part", desc.digest.model()))
    }

    /// [`Registry::blob`], telling `watch` how the partial file grows (not
    /// told anything when the cache holds the blob already).
    pub async fn blob_watched(
        &self,
        desc: &Descriptor,
        cache: &Path,
        watch: Option<&dyn BlobWatch>,
    ) -> Result<u64> {
        self.fetch_blob(desc, cache, watch, false).await
    }

    /// [`Registry::blob`] as one of a batch: a blob under [`BATCH_BELOW`]
    /// bytes is placed in the cache without an fsync of its own and
    /// stamped (trusted) only by [`Registry::settle`], which the batch
    /// must call at its end, whether it failed or not.
    pub async fn blob_batched(&self, desc: &Descriptor, cache: &Path) -> Result<u64> {
        self.fetch_blob(desc, cache, None, desc.size < BATCH_BELOW)
            .await
    }

    /// Makes the blobs [`Registry::blob_batched`] placed in `cache`
    /// durable (one `syncfs`) and stamps them.
    pub async fn settle(&self, cache: &Path) -> Result<()> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let (files, cache) = (self.files.clone(), cache.to_path_buf());
        tokio::task::spawn_blocking(move || archive::stamp_batch_in(&files, &cache, &pending))
            .await?
            .map_err(|e| match e.downcast::<std::io::Error>() {
                Ok(io) => local(io),
                Err(e) => e,
            })
    }

    /// Fetches `desc` into `cache` (see [`Registry::blob`]); `lazy`: as
    /// one of a batch ([`Registry::blob_batched`]).
    async fn fetch_blob(
        &self,
        desc: &Descriptor,
        cache: &Path,
        watch: Option<&dyn BlobWatch>,
        lazy: bool,
    ) -> Result<u64> {
        if archive::holds_in(&self.files, cache, &desc.digest, desc.size) {
            return Ok(0);
        }
        let part = Self::partial_path(cache, desc);
        self.files
            .create_dir_all(part.parent().expect("in .incoming"))
            .map_err(local)?;
        let mut fetched = 0u64;
        let mut why = String::new();
        for _ in 0..BLOB_TRIES {
            let got = match self.fetch_into(desc, &part, &mut fetched, watch).await {
                Ok(got) => got,
                // A refusal (a symlink planted in the cache, a 401 or 404)
                // is the same at every try.
                Err(e) if e.is::<Refused>() => return Err(e),
                Err(e) => {
                    why = format!("{e:#}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if got == desc.digest {
                if let Some(w) = watch {
                    w.matched();
                }
                let (files, cache, d, p) = (
                    self.files.clone(),
                    cache.to_path_buf(),
                    desc.digest,
                    part.clone(),
                );
                tokio::task::spawn_blocking(move || match lazy {
                    true => archive::adopt_blob_lazy_in(&files, &cache, &d, &p),
                    false => archive::adopt_blob_in(&files, &cache, &d, &p),
                })
                .await?
                .map_err(|e| match e.downcast::<std::io::Error>() {
                    Ok(io) => local(io),
                    Err(e) => e,
                })?;
                if lazy {
                    self.pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(desc.digest);
                }
                return Ok(fetched);
            }
            why = format!(
                "blob {} of {} from {} hashes to {got}: the registry or a proxy altered it",
                desc.digest,
                self.image,
                self.where_()
            );
            tracing::warn!("{why}; fetching it again");
            self.files.remove_file(&part).map_err(local)?;
            if let Some(w) = watch {
                w.restarted();
            }
        }
        bail!("{why}; run again (what was fetched and checked is kept)")
    }

    /// The sha256 state after the bytes of the file at `p` (read off the
    /// runtime's threads), to go on hashing what follows them.
    async fn hashed_so_far(&self, p: &Path) -> Result<Sha256> {
        let f = self.files.open_read(p).map_err(local)?;
        let h = tokio::task::spawn_blocking(move || {
            let mut h = Sha256::new();
            std::io::copy(&mut std::io::BufReader::with_capacity(1 << 20, f), &mut h).map(|_| h)
        })
        .await??;
        Ok(h)
    }

    /// Appends the rest of `desc` to `part` (asking from its length on);
    /// the sha256 of the whole part, hashed as the bytes arrive (what an
    /// earlier try left is read once to start the hash).
    async fn fetch_into(
        &self,
        desc: &Descriptor,
        part: &Path,
        fetched: &mut u64,
        watch: Option<&dyn BlobWatch>,
    ) -> Result<Digest> {
        let mut have = self.files.len(part).map_err(local)?.unwrap_or(0);
        if have > desc.size {
            self.files.remove_file(part).map_err(local)?;
            have = 0;
            if let Some(w) = watch {
                w.restarted();
            }
        }
        if let Some(w) = watch {
            w.grew(have);
        }
        if have == desc.size {
            return Ok(Digest(self.hashed_so_far(part).await?.finalize().into()));
        }
        let r = self
            .get(self.url("blobs", &desc.digest.to_string()), None, have)
            .await?;
        let mut hasher = Sha256::new();
        let (mut file, mut at) = match r.status() {
            StatusCode::PARTIAL_CONTENT if have > 0 => {
                hasher = self.hashed_so_far(part).await?;
                (self.files.open_append(part).map_err(local)?, have)
            }
            s if s.is_success() => {
                // The whole blob again: what the file held is replaced.
                if have > 0 {
                    if let Some(w) = watch {
                        w.restarted();
                    }
                }
                (self.files.create_new(part).map_err(local)?, 0)
            }
            s => return Err(self.refused(&format!("blob {}", desc.digest), s)),
        };
        // An answer that says it is longer than the rest of the blob is
        // refused before a byte of it is written.
        if let Some(len) = r.content_length() {
            if at.checked_add(len).is_none_or(|end| end > desc.size) {
                bail!(
                    "{} offered {len} bytes from byte {at} of blob {}, which has {} bytes",
                    self.where_(),
                    desc.digest,
                    desc.size
                );
            }
        }
        let mut r = r;
        while let Some(chunk) = r.chunk().await.map_err(|e| {
            anyhow::anyhow!(
                "{} stopped sending blob {}: {e}",
                self.where_(),
                desc.digest
            )
        })? {
            at += chunk.len() as u64;
            if at > desc.size {
                bail!(
                    "{} sent more than the {} bytes of blob {}",
                    self.where_(),
                    desc.size,
                    desc.digest
                );
            }
            file.write_all(&chunk)?;
            hasher.update(&chunk);
            *fetched += chunk.len() as u64;
            if let Some(w) = watch {
                w.grew(at);
            }
        }
        file.flush()?;
        if at < desc.size {
            bail!(
                "{} ended blob {} at {at} of {} bytes",
                self.where_(),
                desc.digest,
                desc.size
            );
        }
        Ok(Digest(hasher.finalize().into()))
    }

    /// The config blob's bytes (small), checked against its digest, and
    /// the bytes downloaded for it.
    pub async fn config(&self, desc: &Descriptor, cache: &Path) -> Result<(Vec<u8>, u64)> {
        if desc.size > archive::MAX_JSON {
            bail!(
                "the config of {} is {} bytes, more than a config can be",
                self.image,
                desc.size
            );
        }
        let fetched = self.blob(desc, cache).await?;
        Ok((
            self.files
                .read(&archive::blob_path(cache, &desc.digest))
                .map_err(local)?,
            fetched,
        ))
    }
}

/// The body of `r`, refused past `cap` bytes.
async fn read_capped(mut r: Response, cap: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(c) = r.chunk().await? {
        if out.len() + c.len() > cap {
            bail!("more than {cap} bytes");
        }
        out.extend_from_slice(&c);
    }
    Ok(out)
}

/// An error of the blob cache's own files: a planted symlink is a
/// [`Refused`] naming it (no try goes through it until someone removes
/// it), anything else as it is.
fn local(e: std::io::Error) -> anyhow::Error {
    match crate::util::beneath::Planted::of(&e) {
        Some(p) => Refused(p.to_string()).into(),
        None => e.into(),
    }
}
