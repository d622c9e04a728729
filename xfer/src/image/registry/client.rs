//! The OCI distribution API, as a client that pulls: the `/v2/` manifest
//! and blob endpoints of one repository, authenticated the way the
//! registry's challenge asks ([`super::auth`]), with redirects followed by
//! hand so the registry's credentials never reach another host (a blob's
//! CDN), every manifest and blob hashed and compared with its digest before
//! use, and a blob that stops mid-way resumed with a range request.

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

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;
/// Tries of one blob: a transfer cut mid-way resumes, a blob that does not
/// hash to its digest is fetched again from its start.
const BLOB_TRIES: u32 = 4;

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

/// One repository of one registry.
pub struct Registry {
    http: reqwest::Client,
    base: Url,
    image: ImageRef,
    creds: Option<Credentials>,
    /// The `Authorization` value the registry last granted.
    auth: tokio::sync::Mutex<Option<String>>,
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
        let scheme = if opts.insecure { "http" } else { "https" };
        let base = Url::parse(&format!("{scheme}://{}/", image.api_host()))
            .with_context(|| format!("`{}` is no registry host", image.registry))?;
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("xfer/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &opts.ca_file {
            let pem = std::fs::read(ca)
                .with_context(|| format!("cannot read the CA file {}", ca.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem).with_context(|| {
                format!("{} holds no PEM certificate; pass the CA that signed the registry's certificate", ca.display())
            })? {
                b = b.add_root_certificate(cert);
            }
        }
        Ok(Registry {
            http: b.build()?,
            base,
            image: image.clone(),
            creds: auth::lookup(&image.registry),
            auth: tokio::sync::Mutex::new(None),
        })
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
        if archive::holds(cache, &desc.digest, desc.size) {
            return Ok(0);
        }
        let part = Self::partial_path(cache, desc);
        crate::util::beneath::create_dir_all_durable(part.parent().expect("in .incoming"))?;
        let mut fetched = 0u64;
        let mut why = String::new();
        for _ in 0..BLOB_TRIES {
            match self.fetch_into(desc, &part, &mut fetched, watch).await {
                Ok(()) => {}
                Err(e) => {
                    why = format!("{e:#}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            let got = hash_file(&part)?;
            if got == desc.digest {
                archive::adopt_blob(cache, &desc.digest, &part)?;
                return Ok(fetched);
            }
            why = format!(
                "blob {} of {} from {} hashes to {got}: the registry or a proxy altered it",
                desc.digest,
                self.image,
                self.where_()
            );
            tracing::warn!("{why}; fetching it again");
            let _ = std::fs::remove_file(&part);
            if let Some(w) = watch {
                w.restarted();
            }
        }
        bail!("{why}; run again (what was fetched and checked is kept)")
    }

    /// Appends the rest of `desc` to `part` (asking from its length on).
    async fn fetch_into(
        &self,
        desc: &Descriptor,
        part: &Path,
        fetched: &mut u64,
        watch: Option<&dyn BlobWatch>,
    ) -> Result<()> {
        let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
        if have > desc.size {
            std::fs::remove_file(part)?;
            have = 0;
            if let Some(w) = watch {
                w.restarted();
            }
        }
        if let Some(w) = watch {
            w.grew(have);
        }
        if have == desc.size {
            return Ok(());
        }
        let r = self
            .get(self.url("blobs", &desc.digest.to_string()), None, have)
            .await?;
        let (mut file, mut at) = match r.status() {
            StatusCode::PARTIAL_CONTENT => {
                (std::fs::OpenOptions::new().append(true).open(part)?, have)
            }
            s if s.is_success() => {
                // The whole blob again: what the file held is replaced.
                if have > 0 {
                    if let Some(w) = watch {
                        w.restarted();
                    }
                }
                (std::fs::File::create(part)?, 0)
            }
            s => return Err(self.refused(&format!("blob {}", desc.digest), s)),
        };
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
        Ok(())
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
            std::fs::read(archive::blob_path(cache, &desc.digest))?,
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

/// The sha256 of the file at `p`.
fn hash_file(p: &Path) -> Result<Digest> {
    let f = std::fs::File::open(p)?;
    let (d, _) = crate::image::sha256_copy(
        std::io::BufReader::with_capacity(1 << 20, f),
        std::io::sink(),
    )?;
    Ok(d)
}
