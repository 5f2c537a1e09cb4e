//! pilot-agent's small subcommands beside `proxy`: `wait` (until the sidecar is ready) and
//! `request` (a call to Envoy's admin API), each a clap `Args` struct and an async `run`.

pub mod request;
pub mod wait;
