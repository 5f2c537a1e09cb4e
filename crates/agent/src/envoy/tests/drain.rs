//! Graceful drain under load, exit on zero active connections, and hot restart, with Envoy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use test_support::backend::{Backend, BackendOptions, http_get};
use tokio::time::{Instant, sleep};

use super::*;

fn request_loops(fixture: &Fixture, workers: usize, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Vec<u16>>> {
    (0..workers)
        .map(|_| {
            let url = format!("http://{}/productpage", fixture.listener);
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    statuses.push(http_get(&url, &[]).await.map_or(0, |response| response.status));
                }
                statuses
            })
        })
        .collect()
}

async fn slow_backend() -> Backend {
    let options = BackendOptions {
        delay: Duration::from_secs(1),
        ..BackendOptions::default()
    };
    Backend::start_with("slow", options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_in_flight_requests_finish() {
    let backend = slow_backend().await;
    let mut fixture = Fixture::new(backend.addr());
    fixture.config.termination_drain_duration = Duration::from_secs(2);
    let supervisor = Supervisor::start(fixture.config.clone()).unwrap();
    fixture.wait_live().await;

    let stop = Arc::new(AtomicBool::new(false));
    let loops = request_loops(&fixture, 6, &stop);
    sleep(Duration::from_millis(1500)).await;
    // The app stops sending as the pod goes away; what is in flight must complete.
    stop.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let late = async {
        // Listeners keep accepting while they drain.
        sleep(Duration::from_millis(300)).await;
        http_get(&format!("http://{}/late", fixture.listener), &[]).await
    };
    let (report, late) = tokio::join!(supervisor.drain_and_stop(), late);
    let report = report.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "waited the termination drain"
    );
    assert_eq!(report.code(), Some(0), "{report}");

    let late = late.unwrap();
    assert_eq!(late.status, 200);
    assert_eq!(
        late.header("connection"),
        Some("close"),
        "a draining Envoy sends clients away"
    );
    let mut statuses = Vec::new();
    for handle in loops {
        statuses.extend(handle.await.unwrap());
    }
    assert!(statuses.len() >= 6, "{statuses:?}");
    assert!(statuses.iter().all(|status| *status == 200), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_on_zero_active_connections_stops_once_requests_finish() {
    let backend = slow_backend().await;
    let mut fixture = Fixture::new(backend.addr());
    fixture.config.exit_on_zero_active_connections = true;
    fixture.config.minimum_drain_duration = Duration::from_millis(300);
    fixture.config.termination_drain_duration = Duration::from_secs(10);
    let options = SupervisorOptions {
        active_connection_poll: Duration::from_millis(200),
        ..SupervisorOptions::default()
    };
    let supervisor = Supervisor::start_with(fixture.config.clone(), options).unwrap();
    fixture.wait_live().await;

    let stop = Arc::new(AtomicBool::new(false));
    let loops = request_loops(&fixture, 4, &stop);
    sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let report = supervisor.drain_and_stop().await.unwrap();
    let took = started.elapsed();
    assert_eq!(report.code(), Some(0), "{report}");
    assert!(
        took >= Duration::from_millis(600),
        "waited for the in-flight requests: {took:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "stopped before the termination drain: {took:?}"
    );
    let mut statuses = Vec::new();
    for handle in loops {
        statuses.extend(handle.await.unwrap());
    }
    assert!(
        !statuses.is_empty() && statuses.iter().all(|status| *status == 200),
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_restart_hands_over_to_the_next_epoch() {
    let backend = Backend::start("productpage").await.unwrap();
    let mut fixture = Fixture::new(backend.addr());
    fixture.config.hot_restart = true;
    let (tx, mut rx) = events();
    let options = SupervisorOptions {
        events: Some(tx),
        ..SupervisorOptions::default()
    };
    let supervisor = Supervisor::start_with(fixture.config.clone(), options).unwrap();
    fixture.wait_live().await;
    assert_eq!(fixture.restart_epoch().await, Some(0));
    assert_eq!(fixture.get().await.unwrap(), 200);
    let parent = supervisor.pid().unwrap();
    let base_id_path = fixture.config.base_id_path();
    let base_id: u32 = std::fs::read_to_string(&base_id_path).unwrap().trim().parse().unwrap();
    assert!(process::shared_memory_path(base_id).exists());

    assert_eq!(supervisor.hot_restart().await.unwrap(), 1);
    let child = supervisor.pid().unwrap();
    assert_ne!(child, parent);
    let exit = next_event(&mut rx, READY, |event| matches!(event, SupervisorEvent::Exited(_))).await;
    let SupervisorEvent::Exited(report) = exit else {
        unreachable!()
    };
    assert_eq!(
        (report.epoch, report.pid, report.code()),
        (0, parent, Some(0)),
        "{report}"
    );
    let state = supervisor.state().borrow().clone();
    assert_eq!((state.epoch, state.pid, state.restarts), (Some(1), Some(child), 0));
    fixture.wait_live().await;
    assert_eq!(fixture.restart_epoch().await, Some(1));
    assert_eq!(fixture.get().await.unwrap(), 200);

    let report = supervisor.drain_and_stop().await.unwrap();
    assert_eq!((report.epoch, report.pid, report.code()), (1, child, Some(0)));
    assert!(
        !process::shared_memory_path(base_id).exists(),
        "the chain's shared memory is removed"
    );
    assert!(!base_id_path.exists());
}
