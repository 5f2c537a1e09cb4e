//! Envoy's command line, flag for flag as Istio's `envoy.args` builds it, plus the hot restart
//! flags (`--restart-epoch`, base id) that Istio's old epoch-based agent passed.

use std::ffi::OsString;
use std::path::PathBuf;

use super::EnvoyConfig;

/// The hot restart flags of one Envoy process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HotRestartArgs {
    /// `--disable-hot-restart` (Istio's default).
    Disabled,
    /// Epoch 0 of a chain: Envoy picks an unused base id and writes it to `base_id_path`, so that no
    /// two Envoys on the host share `/dev/shm/envoy_shared_memory_<id>`.
    First { base_id_path: PathBuf },
    /// A later epoch joins the chain of `base_id`.
    Next { epoch: u32, base_id: u32 },
}

impl HotRestartArgs {
    pub(crate) fn epoch(&self) -> u32 {
        match self {
            HotRestartArgs::Disabled | HotRestartArgs::First { .. } => 0,
            HotRestartArgs::Next { epoch, .. } => *epoch,
        }
    }
}

/// Splits Istio's single log level setting (`info,misc:error,upstream:debug`) into Envoy's `-l`
/// level and its component levels. Entries with more than one `:` are dropped.
pub fn split_component_log(level: &str) -> (Option<&str>, Vec<&str>) {
    let mut log_level = None;
    let mut components = Vec::new();
    for entry in level.split(',').filter(|entry| !entry.is_empty()) {
        match entry.matches(':').count() {
            0 => log_level = Some(entry),
            1 => components.push(entry),
            _ => tracing::warn!("dropping invalid log level: {entry}"),
        }
    }
    (log_level, components)
}

/// Envoy's arguments for the first epoch (or the only one, without hot restart).
pub fn envoy_args(config: &EnvoyConfig) -> Vec<OsString> {
    let restart = if config.hot_restart {
        HotRestartArgs::First {
            base_id_path: config.base_id_path(),
        }
    } else {
        HotRestartArgs::Disabled
    };
    epoch_args(config, &restart)
}

