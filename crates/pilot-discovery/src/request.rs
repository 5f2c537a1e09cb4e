//! `pilot-discovery request <method> <path> [body]`: an HTTP request to the local
//! monitoring/debug server, printing the response body, as Istio's.

use std::time::Duration;

use anyhow::{Context, bail};

pub async fn run(method: &str, path: &str, body: Option<String>, address: &str) -> anyhow::Result<()> {
    let method: reqwest::Method = method
        .to_ascii_uppercase()
        .parse()
        .with_context(|| format!("{method:?} is not an HTTP method"))?;
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let url = format!("http://{address}{path}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .no_proxy()
        .build()?;
    let mut req = client.request(method, &url);
    if let Some(b) = body {
        req = req.body(b);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("request to {url} failed (hint: is pilot-discovery running?)"))?;
    let status = resp.status();
    let text = resp.text().await?;
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    if !status.is_success() {
        bail!("{url} returned {status}");
    }
    Ok(())
}
