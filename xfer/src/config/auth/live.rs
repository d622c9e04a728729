//! The TLS pieces of a credential that can be replaced while connections
//! run: an agent reloads its credential (on SIGHUP) after a renewal or
//! during a CA rotation, and every handshake from then on, in either
//! direction, uses the new certificate and the new trust anchors.
//!
//! Each piece only forwards to rustls' own WebPKI verifiers and
//! certificate holders, read from the current [`Tls`]; nothing here
//! inspects or relaxes a check.

use std::fmt;
use std::sync::{Arc, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::ResolvesClientCert;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// One loaded credential's certificate and verifiers.
pub struct Tls {
    pub certified: Arc<CertifiedKey>,
    pub clients: Arc<dyn ClientCertVerifier>,
    pub servers: Arc<dyn ServerCertVerifier>,
}

/// The current [`Tls`], shared by every config built from a credential.
#[derive(Clone)]
pub struct Live(Arc<RwLock<Arc<Tls>>>);

impl Live {
    pub fn new(tls: Tls) -> Live {
        Live(Arc::new(RwLock::new(Arc::new(tls))))
    }

    pub fn now(&self) -> Arc<Tls> {
        self.0.read().unwrap().clone()
    }

    pub fn replace(&self, tls: Tls) {
        *self.0.write().unwrap() = Arc::new(tls);
    }
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Live")
    }
}

impl ResolvesServerCert for Live {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.now().certified.clone())
    }
}

impl ResolvesClientCert for Live {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.now().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for Live {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional in TLS 1.3; a client has one certificate.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.now()
            .clients
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.now()
            .clients
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.now()
            .clients
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.now().clients.supported_verify_schemes()
    }
}

impl ServerCertVerifier for Live {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.now()
            .servers
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.now()
            .servers
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.now()
            .servers
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.now().servers.supported_verify_schemes()
    }
}
