//! `pilot-discovery`: Istio's control plane. Flags and subcommands as Istio's; wiring lives in
//! `server`, HTTP endpoints in `http`.
//!
//! Read it top down. Each file imports only files of its own layer or below; layers, top first:
//!
//! 1. `main`: flags and subcommands.
//! 2. `server`: the start-up steps, in istiod's order.
//! 3. `server::listeners`: the ports and what each serves.
//! 4. `http`, `configz`, `registryz`: the debug and monitoring endpoints.
//! 5. `server::ca`, `server::cluster_writers`, `server::config`, `server::mesh`: the steps' parts.
//! 6. `kubernetes`, `consul`, `secure`, `webhook`, `jwks`, `injection`: what serves and follows.
//! 7. `ca_server`, `webhook::patch`, `args`, `settings`: the CA service, the patchers, settings.
//! 8. `metrics`, `leader`, `serving_cert`, `accept`, `ca_limits`, `ca_secret`, `root_cert`, `mesh_networks`, `cacerts`: parts.
//! 9. `app_state`, `istio_flags`, `logging`, `mesh_configmap`, `nacks`, `push`, `request`: leaves.
//! 10. `token_review`, `validate`, `version`, `admission_body`: leaves.
//!
//! (`python3 scripts/house/imports.py crates/pilot-discovery --no-tests --check` checks it.)
#![forbid(unsafe_code)]

mod accept;
mod admission_body;
mod app_state;
mod args;
mod ca_limits;
mod ca_secret;
mod ca_server;
mod cacerts;
mod configz;
mod consul;
mod http;
mod injection;
mod istio_flags;
mod jwks;
mod kubernetes;
mod leader;
mod logging;
mod mesh_configmap;
mod mesh_networks;
mod metrics;
mod multicluster;
mod nacks;
mod push;
mod registryz;
mod request;
mod root_cert;
mod secure;
mod server;
mod serving_cert;
mod settings;
mod token_review;
mod validate;
mod version;
mod webhook;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

/// mimalloc rather than glibc's malloc: glibc keeps the memory of a spike (adding and removing
/// 100k resources left RSS at its peak indefinitely), mimalloc returns freed pages to the system
/// (docs/perf.md, "Memory after a spike"). The `system-allocator` feature keeps glibc's, for heap
/// profilers that hook malloc (heaptrack).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version { short, output } => {
            let info = version::INFO;
            if output.as_deref() == Some("json") {
                match serde_json::to_string_pretty(&info) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else if short {
                println!("{}", info.version);
            } else {
                println!("{}", info.long());
            }
            ExitCode::SUCCESS
        }
        Command::Validate { files } => validate::run(&files),
        Command::Request {
            method,
            path,
            body,
            address,
        } => block_on(request::run(&method, &path, body, &address)),
        Command::Discovery(args) => {
            if let Err(e) = logging::init(&args.log_output_level, args.log_as_json) {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            let settings = match settings::Settings::from_env(|k| std::env::var(k).ok()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            disable_transparent_huge_pages();
            let ignored = istio_flags::not_honoured(|k| std::env::var(k).ok());
            if !ignored.is_empty() {
                tracing::warn!(
                    "environment of istiod set but accepted and ignored by pilot-discovery: {}",
                    ignored.join(", ")
                );
            }
            block_on(server::run(*args, settings))
        }
    }
}

/// mimalloc asks the kernel for transparent huge pages (`madvise(MADV_HUGEPAGE)` on its arenas),
/// so every fresh 2 MiB of heap is faulted in and zeroed whole, and stays resident even when a few
/// small objects are left in it: with 2,000 sidecars pilot-discovery peaked at 218-225 MB with them
/// and 147-150 MB without, for the same convergence and CPU (docs/perf.md, issue 15), and zeroing
/// huge pages was 44% of its CPU during a push. Turned off for this process only.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        tracing::warn!("cannot turn transparent huge pages off (prctl PR_SET_THP_DISABLE): {e}");
    }
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    // Generation runs on the blocking pool. Tokio's default lets it grow to 512 threads when a
    // thousand proxies connect at once; each thread's allocator cache and stack stay resident
    // (peak RSS 250-280 MB against 125 MB with this cap at 500 sidecars, docs/perf.md) and
    // more threads than cores only make the same CPU work contend.
    let blocking = std::thread::available_parallelism().map_or(2, usize::from) * 2;
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(blocking)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn transparent_huge_pages_are_turned_off_for_the_process() {
        super::disable_transparent_huge_pages();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("THP_enabled:"));
        // Kernels before 6.0 do not report it; there the prctl call is all that can be checked.
        if let Some(line) = line {
            assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
        }
    }
}
