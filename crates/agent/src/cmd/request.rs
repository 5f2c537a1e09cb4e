//! `pilot-agent request <method> <path> [<body>]`: one HTTP call to a local debug port (Envoy's
//! admin API by default), printing the response body and nothing else (istioctl parses it), as
//! Istio's `requestCmd`. Only the agent's and Envoy's own ports may be asked.

use std::time::Duration;

use anyhow::{Context as _, bail};

/// Ports `--debug-port` may name: Envoy's admin, the agent's status and health ports, and the
/// agent's debug port.
pub(crate) const ALLOWED_PORTS: [u16; 4] = [15000, 15004, 15020, 15021];
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, clap::Args)]
pub struct RequestArgs {
    /// HTTP method, e.g. GET or POST.
    pub method: String,
    /// Path (and query) on the debug port, e.g. `stats` or `/config_dump`.
    pub path: String,
    /// Request body.
    pub body: Option<String>,
    /// Set the port to make a local request to. The default points to the Envoy admin API.
    #[arg(long = "debug-port", default_value_t = 15000)]
    pub debug_port: u16,
}

/// Checks the port, makes the call, prints the body.
pub async fn run(args: RequestArgs) -> anyhow::Result<()> {
    if !ALLOWED_PORTS.contains(&args.debug_port) {
        let allowed: Vec<String> = ALLOWED_PORTS.iter().map(u16::to_string).collect();
        bail!(
            "debug port {} is not in allowed list {}",
            args.debug_port,
            allowed.join(", ")
        );
    }
    let address = format!("localhost:{}", args.debug_port);
    let body = request(
        &address,
        &args.method,
        &args.path,
        args.body.as_deref().unwrap_or_default(),
    )
    .await?;
    println!("{body}");
    Ok(())
}

/// Istio's `request.Command.Do`: `method http://<address>/<path>` with `body`; a status above 399
/// other than 404 is an error carrying the body.
pub async fn request(address: &str, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let method =
        reqwest::Method::from_bytes(method.as_bytes()).with_context(|| format!("invalid method {method:?}"))?;
    let url = format!("http://{address}/{}", path.trim_start_matches('/'));
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    let response = client
        .request(method, &url)
        .body(body.to_owned())
        .send()
        .await
        .with_context(|| url.clone())?;
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("reading the response of {url}"))?;
    if status.as_u16() > 399 && status != reqwest::StatusCode::NOT_FOUND {
        bail!("received unsuccessful status code {}: {text}", status.as_u16());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::http::{Method, StatusCode};
    use axum::routing::{get, post};
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        request: RequestArgs,
    }

    /// A fake admin: GET /server_info, POST /logging echoes its query and body, /broken is 503.
    async fn fake_admin() -> String {
        let app = Router::new()
            .route("/server_info", get(|| async { r#"{"state":"LIVE"}"# }))
            .route(
                "/logging",
                post(|method: Method, uri: axum::http::Uri, body: String| async move {
                    format!("{method} {} {body}", uri.query().unwrap_or_default())
                }),
            )
            .route(
                "/broken",
                get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream") }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr.to_string()
    }

    #[test]
    fn parses_istios_arguments() {
        let cli = Cli::parse_from(["request", "POST", "logging?level=debug", "x"]);
        assert_eq!(cli.request.method, "POST");
        assert_eq!(cli.request.path, "logging?level=debug");
        assert_eq!(cli.request.body.as_deref(), Some("x"));
        assert_eq!(cli.request.debug_port, 15000);
        assert!(
            Cli::try_parse_from(["request", "GET"]).is_err(),
            "method and path are required"
        );
    }

    #[tokio::test]
    async fn prints_the_admin_response() {
        let admin = fake_admin().await;
        assert_eq!(
            request(&admin, "GET", "server_info", "").await.unwrap(),
            r#"{"state":"LIVE"}"#
        );
        assert_eq!(
            request(&admin, "GET", "/server_info", "").await.unwrap(),
            r#"{"state":"LIVE"}"#
        );
        let echoed = request(&admin, "POST", "logging?level=debug", "payload").await.unwrap();
        assert_eq!(echoed, "POST level=debug payload");
    }

    #[tokio::test]
    async fn failures_carry_the_status_and_body_but_404_is_printed() {
        let admin = fake_admin().await;
        let err = request(&admin, "GET", "broken", "").await.unwrap_err().to_string();
        assert_eq!(err, "received unsuccessful status code 503: no healthy upstream");
        // Istio prints a 404's body rather than failing.
        assert_eq!(request(&admin, "GET", "nope", "").await.unwrap(), "");
        assert!(request(&admin, "BAD METHOD", "x", "").await.is_err());
    }

    #[tokio::test]
    async fn refuses_ports_outside_the_allowed_list() {
        let args = RequestArgs {
            method: "GET".into(),
            path: "stats".into(),
            body: None,
            debug_port: 8080,
        };
        let err = run(args).await.unwrap_err().to_string();
        assert_eq!(err, "debug port 8080 is not in allowed list 15000, 15004, 15020, 15021");
    }
}
