//! Istio's inbound filter chain match options (`filterchain_options.go`): for each application
//! port, which chains `virtualInbound` has under the workload's PeerAuthentication mode. STRICT:
//! mutual TLS only (a client certificate of the mesh root); PERMISSIVE: mutual TLS when the client
//! offers Istio's ALPN, plaintext (and, on TCP ports, TLS of the application's own) otherwise;
//! DISABLE: plaintext only.
//!
//! Istio's proxy build rewrites a sidecar's ALPN per detected protocol (`istio-http/1.1`, ...) so
//! that the server side knows HTTP from TCP inside mTLS; upstream Envoy offers the cluster's ALPN
//! (`istio-peer-exchange`, `istio`), so mTLS to a port of unknown protocol lands on the TCP chain.

use model::Protocol;
use model::security::MtlsMode;

use crate::mtls::{ALL_ISTIO_MTLS_ALPNS, MTLS_TCP_ALPNS};

/// Istio's `mtlsHTTPALPNs`.
const MTLS_HTTP_ALPNS: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];
/// Istio's `plaintextHTTPALPNs`: with `PILOT_HTTP10`, HTTP/1.0 too; without it an HTTP/1.0
/// connection matches no HTTP chain and passes as TCP instead of being refused by the HCM.
pub(crate) fn plaintext_http_alpns(http10: bool) -> &'static [&'static str] {
    const WITH_HTTP10: [&str; 3] = ["http/1.0", "http/1.1", "h2c"];
    const WITHOUT: [&str; 2] = ["http/1.1", "h2c"];
    if http10 { &WITH_HTTP10 } else { &WITHOUT }
}
pub(crate) const TLS: &str = "tls";
pub(crate) const RAW_BUFFER: &str = "raw_buffer";

/// One filter chain of a port: its match, what it runs, whether it terminates mutual TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChainMatch {
    pub alpns: &'static [&'static str],
    pub transport: &'static str,
    /// HCM (else tcp_proxy).
    pub http: bool,
    /// Terminates Istio mTLS.
    pub mtls: bool,
}

const fn m(alpns: &'static [&'static str], transport: &'static str, http: bool, mtls: bool) -> ChainMatch {
    ChainMatch {
        alpns,
        transport,
        http,
        mtls,
    }
}

/// Istio's `getFilterChainMatchOptions`.
pub(crate) fn match_options(protocol: Protocol, mode: MtlsMode, http10: bool) -> Vec<ChainMatch> {
    let plaintext_http = plaintext_http_alpns(http10);
    let strict = mode == MtlsMode::Strict;
    let permissive = matches!(mode, MtlsMode::Permissive | MtlsMode::Unset);
    match protocol {
        p if p.is_http() => {
            if strict {
                vec![m(&[], TLS, true, true)]
            } else if permissive {
                vec![
                    m(&ALL_ISTIO_MTLS_ALPNS, TLS, true, true),
                    m(&[], RAW_BUFFER, true, false),
                ]
            } else {
                vec![m(&[], RAW_BUFFER, true, false)]
            }
        }
        Protocol::Unsupported => {
            if strict {
                vec![m(&MTLS_HTTP_ALPNS, TLS, true, true), m(&[], TLS, false, true)]
            } else if permissive {
                vec![
                    m(&MTLS_HTTP_ALPNS, TLS, true, true),
                    m(plaintext_http, RAW_BUFFER, true, false),
                    m(&MTLS_TCP_ALPNS, TLS, false, true),
                    m(&[], RAW_BUFFER, false, false),
                    m(&[], TLS, false, false),
                ]
            } else {
                vec![
                    m(plaintext_http, RAW_BUFFER, true, false),
                    m(&[], RAW_BUFFER, false, false),
                ]
            }
        }
        _ => {
            if strict {
                vec![m(&[], TLS, false, true)]
            } else if permissive {
                vec![
                    m(&ALL_ISTIO_MTLS_ALPNS, TLS, false, true),
                    m(&[], TLS, false, false),
                    m(&[], RAW_BUFFER, false, false),
                ]
            } else {
                vec![m(&[], RAW_BUFFER, false, false)]
            }
        }
    }
}
