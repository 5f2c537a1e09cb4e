//! pilot-agent: the agent beside every Envoy. It builds the node identity, writes Envoy's
//! bootstrap, runs and drains Envoy, proxies xDS between Envoy (Unix socket) and pilot-discovery,
//! and serves readiness and merged stats.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod bootstrap;
pub mod cmd;
pub mod config;
pub mod dns;
pub mod envoy;
pub mod iptables;
pub mod logging;
pub mod proxy;
pub mod readiness;
pub mod sds;
pub mod status;
pub mod xds_proxy;
