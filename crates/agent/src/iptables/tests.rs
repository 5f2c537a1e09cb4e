//! Tests: flag parsing and errors, the rule builder's rendering and undo, TPROXY routes,
//! cleanup plans; Istio's goldens (`golden`); applying in a real network namespace (`kernel`).

mod golden;
mod kernel;

use std::net::Ipv4Addr;

use clap::Parser;

use super::builder::{RuleBuilder, undo_built_in};
use super::config::{Config, ConfigError, DnsServers, InterceptionMode, IptablesArgs};
use super::{Capture, cleanup_plan, rules, tproxy};

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: IptablesArgs,
}

fn args(flags: &[&str]) -> IptablesArgs {
    let mut argv = vec!["istio-iptables"];
    argv.extend_from_slice(flags);
    Cli::try_parse_from(argv).unwrap().args
}

fn config_with(flags: &[&str], dns: DnsServers) -> Result<Config, ConfigError> {
    Config::from_args(&args(flags), dns)
}

fn config(flags: &[&str], dns_v4: &[Ipv4Addr]) -> Result<Config, ConfigError> {
    config_with(
        flags,
        DnsServers {
            v4: dns_v4.to_vec(),
            v6: Vec::new(),
        },
    )
}

const DNS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);

/// istio-init's args as Istio's injection template writes them (`pkg/kube/inject/testdata/inject/
/// hello.yaml.injected`), with the logging flags that pilot-agent's root command gives every
/// subcommand: they parse, and `Config.Print`'s variables show them.
#[test]
fn injected_istio_init_args_parse_with_istios_logging_flags() {
    let a = args(&[
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "REDIRECT",
        "-i",
        "*",
        "-x",
        "",
        "-b",
        "*",
        "-d",
        "15090,15021,15020",
        "--log_output_level=default:info",
        "--log_as_json",
    ]);
    assert_eq!(a.log.output_level, "default:info");
    assert!(a.log.as_json);
    let vars = a.variables();
    assert!(
        vars.starts_with("PROXY_PORT=15001\nPROXY_INBOUND_CAPTURE_PORT=15006\n"),
        "{vars}"
    );
    assert!(vars.contains("\nINBOUND_PORTS_EXCLUDE=15090,15021,15020\n"), "{vars}");
    assert!(Config::from_args(&a, DnsServers::default()).is_ok());
}

#[test]
fn restore_output_is_iptables_restore_input() {
    let cfg = config(&["-b", "*", "-d", "22", "-o", "3306", "-x", "10.1.0.0/16"], &[]).unwrap();
    let out = rules::build(&cfg).restore_v4();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"* nat"));
    assert_eq!(lines.last(), Some(&"COMMIT"));
    assert!(lines.contains(&"-A ISTIO_INBOUND -p tcp --dport 22 -j RETURN"));
    assert!(lines.contains(&"-A ISTIO_OUTPUT -p tcp --dport 3306 -j RETURN"));
    assert!(lines.contains(&"-A ISTIO_OUTPUT -p udp --dport 3306 -j RETURN"));
    assert!(lines.contains(&"-A ISTIO_OUTPUT -d 10.1.0.0/16 -j RETURN"));
    // Inbound exclusions come before the catch-all redirect.
    let pos = |l: &str| lines.iter().position(|x| *x == l).unwrap();
    assert!(pos("-A ISTIO_INBOUND -p tcp --dport 22 -j RETURN") < pos("-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT"));
    // Custom ports and uid.
    let custom = rules::build(&config(&["-p", "16001", "-z", "16006", "-u", "1000"], &[]).unwrap()).restore_v4();
    assert!(custom.contains("-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 16001\n"));
    assert!(custom.contains("-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 16006\n"));
    assert!(custom.contains("-A ISTIO_OUTPUT -m owner --uid-owner 1000 -j RETURN\n"));
    // Without --enable-inbound-ipv6 there is no ip6tables input.
    assert_eq!(rules::build(&cfg).restore_v6(), None);
}

