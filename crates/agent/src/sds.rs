//! Workload identity in the agent: the secret manager that gets the workload certificate from
//! the mesh CA (or mounted files) and renews it, and the SDS server that hands it to Envoy.

mod ca_client;
mod cache;
mod files;
mod problem;
mod server;

pub use ca_client::{CaClient, CaClientError, CaTls, Signed};
pub use cache::{ROOT, SecretError, SecretItem, SecretManager, WORKLOAD};
pub use files::{FileSecretError, MAX_SECRET_FILE};
pub use problem::Problem;
pub use server::{SdsServer, SdsStatus};

#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod tests;
