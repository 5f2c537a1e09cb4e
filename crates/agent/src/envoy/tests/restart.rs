//! Start, restart with backoff, the restart budget, stop and kill, with Envoy or a script.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use test_support::backend::Backend;
use test_support::envoy::envoy_bin;
use test_support::ports::free_port;
use tokio::time::{Instant, sleep, timeout};

use super::*;

#[tokio::test]
async fn envoy_killed_with_sigkill_is_restarted_and_serves_again() {
    let backend = Backend::start("productpage").await.unwrap();
    let fixture = Fixture::new(backend.addr());
    let (tx, mut rx) = events();
    let options = SupervisorOptions {
        events: Some(tx),
        ..SupervisorOptions::default()
    };
    let supervisor = Supervisor::start_with(fixture.config.clone(), options).unwrap();
    fixture.wait_live().await;
    assert_eq!(fixture.get().await.unwrap(), 200);
    let first = supervisor.pid().unwrap();
    assert!(matches!(
        supervisor.hot_restart().await,
        Err(EnvoyError::HotRestartDisabled)
    ));

    kill(Pid::from_raw(first as i32), Signal::SIGKILL).unwrap();
    let exit = next_event(&mut rx, READY, |event| matches!(event, SupervisorEvent::Exited(_))).await;
    let SupervisorEvent::Exited(report) = exit else {
        unreachable!()
    };
    assert_eq!((report.pid, report.signal(), report.code()), (first, Some(9), None));
    assert!(report.to_string().contains("killed by signal 9 (SIGKILL)"), "{report}");
    let scheduled = next_event(&mut rx, READY, |_| true).await;
    assert_eq!(
        scheduled,
        SupervisorEvent::RestartScheduled {
            attempt: 1,
            delay: Duration::from_millis(200)
        }
    );

    let mut state = supervisor.state();
    let state = timeout(READY, state.wait_for(|state| state.pid.is_some_and(|pid| pid != first)))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert_eq!((state.epoch, state.restarts), (Some(0), 1));
    let second = state.pid.unwrap();
    fixture.wait_live().await;
    assert_eq!(fixture.get().await.unwrap(), 200);

    let report = supervisor.drain_and_stop().await.unwrap();
    assert_eq!(
        (report.pid, report.code()),
        (second, Some(0)),
        "SIGTERM ends Envoy cleanly"
    );
    assert!(exited(first) && exited(second));
}

