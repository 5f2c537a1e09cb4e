//! Test helpers shared by the workspace's tests: an ADS client that checks the xDS protocol on
//! every response, real Envoy processes on loopback, loopback HTTP backends, and fakes of the
//! Kubernetes API server and of Consul.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]
pub mod ads;
pub mod agent;
pub mod backend;
pub mod bin;
pub mod bootstrap;
pub mod consul;
pub mod discovery;
pub mod envoy;
pub mod figures;
pub mod kube_api;
pub mod kubelet;
pub mod mesh_ca;
pub mod netns;
pub mod ports;
pub mod tls;