#[test]
fn builder_renders_as_istio() {
    let mut b = RuleBuilder::new(true);
    b.append("nat", "PREROUTING", "-p tcp -j ISTIO_INBOUND");
    b.append_v4("nat", "ISTIO_OUTPUT", "-j ISTIO_REDIRECT");
    b.append("mangle", "ISTIO_DIVERT", "-j ACCEPT");
    b.insert("nat", "ISTIO_OUTPUT", 1, "-o lo -j RETURN");
    b.append_versioned("127.0.0.1/32", "::1/128", "nat", "ISTIO_OUTPUT", |lo| {
        format!("-d {lo} -j RETURN")
    });
    let set = b.build();
    // Tables by name; chains in order of first use, then chains only jumped to; built-ins never.
    assert_eq!(
        set.restore_v4(),
        "* mangle\n-N ISTIO_DIVERT\n-A ISTIO_DIVERT -j ACCEPT\nCOMMIT\n\
         * nat\n-N ISTIO_OUTPUT\n-N ISTIO_INBOUND\n-N ISTIO_REDIRECT\n-A PREROUTING -p tcp -j ISTIO_INBOUND\n\
         -A ISTIO_OUTPUT -j ISTIO_REDIRECT\n-I ISTIO_OUTPUT 1 -o lo -j RETURN\n-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n\
         COMMIT\n"
    );
    let v6 = set.restore_v6().unwrap();
    assert!(v6.contains("-A ISTIO_OUTPUT -d ::1/128 -j RETURN\n"), "{v6}");
    assert!(!v6.contains("ISTIO_REDIRECT"), "v4-only rule leaked into v6:\n{v6}");
    // Undo: built-in chains only, last first, insert positions dropped.
    let mut b = RuleBuilder::new(false);
    b.insert("nat", "PREROUTING", 1, "-i eth1 -j RETURN");
    b.append("nat", "ISTIO_OUTPUT", "-j RETURN");
    b.append("mangle", "OUTPUT", "-p tcp -j MARK --set-mark 1338");
    let set = b.build();
    assert_eq!(
        undo_built_in(&set.v4),
        vec![
            vec![
                "-t",
                "mangle",
                "-D",
                "OUTPUT",
                "-p",
                "tcp",
                "-j",
                "MARK",
                "--set-mark",
                "1338"
            ],
            vec!["-t", "nat", "-D", "PREROUTING", "-i", "eth1", "-j", "RETURN"],
        ]
    );
}