#[tokio::test]
async fn envoy_that_cannot_start_exhausts_the_restart_budget() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("envoy-rev.json");
    std::fs::write(&config_path, "{ this is not a bootstrap").unwrap();
    let config = EnvoyConfig {
        binary_path: envoy_bin().unwrap(),
        config_path,
        admin_port: free_port(),
        concurrency: Some(1),
        extra_args: vec!["--log-path".into(), dir.path().join("envoy.log").display().to_string()],
        ..EnvoyConfig::default()
    };
    let (tx, mut rx) = events();
    let options = SupervisorOptions {
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(2),
            ..RestartPolicy::default()
        },
        events: Some(tx),
        ..SupervisorOptions::default()
    };
    let started = Instant::now();
    let supervisor = Supervisor::start_with(config, options).unwrap();
    let err = timeout(Duration::from_secs(30), supervisor.wait())
        .await
        .unwrap()
        .unwrap_err();
    let EnvoyError::RestartBudgetExhausted { restarts, last, .. } = &err else {
        panic!("unexpected error {err}")
    };
    assert_eq!(*restarts, 10);
    assert_eq!(last.code(), Some(1), "{err}");
    assert!(err.to_string().contains("gave up after 10 restarts"), "{err}");

    let (mut starts, mut exits, mut delays) = (0, 0, Vec::new());
    while let Ok(event) = rx.try_recv() {
        match event {
            SupervisorEvent::Started { .. } => starts += 1,
            SupervisorEvent::Exited(report) => {
                assert!(!report.success());
                exits += 1
            }
            SupervisorEvent::RestartScheduled { attempt, delay } => {
                assert_eq!(attempt as usize, delays.len() + 1);
                delays.push(delay)
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((starts, exits), (11, 11));
    let expected: Vec<Duration> = (0..10).map(|n| Duration::from_millis(2 << n)).collect();
    assert_eq!(delays, expected);
    assert!(started.elapsed() >= delays.iter().sum::<Duration>());
    assert_eq!(supervisor.state().borrow().restarts, 10);
    assert!(matches!(
        supervisor.drain_and_stop().await,
        Err(EnvoyError::RestartBudgetExhausted { .. })
    ));
}

#[test]
fn default_backoff_is_200ms_doubling_with_a_budget_of_10() {
    let policy = RestartPolicy::default();
    assert_eq!(policy.max_restarts, 10);
    let delays: Vec<u128> = (0..10).map(|n| policy.backoff(n).as_millis()).collect();
    assert_eq!(delays, [200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200, 102400]);
    assert_eq!(policy.backoff(40), policy.initial_backoff * u32::MAX);
}

#[tokio::test]
async fn a_missing_binary_fails_at_once() {
    let config = EnvoyConfig {
        binary_path: "/nonexistent/envoy".into(),
        ..EnvoyConfig::default()
    };
    let err = Supervisor::start(config).err().unwrap();
    assert!(matches!(err, EnvoyError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/envoy"), "{err}");
}

#[tokio::test]
async fn a_healthy_run_resets_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let config = EnvoyConfig {
        binary_path: script(dir.path(), "sleep 0.2; exit 3"),
        admin_port: free_port(),
        ..EnvoyConfig::default()
    };
    let options = SupervisorOptions {
        restart: RestartPolicy {
            initial_backoff: Duration::from_millis(1),
            max_restarts: 2,
            healthy_uptime: Duration::from_millis(100),
        },
        ..SupervisorOptions::default()
    };
    let supervisor = Supervisor::start_with(config, options).unwrap();
    let mut state = supervisor.state();
    timeout(Duration::from_secs(10), state.wait_for(|state| state.restarts >= 5))
        .await
        .expect("each exit after a healthy run restarts")
        .unwrap();
    let report = supervisor.drain_and_stop().await.unwrap();
    assert!(report.code() == Some(3) || report.signal() == Some(15), "{report}");
}

#[tokio::test]
async fn envoy_ignoring_sigterm_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let config = EnvoyConfig {
        binary_path: script(dir.path(), "trap '' TERM\nwhile :; do sleep 0.05; done"),
        admin_port: free_port(),
        termination_drain_duration: Duration::ZERO,
        ..EnvoyConfig::default()
    };
    let options = SupervisorOptions {
        kill_grace: Duration::from_millis(500),
        ..SupervisorOptions::default()
    };
    let supervisor = Supervisor::start_with(config, options).unwrap();
    sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let report = supervisor.drain_and_stop().await.unwrap();
    assert_eq!(report.signal(), Some(9), "{report}");
    assert!(started.elapsed() >= Duration::from_millis(500));
}

#[tokio::test]
async fn dropping_the_supervisor_kills_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let config = EnvoyConfig {
        binary_path: script(dir.path(), "exec sleep 30"),
        ..EnvoyConfig::default()
    };
    let supervisor = Supervisor::start(config).unwrap();
    let pid = supervisor.pid().unwrap();
    sleep(Duration::from_millis(100)).await;
    assert!(!exited(pid));
    drop(supervisor);
    wait_exited(pid).await;
}

#[tokio::test]
async fn envoy_exiting_cleanly_by_itself_is_not_restarted() {
    let backend = Backend::start("productpage").await.unwrap();
    let fixture = Fixture::new(backend.addr());
    let supervisor = Supervisor::start(fixture.config.clone()).unwrap();
    fixture.wait_live().await;
    let pid = supervisor.pid().unwrap();
    let quit = test_support::backend::http_request(
        "POST",
        &format!("{}/quitquitquit", fixture.admin()),
        &[],
        Vec::new(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(quit.status, 200);
    let report = timeout(READY, supervisor.wait()).await.unwrap().unwrap();
    assert_eq!((report.pid, report.code()), (pid, Some(0)));
    assert_eq!(supervisor.state().borrow().restarts, 0);
}

#[test]
fn hot_restart_is_opt_in_through_the_environment() {
    let env = |value: &'static str| move |name: &str| (name == ENABLE_ENVOY_HOT_RESTART).then(|| value.to_owned());
    assert!(hot_restart_enabled(env("true")));
    assert!(hot_restart_enabled(env("1")));
    assert!(!hot_restart_enabled(env("false")));
    assert!(!hot_restart_enabled(|_| None));
    assert!(!EnvoyConfig::default().hot_restart);
    assert!(envoy_args(&EnvoyConfig::default()).contains(&"--disable-hot-restart".into()));
}
