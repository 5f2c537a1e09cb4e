//! `pilot-agent wait`: polls a readiness URL (by default the sidecar's health port, 15021) until
//! it answers 200, as Istio's `waitCmd`; used by `holdApplicationUntilProxyStarts` and by init
//! scripts. Gives up after `--timeoutSeconds` with the last error.

use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::time::{Instant, sleep, sleep_until};

/// Istio's flags, with their names and defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Maximum number of seconds to wait for Envoy to be ready.
    #[arg(long = "timeoutSeconds", default_value_t = 60)]
    pub timeout_seconds: u64,
    /// Number of milliseconds to wait for response.
    #[arg(long = "requestTimeoutMillis", default_value_t = 500)]
    pub request_timeout_millis: u64,
    /// Number of milliseconds to wait between attempts.
    #[arg(long = "periodMillis", default_value_t = 500)]
    pub period_millis: u64,
    /// URL to use in requests.
    #[arg(long = "url", default_value = "http://localhost:15021/healthz/ready")]
    pub url: String,
}

impl Default for WaitArgs {
    fn default() -> Self {
        Self {
            timeout_seconds: 60,
            request_timeout_millis: 500,
            period_millis: 500,
            url: "http://localhost:15021/healthz/ready".into(),
        }
    }
}

/// Waits a period, asks, and repeats until a 200 or the deadline.
pub async fn run(args: WaitArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(args.request_timeout_millis))
        .build()
        .context("building the HTTP client")?;
    tracing::info!(
        "Waiting for Envoy proxy to be ready (timeout: {} seconds)...",
        args.timeout_seconds
    );
    let deadline = Instant::now() + Duration::from_secs(args.timeout_seconds);
    let period = Duration::from_millis(args.period_millis);
    let mut last_error = String::from("none");
    loop {
        tokio::select! {
            () = sleep_until(deadline) => {
                bail!("timeout waiting for Envoy proxy to become ready. Last error: {last_error}")
            }
            () = sleep(period) => {}
        }
        match check_if_ready(&client, &args.url).await {
            Ok(()) => {
                tracing::info!("Envoy is ready!");
                return Ok(());
            }
            Err(err) => {
                tracing::debug!("Not ready yet: {err}");
                last_error = err;
            }
        }
    }
}

async fn check_if_ready(client: &reqwest::Client, url: &str) -> Result<(), String> {
    let response = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    response.bytes().await.map_err(|e| e.to_string())?;
    if status != reqwest::StatusCode::OK {
        return Err(format!("HTTP status code {}", status.as_u16()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::get;
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        wait: WaitArgs,
    }

    /// A readiness endpoint that answers 503 to the first `not_ready` requests, then 200.
    async fn flapping_ready(not_ready: usize) -> (String, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let app = Router::new().route(
            "/healthz/ready",
            get(move || {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < not_ready {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::OK
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/healthz/ready"), calls)
    }

    #[test]
    fn flags_and_defaults_are_istios() {
        let cli = Cli::parse_from(["wait"]);
        assert_eq!(cli.wait.url, "http://localhost:15021/healthz/ready");
        assert_eq!(
            (
                cli.wait.timeout_seconds,
                cli.wait.period_millis,
                cli.wait.request_timeout_millis
            ),
            (60, 500, 500)
        );
        let cli = Cli::parse_from([
            "wait",
            "--timeoutSeconds",
            "5",
            "--periodMillis",
            "10",
            "--url",
            "http://x/",
        ]);
        assert_eq!(
            (cli.wait.timeout_seconds, cli.wait.period_millis, cli.wait.url.as_str()),
            (5, 10, "http://x/")
        );
    }

    #[tokio::test]
    async fn succeeds_once_the_url_turns_ready() {
        let (url, calls) = flapping_ready(3).await;
        let args = WaitArgs {
            timeout_seconds: 10,
            period_millis: 20,
            url,
            ..WaitArgs::default()
        };
        run(args).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4, "three 503s, then the 200");
    }

    #[tokio::test]
    async fn fails_after_the_timeout_with_the_last_error() {
        let (url, calls) = flapping_ready(usize::MAX).await;
        let args = WaitArgs {
            timeout_seconds: 1,
            period_millis: 50,
            url,
            ..WaitArgs::default()
        };
        let started = Instant::now();
        let err = run(args).await.unwrap_err().to_string();
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert_eq!(
            err,
            "timeout waiting for Envoy proxy to become ready. Last error: HTTP status code 503"
        );
        assert!(calls.load(Ordering::SeqCst) >= 5);
    }

    #[tokio::test]
    async fn nothing_listening_is_not_ready() {
        let port = test_support::ports::free_port();
        let url = format!("http://127.0.0.1:{port}/healthz/ready");
        let args = WaitArgs {
            timeout_seconds: 1,
            period_millis: 100,
            url,
            ..WaitArgs::default()
        };
        let err = run(args).await.unwrap_err().to_string();
        assert!(
            err.starts_with("timeout waiting for Envoy proxy to become ready. Last error: "),
            "{err}"
        );
        assert!(!err.ends_with("none"), "{err}");
    }
}