#[test]
fn tproxy_routes_follow_istio_configure_routes() {
    let cmds = |c: &[tproxy::IpCommand]| c.iter().map(ToString::to_string).collect::<Vec<_>>();
    let cfg = config(&["-m", "TPROXY", "-b", "*"], &[]).unwrap();
    let routes = tproxy::routes(&cfg);
    assert_eq!(
        cmds(&routes.setup),
        [
            "ip -4 rule add fwmark 1337 lookup 133",
            "ip -4 route add local 0.0.0.0/0 dev lo table 133"
        ]
    );
    assert_eq!(
        cmds(&routes.cleanup),
        [
            "ip -4 rule del fwmark 1337 lookup 133",
            "ip -4 route del local 0.0.0.0/0 dev lo table 133"
        ]
    );
    // Custom mark and table reach both the rules and the routes.
    let cfg = config(
        &[
            "-m",
            "tproxy",
            "-b",
            "80",
            "-t",
            "100",
            "-r",
            "200",
            "--enable-inbound-ipv6",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(cfg.inbound_interception_mode, InterceptionMode::Tproxy);
    let capture = Capture::new(&cfg);
    assert_eq!(
        cmds(&capture.routes.setup),
        [
            "ip -6 addr add ::6/128 dev lo",
            "ip -4 rule add fwmark 100 lookup 200",
            "ip -6 rule add fwmark 100 lookup 200",
            "ip -4 route add local 0.0.0.0/0 dev lo table 200",
            "ip -6 route add local ::/0 dev lo table 200"
        ]
    );
    let v4 = capture.rules.restore_v4();
    assert!(
        v4.contains("-j TPROXY --tproxy-mark 100/0xffffffff --on-port 15006\n"),
        "{v4}"
    );
    assert!(v4.contains("-A ISTIO_DIVERT -j MARK --set-mark 100\n"), "{v4}");
    assert!(
        v4.contains("-I ISTIO_INBOUND 1 -p tcp -m mark --mark 100 -j RETURN\n"),
        "{v4}"
    );
    let dry = capture.dry_run();
    assert!(dry.contains("# ip6tables-restore --noflush\n* mangle\n"), "{dry}");
    assert!(
        dry.ends_with("# ip -6 route add local ::/0 dev lo table 200\n"),
        "{dry}"
    );
    // No routes without TPROXY or without inbound capture.
    assert_eq!(tproxy::routes(&config(&["-b", "*"], &[]).unwrap()), Default::default());
    assert_eq!(
        tproxy::routes(&config(&["-m", "TPROXY"], &[]).unwrap()),
        Default::default()
    );
    // --cleanup-only --dry-run lists what would be deleted.
    let cleanup = Capture::new(&config(&["-m", "TPROXY", "-b", "*", "-c", "nic0"], &[]).unwrap()).dry_run_cleanup();
    assert!(
        cleanup.contains("# iptables -t mangle -D PREROUTING -i nic0 -j RETURN\n"),
        "{cleanup}"
    );
    assert!(
        cleanup.contains("# ip -4 rule del fwmark 1337 lookup 133\n"),
        "{cleanup}"
    );
}

#[test]
fn bad_flags_name_the_flag() {
    let err = config(&["-i", "10.0.0.0/33"], &[]).unwrap_err();
    assert!(
        matches!(err, ConfigError::Cidr { flag, .. } if flag.contains("-i")),
        "{err}"
    );
    assert!(err.to_string().contains("10.0.0.0/33"));
    assert!(config(&["-i", "fd00::/129"], &[]).is_err());
    let err = config(&["-x", "not-an-ip"], &[]).unwrap_err();
    assert!(err.to_string().contains("--istio-service-exclude-cidr"), "{err}");
    assert_eq!(
        config(&["-x", "*"], &[]).unwrap_err(),
        ConfigError::Wildcard {
            flag: "--istio-service-exclude-cidr (-x)"
        }
    );
    let err = config(&["-b", "80,http"], &[]).unwrap_err();
    assert!(
        err.to_string().contains("--istio-inbound-ports (-b)") && err.to_string().contains("http"),
        "{err}"
    );
    for (flag, value, name) in [
        ("-o", "70000", "(-o)"),
        ("-p", "0", "(-p)"),
        ("-z", "x", "(-z)"),
        ("-d", "1x", "(-d)"),
        ("-t", "mark", "(-t)"),
        ("-r", "4294967296", "(-r)"),
    ] {
        let err = config(&[flag, value], &[]).unwrap_err();
        assert!(err.to_string().contains(name), "{flag}: {err}");
    }
    assert!(matches!(config(&["-m", "NAT"], &[]).unwrap_err(), ConfigError::Mode(m) if m == "NAT"));
    assert!(matches!(
        config(&["--iptables-version", "v9"], &[]).unwrap_err(),
        ConfigError::Version(_)
    ));
    assert!(matches!(
        config(&["--host-ipv4-loopback-cidr", "::1/128"], &[]).unwrap_err(),
        ConfigError::Cidr { .. }
    ));
    assert!(
        config(&["-k", "eth0;rm"], &[])
            .unwrap_err()
            .to_string()
            .contains("(-k)")
    );
}

#[test]
fn flags_parse_as_istio() {
    let a = args(&["--dry-run"]);
    assert!(a.dry_run);
    assert!(!args(&["--dry-run=false"]).dry_run);
    assert!(!args(&[]).dry_run);
    let c = config(
        &[
            "-b",
            "*",
            "-d",
            "15020,15021,",
            "-i",
            "10.0.0.0/8,fd00::/8",
            "-u",
            "0,1337",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(c.inbound_ports_include, Some(vec![]));
    assert_eq!(c.inbound_ports_exclude, vec![15020, 15021]);
    let include = &c.outbound_ip_ranges_include;
    assert_eq!(
        include.v4.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.0.0.0/8"]
    );
    assert_eq!(
        include.v6.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["fd00::/8"]
    );
    assert_eq!(c.proxy_uids, vec!["0", "1337"]);
    assert_eq!(
        (c.proxy_port, c.inbound_capture_port, c.inbound_tunnel_port),
        (15001, 15006, 15008)
    );
    assert_eq!(c.inbound_interception_mode, InterceptionMode::Redirect);
    assert_eq!((c.inbound_tproxy_mark, c.inbound_tproxy_route_table), (1337, 133));
    assert!(!c.enable_ipv6);
    assert!(config(&["--enable-inbound-ipv6"], &[]).unwrap().enable_ipv6);
    assert!(!config(&["--enable-inbound-ipv6=false"], &[]).unwrap().enable_ipv6);
    let tp = config(
        &["--istio-inbound-tproxy-mark", "7", "--inbound-tproxy-route-table", "9"],
        &[],
    )
    .unwrap();
    assert_eq!((tp.inbound_tproxy_mark, tp.inbound_tproxy_route_table), (7, 9));
    assert_eq!(config(&["-b", ""], &[]).unwrap().inbound_ports_include, None);
    // The CLI itself rejects unknown flags with exit 2 (clap's usage error).
    let err = Cli::try_parse_from(["istio-iptables", "--no-such-flag"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn resolv_conf_nameservers() {
    let text = "# comment\nnameserver 10.96.0.10\nnameserver fd00:0::10\nnameserver bogus\n\
                search default.svc.cluster.local\n";
    let servers = DnsServers::from_resolv_conf(text);
    assert_eq!(servers.v4, vec![Ipv4Addr::new(10, 96, 0, 10)]);
    assert_eq!(servers.v6, vec!["fd00::10"]);
    // IPv6 servers only matter to the ip6tables rules.
    let cfg = config_with(&["--redirect-dns", "--enable-inbound-ipv6"], servers).unwrap();
    let set = rules::build(&cfg);
    assert!(
        set.restore_v4()
            .contains("-d 10.96.0.10/32 -j REDIRECT --to-ports 15053")
    );
    let v6 = set.restore_v6().unwrap();
    assert!(
        v6.contains("-A ISTIO_OUTPUT_DNS -p udp --dport 53 -d fd00::10/128 -j REDIRECT --to-port 15053"),
        "{v6}"
    );
    assert!(!v6.contains("10.96.0.10"), "{v6}");
    // DNS capture needs a server or --capture-all-dns.
    let none = rules::build(&config(&["--redirect-dns"], &[]).unwrap()).restore_v4();
    assert!(!none.contains("ISTIO_OUTPUT_DNS") && !none.contains("* raw"), "{none}");
    let all = rules::build(&config(&["--redirect-dns", "--capture-all-dns"], &[DNS]).unwrap()).restore_v4();
    assert!(
        all.contains("-A ISTIO_OUTPUT_DNS -p udp --dport 53 -j REDIRECT --to-port 15053\n"),
        "{all}"
    );
    assert!(
        all.contains("-A ISTIO_INBOUND -p udp --sport 53 -j CT --zone 1\n"),
        "{all}"
    );
    assert!(!all.contains("127.0.0.53"), "{all}");
}

/// Istio's `flag.AdditionalEnv`: ISTIO_META_DNS_CAPTURE (and INVALID_DROP, ISTIO_DUAL_STACK) set
/// the flag unless the command line does; a value that is not a Go boolean is ignored.
#[test]
fn injector_env_sets_flags_the_command_line_did_not() {
    use clap::{CommandFactory, FromArgMatches};
    let parse = |flags: &[&str], env: &[(&str, &str)]| {
        let mut argv = vec!["istio-iptables"];
        argv.extend_from_slice(flags);
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        let mut args = Cli::from_arg_matches(&matches).unwrap().args;
        args.apply_additional_env(&matches, |var| {
            env.iter().find(|(k, _)| *k == var).map(|(_, v)| (*v).to_owned())
        });
        args
    };
    assert!(!parse(&[], &[]).redirect_dns);
    assert!(parse(&[], &[("ISTIO_META_DNS_CAPTURE", "true")]).redirect_dns);
    assert!(parse(&[], &[("ISTIO_META_DNS_CAPTURE", "1")]).redirect_dns);
    assert!(!parse(&[], &[("ISTIO_META_DNS_CAPTURE", "yes")]).redirect_dns);
    assert!(!parse(&["--redirect-dns=false"], &[("ISTIO_META_DNS_CAPTURE", "true")]).redirect_dns);
    let a = parse(&[], &[("INVALID_DROP", "true"), ("ISTIO_DUAL_STACK", "True")]);
    assert!(a.drop_invalid && a.enable_ipv6 && !a.redirect_dns);
    assert!(!parse(&["--enable-inbound-ipv6=false"], &[("ISTIO_DUAL_STACK", "true")]).enable_ipv6);
}

#[test]
fn cleanup_deletes_jumps_and_chains_only() {
    let saved = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :ISTIO_INBOUND - [0:0]\n:ISTIO_OUTPUT - [0:0]\n:OTHER - [0:0]\n\
        -A PREROUTING -p tcp -j ISTIO_INBOUND\n-A PREROUTING -p udp -j OTHER\n-A OUTPUT -j ISTIO_OUTPUT\n\
        -A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n*mangle\n:PREROUTING ACCEPT [0:0]\n:ISTIO_DROP - [0:0]\n\
        -A PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP\n-A ISTIO_DROP -j DROP\nCOMMIT\n";
    let plan = cleanup_plan(saved);
    assert_eq!(
        plan,
        "* nat\n-D PREROUTING -p tcp -j ISTIO_INBOUND\n-D OUTPUT -j ISTIO_OUTPUT\n-F ISTIO_INBOUND\n-F ISTIO_OUTPUT\n\
         -X ISTIO_INBOUND\n-X ISTIO_OUTPUT\nCOMMIT\n* mangle\n-D PREROUTING -m conntrack --ctstate INVALID -j ISTIO_DROP\n\
         -F ISTIO_DROP\n-X ISTIO_DROP\nCOMMIT\n"
    );
    // Nothing of Istio's left: nothing to do (cleanup is idempotent).
    assert_eq!(
        cleanup_plan("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p udp -j OTHER\nCOMMIT\n"),
        ""
    );
}