/// Envoy's arguments for one process.
pub(crate) fn epoch_args(config: &EnvoyConfig, restart: &HotRestartArgs) -> Vec<OsString> {
    let drain_seconds = config.drain_duration.as_secs().to_string();
    let mut args: Vec<OsString> = vec!["-c".into(), config.config_path.clone().into_os_string()];
    for (flag, value) in [
        ("--drain-time-s", drain_seconds.as_str()),
        // Clients are told to go away as soon as draining starts.
        ("--drain-strategy", "immediate"),
        ("--local-address-ip-version", config.local_address_ip_version.as_str()),
        // Access logs reach the file within a second instead of ten.
        ("--file-flush-interval-msec", "1000"),
    ] {
        args.extend([flag.into(), value.into()]);
    }

    match restart {
        HotRestartArgs::Disabled => args.push("--disable-hot-restart".into()),
        HotRestartArgs::First { base_id_path } => {
            args.extend(["--restart-epoch".into(), "0".into(), "--use-dynamic-base-id".into()]);
            args.extend(["--base-id-path".into(), base_id_path.clone().into_os_string()]);
        }
        HotRestartArgs::Next { epoch, base_id } => {
            args.extend(["--restart-epoch".into(), epoch.to_string().into()]);
            args.extend(["--base-id".into(), base_id.to_string().into()]);
        }
    }
    if *restart != HotRestartArgs::Disabled {
        let seconds = config.parent_shutdown_duration.as_secs().to_string();
        args.extend(["--parent-shutdown-time-s".into(), seconds.into()]);
    }
    args.push("--allow-unknown-static-fields".into());

    let (log_level, components) = split_component_log(&config.log_level);
    if let Some(level) = log_level {
        args.extend(["-l".into(), level.into()]);
    }
    if !components.is_empty() {
        args.extend(["--component-log-level".into(), components.join(",").into()]);
    } else if !config.component_log_level.is_empty() {
        args.extend([
            "--component-log-level".into(),
            config.component_log_level.clone().into(),
        ]);
    }
    if let Some(concurrency) = config.concurrency.filter(|concurrency| *concurrency > 0) {
        args.extend(["--concurrency".into(), concurrency.to_string().into()]);
    }
    if !config.service_cluster.is_empty() {
        args.extend(["--service-cluster".into(), config.service_cluster.clone().into()]);
    }
    if !config.service_node.is_empty() {
        args.extend(["--service-node".into(), config.service_node.clone().into()]);
    }
    args.extend(config.extra_args.iter().map(OsString::from));
    args
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|arg| arg.into_string().unwrap()).collect()
    }

    fn sidecar() -> EnvoyConfig {
        EnvoyConfig {
            config_path: "/etc/istio/proxy/envoy-rev.json".into(),
            service_node: "sidecar~10.1.1.1~productpage-v1-abc.default~default.svc.cluster.local".into(),
            ..EnvoyConfig::default()
        }
    }

    #[test]
    fn default_args_are_istios() {
        let args = strings(envoy_args(&sidecar()));
        let expected = [
            "-c",
            "/etc/istio/proxy/envoy-rev.json",
            "--drain-time-s",
            "45",
            "--drain-strategy",
            "immediate",
            "--local-address-ip-version",
            "v4",
            "--file-flush-interval-msec",
            "1000",
            "--disable-hot-restart",
            "--allow-unknown-static-fields",
            "-l",
            "warning",
            "--component-log-level",
            "misc:error",
            "--concurrency",
            "2",
            "--service-cluster",
            "istio-proxy",
            "--service-node",
            "sidecar~10.1.1.1~productpage-v1-abc.default~default.svc.cluster.local",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn component_levels_inside_the_log_level_win() {
        let config = EnvoyConfig {
            log_level: "info,upstream:debug,config:trace".into(),
            component_log_level: "misc:error".into(),
            ..sidecar()
        };
        let args = strings(envoy_args(&config));
        let l = args.iter().position(|arg| arg == "-l").unwrap();
        assert_eq!(args[l + 1], "info");
        let c = args.iter().position(|arg| arg == "--component-log-level").unwrap();
        assert_eq!(args[c + 1], "upstream:debug,config:trace");
        assert_eq!(split_component_log("a:b:c,debug"), (Some("debug"), vec![]));
        assert_eq!(split_component_log(""), (None, vec![]));
    }

    #[test]
    fn optional_flags_are_left_out_when_unset() {
        let config = EnvoyConfig {
            concurrency: Some(0),
            service_cluster: String::new(),
            service_node: String::new(),
            component_log_level: String::new(),
            local_address_ip_version: super::super::IpVersion::V6,
            drain_duration: Duration::from_millis(2500),
            extra_args: vec!["--log-format".into(), "%v".into()],
            ..sidecar()
        };
        let args = strings(envoy_args(&config));
        for absent in [
            "--concurrency",
            "--service-cluster",
            "--service-node",
            "--component-log-level",
        ] {
            assert!(!args.iter().any(|arg| arg == absent), "{absent} in {args:?}");
        }
        assert!(args.windows(2).any(|w| w == ["--drain-time-s", "2"]), "{args:?}");
        assert!(
            args.windows(2).any(|w| w == ["--local-address-ip-version", "v6"]),
            "{args:?}"
        );
        assert_eq!(args[args.len() - 2..], ["--log-format", "%v"]);
    }

    #[test]
    fn hot_restart_replaces_disable_hot_restart_with_epoch_flags() {
        let config = EnvoyConfig {
            hot_restart: true,
            parent_shutdown_duration: Duration::from_secs(60),
            ..sidecar()
        };
        let first = strings(envoy_args(&config));
        assert!(!first.iter().any(|arg| arg == "--disable-hot-restart"));
        let at = first.iter().position(|arg| arg == "--restart-epoch").unwrap();
        assert_eq!(
            first[at..at + 7],
            [
                "--restart-epoch",
                "0",
                "--use-dynamic-base-id",
                "--base-id-path",
                "/etc/istio/proxy/envoy-base-id",
                "--parent-shutdown-time-s",
                "60"
            ]
        );

        let next = strings(epoch_args(&config, &HotRestartArgs::Next { epoch: 3, base_id: 77 }));
        let at = next.iter().position(|arg| arg == "--restart-epoch").unwrap();
        assert_eq!(
            next[at..at + 6],
            [
                "--restart-epoch",
                "3",
                "--base-id",
                "77",
                "--parent-shutdown-time-s",
                "60"
            ]
        );
        assert!(!next.iter().any(|arg| arg == "--use-dynamic-base-id"));
    }
}
