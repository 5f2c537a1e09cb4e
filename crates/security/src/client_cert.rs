//! Istio's `ClientCertAuthenticator`: a caller that presented a certificate the TLS handshake
//! verified against the mesh roots is the identities in its URI SANs.

use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::authn::{AuthContext, AuthError, AuthFuture, AuthSource, Authenticator, Caller};

#[derive(Debug, Default, Clone, Copy)]
pub struct ClientCertAuthenticator;

impl Authenticator for ClientCertAuthenticator {
    fn kind(&self) -> &'static str {
        "ClientCertAuthenticator"
    }

    fn authenticate<'a>(&'a self, ctx: &'a AuthContext) -> AuthFuture<'a> {
        Box::pin(async move {
            let leaf = ctx
                .peer_certs
                .as_ref()
                .and_then(|chain| chain.first())
                .ok_or_else(|| AuthError::NotPresented("no verified client certificate".into()))?;
            let identities = uri_sans(leaf.as_ref()).map_err(AuthError::Invalid)?;
            if identities.is_empty() {
                return Err(AuthError::Invalid(
                    "the client certificate names no URI identity".into(),
                ));
            }
            Ok(Caller {
                source: AuthSource::ClientCertificate,
                identities,
            })
        })
    }
}

/// The URI subject alternative names of a DER certificate (Istio's `ExtractIDs`).
pub fn uri_sans(der: &[u8]) -> Result<Vec<String>, String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("client certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("client certificate SAN: {e}"))?;
    Ok(san
        .map(|s| {
            s.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some((*u).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}
