//! Mutual TLS 1.3 between two self-signed identities, pinned after the handshake.
//!
//! There is no certificate authority. During the handshake each side accepts any single
//! end-entity certificate (no chain), but the TLS 1.3 `CertificateVerify` signature is
//! checked against that certificate's key with ring, so the peer proves it holds the private
//! key of the certificate it shows. After the handshake the caller takes
//! [`peer_fingerprint`] and looks it up in `known_peers` ([`crate::KnownPeers::verify`]):
//! that lookup is the authentication. Skipping it turns mutual TLS into mere encryption.
//!
//! Only the ring provider is used, only TLS 1.3 is offered or accepted.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, CommonState, DigitallySignedStruct, DistinguishedName,
    ServerConfig, SignatureScheme,
};

use crate::identity::{fingerprint_of_cert, Identity};
use crate::{LinkError, Result};

/// The SNI name every client sends and every certificate carries. Names mean nothing here:
/// peers are identified by fingerprint.
pub const SERVER_NAME: &str = "ndd.peer";

/// ALPN protocol id, so a TLS client of another protocol fails the handshake clearly.
pub const ALPN: &[u8] = b"ndd/1";

/// The crypto provider of every ndd TLS connection: ring, explicitly (never aws-lc).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Server side: TLS 1.3 only, a client certificate required, ours presented.
pub fn server_config(identity: &Identity) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let verifier = Arc::new(AnySelfSigned::new(&provider));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![identity.cert_der().clone()],
            identity.key_der().clone_key(),
        )?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    // No session resumption: every connection proves its key again, and nothing the client
    // has not asked for is waiting unread on its socket.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// Client side: TLS 1.3 only, our certificate presented, the server's checked as described
/// in the module docs.
pub fn client_config(identity: &Identity) -> Result<Arc<ClientConfig>> {
    let provider = provider();
    let verifier = Arc::new(AnySelfSigned::new(&provider));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(
            vec![identity.cert_der().clone()],
            identity.key_der().clone_key(),
        )?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// Fingerprint of the peer's end-entity certificate, after the handshake. Takes a
/// `rustls::ClientConnection` or `ServerConnection` (through deref).
pub fn peer_fingerprint(conn: &CommonState) -> Result<String> {
    let cert = conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .ok_or(LinkError::NoPeerCertificate)?;
    fingerprint_of_cert(cert)
}

/// Accepts one self-signed end-entity certificate without a chain; verifies TLS 1.3
/// handshake signatures with the provider's algorithms.
#[derive(Debug)]
struct AnySelfSigned {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AnySelfSigned {
    fn new(provider: &CryptoProvider) -> Self {
        AnySelfSigned {
            algorithms: provider.signature_verification_algorithms,
        }
    }

    fn check_cert(
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> std::result::Result<(), rustls::Error> {
        if !intermediates.is_empty() {
            return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(ChainNotAllowed)),
            )));
        }
        // The signature checks parse the certificate again with webpki; this makes a
        // certificate without a readable public key fail here, with a clear error.
        fingerprint_of_cert(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        Ok(())
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }
}

fn tls12_refused() -> rustls::Error {
    rustls::Error::General("ndd speaks TLS 1.3 only".to_owned())
}

#[derive(Debug)]
struct ChainNotAllowed;

impl std::fmt::Display for ChainNotAllowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ndd peers present one self-signed certificate, not a chain")
    }
}

impl std::error::Error for ChainNotAllowed {}

impl ServerCertVerifier for AnySelfSigned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Self::check_cert(end_entity, intermediates)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl ClientCertVerifier for AnySelfSigned {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        Self::check_cert(end_entity, intermediates)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
