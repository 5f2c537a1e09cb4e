//! The status server's client for Envoy's admin API on loopback: bounded GETs of `/ready`,
//! `/stats` and `/stats/prometheus`.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};

/// Envoy's admin API at `127.0.0.1:<adminPort>`.
#[derive(Clone, Debug)]
pub(crate) struct EnvoyAdmin {
    base: String,
    client: reqwest::Client,
}

/// A failed admin call: Envoy did not answer in time, refused the connection, or sent no body.
#[derive(Debug, thiserror::Error)]
#[error("{url}: {source}")]
pub(crate) struct AdminError {
    url: String,
    #[source]
    source: reqwest::Error,
}

impl EnvoyAdmin {
    pub(crate) fn new(admin_port: u16) -> Result<Self, reqwest::Error> {
        // No proxy: a HTTP_PROXY in the pod's environment must not capture loopback admin calls.
        let client = reqwest::Client::builder().no_proxy().build()?;
        Ok(Self {
            base: format!("http://127.0.0.1:{admin_port}"),
            client,
        })
    }

    /// GET `path_and_query` within `timeout`, passing `headers` along; returns the status and the body.
    pub(crate) async fn get(
        &self,
        path_and_query: &str,
        timeout: Duration,
        headers: HeaderMap,
    ) -> Result<(StatusCode, String), AdminError> {
        let url = format!("{}{path_and_query}", self.base);
        let fetch = async {
            let response = self.client.get(&url).headers(headers).timeout(timeout).send().await?;
            let status = response.status();
            Ok((status, response.text().await?))
        };
        fetch.await.map_err(|source| AdminError { url, source })
    }

    /// GET `path_and_query` and return the response as soon as its headers arrive: the body is
    /// read chunk by chunk with [`EnvoyAdmin::chunk`], all of it within `timeout`.
    pub(crate) async fn get_streaming(
        &self,
        path_and_query: &str,
        timeout: Duration,
        headers: HeaderMap,
    ) -> Result<reqwest::Response, AdminError> {
        let url = format!("{}{path_and_query}", self.base);
        let send = self.client.get(&url).headers(headers).timeout(timeout).send();
        send.await.map_err(|source| AdminError { url, source })
    }

    /// The next chunk of a streamed body; `None` at its end.
    pub(crate) async fn chunk(response: &mut reqwest::Response) -> Result<Option<Bytes>, AdminError> {
        response.chunk().await.map_err(|source| AdminError {
            url: response.url().to_string(),
            source,
        })
    }
}
