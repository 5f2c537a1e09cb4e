//! Tests of the directory watcher with real file-system events. Timeouts are generous and only
//! bound how long a broken test hangs; nothing asserts on speed.

use std::fs;
use std::time::Duration;

use model::{ConfigKey, ConfigKind, ConfigSpec};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::time::timeout;

use super::*;
use crate::testutil::{service_entry, service_entry_with_host, write};
use model::event::ConfigEvent;

const WAIT: Duration = Duration::from_secs(20);

fn key(name: &str) -> ConfigKey {
    ConfigKey {
        kind: ConfigKind::ServiceEntry,
        namespace: "default".into(),
        name: name.into(),
    }
}

fn summary(events: &[ConfigEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            ConfigEvent::Added(c) => format!("+{}", c.meta.name),
            ConfigEvent::Updated { new, .. } => format!("~{}", new.meta.name),
            ConfigEvent::Deleted(c) => format!("-{}", c.meta.name),
        })
        .collect()
}

fn host_of(event: &ConfigEvent) -> String {
    match event.current().map(|c| &c.spec) {
        Some(ConfigSpec::ServiceEntry(se)) => se.hosts[0].clone(),
        other => panic!("{other:?}"),
    }
}

/// Receives changes until the events so far (in order) satisfy `done`.
async fn events_until(w: &mut ConfigDirWatch, done: impl Fn(&[String]) -> bool) -> Vec<ConfigEvent> {
    let mut got = Vec::new();
    let result = timeout(WAIT, async {
        while !done(&summary(&got)) {
            match w.changes.recv().await {
                Some(change) => {
                    assert!(!change.is_empty(), "empty changes are never sent");
                    got.extend(change.events);
                }
                None => panic!("watcher stopped"),
            }
        }
    })
    .await;
    assert!(result.is_ok(), "timed out; events so far: {:?}", summary(&got));
    got
}

/// Waits until the published state satisfies `done`.
async fn state_until(w: &mut ConfigDirWatch, done: impl Fn(&StoreSnapshot) -> bool) -> StoreSnapshot {
    let result = timeout(WAIT, w.state.wait_for(|s| done(s)))
        .await
        .map(|r| r.map(|state| state.clone()));
    match result {
        Ok(Ok(state)) => state,
        _ => panic!("timed out waiting for state; last: {:?}", w.state.borrow().errors),
    }
}

/// Starts a watch and waits for its first rescan, so later events come from the test's actions.
async fn start(dir: &Path) -> ConfigDirWatch {
    let mut w = watch(dir).unwrap();
    let first = w.initial.scans;
    state_until(&mut w, |s| s.scans > first).await;
    w
}

/// As editors and `kubectl`-style tools write: a hidden temporary file, renamed over `name`.
fn rename_over(dir: &Path, name: &str, text: &str) {
    let temp = format!(".{name}.tmp");
    write(dir, &temp, text);
    fs::rename(dir.join(&temp), dir.join(name)).unwrap();
}

fn assert_no_change(w: &mut ConfigDirWatch) {
    match w.changes.try_recv() {
        Err(TryRecvError::Empty) => {}
        other => panic!("expected no change, got {other:?}"),
    }
}

#[tokio::test]
async fn create_modify_delete_produce_events() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    let mut w = start(tmp.path()).await;
    assert_eq!(w.initial.configs.len(), 1);

    write(tmp.path(), "b.yaml", &service_entry("b"));
    let got = events_until(&mut w, |s| s.contains(&"+b".to_owned())).await;
    assert_eq!(summary(&got), ["+b"]);

    write(tmp.path(), "b.yaml", &service_entry_with_host("b", "b2.example.com"));
    let got = events_until(&mut w, |s| !s.is_empty()).await;
    assert_eq!(summary(&got), ["~b"]);
    assert_eq!(host_of(&got[0]), "b2.example.com");

    fs::remove_file(tmp.path().join("a.yaml")).unwrap();
    let got = events_until(&mut w, |s| !s.is_empty()).await;
    assert_eq!(summary(&got), ["-a"]);
    let state = state_until(&mut w, |s| !s.configs.contains_key(&key("a"))).await;
    assert!(state.configs.contains_key(&key("b")));
}

#[tokio::test]
async fn renames_move_in_within_and_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("conf");
    let outside = tmp.path().join("outside");
    fs::create_dir_all(&dir).unwrap();
    write(&outside, "m.yaml", &service_entry("m"));
    let mut w = start(&dir).await;

    fs::rename(outside.join("m.yaml"), dir.join("m.yaml")).unwrap();
    assert_eq!(summary(&events_until(&mut w, |s| !s.is_empty()).await), ["+m"]);

    fs::create_dir(dir.join("sub")).unwrap();
    fs::rename(dir.join("m.yaml"), dir.join("sub/renamed.yaml")).unwrap();
    let moved = dir.join("sub/renamed.yaml");
    state_until(&mut w, |s| s.origins.get(&key("m")) == Some(&moved)).await;
    assert_no_change(&mut w);

    fs::rename(&moved, outside.join("gone.yaml")).unwrap();
    assert_eq!(summary(&events_until(&mut w, |s| !s.is_empty()).await), ["-m"]);
}

#[tokio::test]
async fn atomic_rename_over_is_one_update() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "se.yaml", &service_entry("se"));
    let mut w = start(tmp.path()).await;
    rename_over(tmp.path(), "se.yaml", &service_entry_with_host("se", "new.example.com"));
    let got = events_until(&mut w, |s| !s.is_empty()).await;
    assert_eq!(summary(&got), ["~se"]);
    assert_eq!(host_of(&got[0]), "new.example.com");
}

/// A change to one file of many reads that file, not the directory (1,000 files take 10-15 ms).
#[tokio::test]
async fn a_change_to_one_file_reads_that_file_only() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..30 {
        write(tmp.path(), &format!("se-{i}.yaml"), &service_entry(&format!("se-{i}")));
    }
    let mut w = start(tmp.path()).await;
    let before = w.state.borrow().files_read;
    rename_over(
        tmp.path(),
        "se-7.yaml",
        &service_entry_with_host("se-7", "seven.example.com"),
    );
    let got = events_until(&mut w, |s| !s.is_empty()).await;
    assert_eq!(summary(&got), ["~se-7"]);
    let state = state_until(&mut w, |s| s.configs.len() == 30 && s.files_read > before).await;
    assert_eq!(state.files_read - before, 1, "only se-7.yaml read again");
}

#[tokio::test]
async fn directories_created_later_are_watched() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = start(tmp.path()).await;
    write(tmp.path(), "x/y/nested.yaml", &service_entry("nested"));
    assert_eq!(summary(&events_until(&mut w, |s| !s.is_empty()).await), ["+nested"]);
    // A change inside the new directory is seen too.
    write(
        tmp.path(),
        "x/y/nested.yaml",
        &service_entry_with_host("nested", "n2.example.com"),
    );
    assert_eq!(summary(&events_until(&mut w, |s| !s.is_empty()).await), ["~nested"]);
}

#[tokio::test]
async fn rewriting_the_same_content_gives_no_event() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    let mut w = start(tmp.path()).await;
    let before = w.state.borrow().scans;
    write(tmp.path(), "a.yaml", &service_entry("a"));
    let state = state_until(&mut w, |s| s.scans > before).await;
    assert_no_change(&mut w);
    // Our own reads of the files do not wake the watcher again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.state.borrow().scans, state.scans);
}

/// A writer that truncates a file and writes it later: the empty file in between is never read
/// (it would delete the config), the file is read once closed.
#[tokio::test]
async fn a_file_open_for_writing_is_read_once_it_is_closed() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    let mut w = start(tmp.path()).await;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(tmp.path().join("a.yaml"))
        .unwrap();
    file.write_all(b"# being written\n").unwrap();
    // Well past a batch's settling time: the watcher waits for the close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_no_change(&mut w);
    file.write_all(service_entry_with_host("a", "new.example.com").as_bytes())
        .unwrap();
    drop(file);
    let got = events_until(&mut w, |s| !s.is_empty()).await;
    assert_eq!(summary(&got), ["~a"]);
    assert_eq!(host_of(&got[0]), "new.example.com");
}

/// A stream of changes is read in batches (a rescan reads every file), not once per change.
#[tokio::test]
async fn a_stream_of_changes_is_read_in_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = start(tmp.path()).await;
    for i in 0..10 {
        write(tmp.path(), &format!("s{i}.yaml"), &service_entry(&format!("s{i}")));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut batches = 0;
    let mut got = Vec::new();
    while got.len() < 10 {
        let change = timeout(WAIT, w.changes.recv()).await.unwrap().unwrap();
        batches += 1;
        got.extend(summary(&change.events));
    }
    got.sort();
    let want: Vec<String> = (0..10).map(|i| format!("+s{i}")).collect();
    assert_eq!(got, want);
    assert!(batches <= 3, "{batches} batches for 10 changes in 0.5 s");
}

#[tokio::test]
async fn syntax_error_keeps_last_good_while_other_files_change() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    write(tmp.path(), "b.yaml", &service_entry("b"));
    let mut w = start(tmp.path()).await;
    write(tmp.path(), "a.yaml", "kind: [broken\n");
    let state = state_until(&mut w, |s| !s.errors.is_empty()).await;
    assert!(state.errors[0].reason.contains("syntax error"), "{:?}", state.errors);
    assert!(state.configs.contains_key(&key("a")));
    assert_no_change(&mut w);

    write(tmp.path(), "b.yaml", &service_entry_with_host("b", "b2.example.com"));
    assert_eq!(summary(&events_until(&mut w, |s| !s.is_empty()).await), ["~b"]);
}

#[tokio::test]
async fn survives_the_directory_being_deleted_and_recreated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("conf");
    write(&dir, "a.yaml", &service_entry("a"));
    let mut w = start(&dir).await;

    fs::remove_dir_all(&dir).unwrap();
    let state = state_until(&mut w, |s| !s.errors.is_empty()).await;
    assert!(state.configs.contains_key(&key("a")), "the last good config is kept");
    assert_no_change(&mut w);

    write(&dir, "b.yaml", &service_entry("b"));
    let got = events_until(&mut w, |s| s.contains(&"+b".to_owned()) && s.contains(&"-a".to_owned())).await;
    assert_eq!(summary(&got), ["+b", "-a"]);
    // The new directory is watched again.
    write(&dir, "b.yaml", &service_entry_with_host("b", "b2.example.com"));
    assert_eq!(summary(&events_until(&mut w, |s| !s.is_empty()).await), ["~b"]);
}

#[cfg(unix)]
#[tokio::test]
async fn configmap_data_symlink_swap_is_an_update() {
    use std::os::unix::fs::symlink;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "..2024_01/se.yaml", &service_entry("se"));
    symlink("..2024_01", dir.join("..data")).unwrap();
    symlink("..data/se.yaml", dir.join("se.yaml")).unwrap();
    let mut w = start(dir).await;
    assert_eq!(w.initial.configs.len(), 1);

    // What the kubelet does: new timestamped dir, new ..data_tmp link renamed over ..data.
    write(
        dir,
        "..2024_02/se.yaml",
        &service_entry_with_host("se", "swapped.example.com"),
    );
    symlink("..2024_02", dir.join("..data_tmp")).unwrap();
    fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    fs::remove_dir_all(dir.join("..2024_01")).unwrap();
    let got = events_until(&mut w, |s| !s.is_empty()).await;
    assert_eq!(summary(&got), ["~se"]);
    assert_eq!(host_of(&got[0]), "swapped.example.com");
}

#[tokio::test]
async fn dropping_the_changes_receiver_stops_the_watcher() {
    let tmp = tempfile::tempdir().unwrap();
    let w = start(tmp.path()).await;
    let ConfigDirWatch { changes, mut state, .. } = w;
    drop(changes);
    // The thread ends and drops its side of the state channel.
    let stopped = timeout(WAIT, async { while state.changed().await.is_ok() {} }).await;
    assert!(stopped.is_ok(), "watcher still running");
}

/// One config file, alone or with hidden siblings (an atomic write's temporary file), ends its
/// batch after the short quiet spell; several files, a directory, or an unknown change wait for
/// the long one, so that a `git checkout` stays one batch.
#[test]
fn a_batch_of_one_config_file_settles_sooner() {
    let batch = |signals: Vec<Signal>| {
        let mut b = Batch::default();
        for s in signals {
            b.note(s);
        }
        b.settle()
    };
    let p = |s: &str| PathBuf::from(format!("/conf/{s}"));
    assert_eq!(batch(vec![Signal::Written(p("vs.yaml"))]), SETTLE_ONE_FILE);
    let atomic = vec![
        Signal::Changed(vec![p(".vs.yaml.tmp")]),
        Signal::Writing(p(".vs.yaml.tmp")),
        Signal::Written(p(".vs.yaml.tmp")),
        Signal::Changed(vec![p(".vs.yaml.tmp"), p("vs.yaml")]),
    ];
    assert_eq!(batch(atomic), SETTLE_ONE_FILE);
    assert_eq!(
        batch(vec![Signal::Written(p("a.yaml")), Signal::Written(p("b.yaml"))]),
        SETTLE
    );
    assert_eq!(batch(vec![Signal::Changed(vec![p("new-dir")])]), SETTLE);
    assert_eq!(batch(vec![Signal::Changed(vec![p("notes.txt")])]), SETTLE);
    assert_eq!(batch(vec![Signal::Changed(Vec::new())]), SETTLE);
    assert_eq!(
        batch(vec![Signal::Written(p("vs.yaml")), Signal::Changed(Vec::new())]),
        SETTLE
    );
}

/// The watcher's timing over a script of events, without a clock: `events` are (milliseconds
/// from the start, signal) in order, each read takes `read`; the batches as (when read, in ms
/// from the start; how many events). Events that come during a read wait for it, as in the
/// signal channel.
fn batches(events: Vec<(u64, Signal)>, read: Duration) -> Vec<(u64, usize)> {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let ms = |t: Instant| u64::try_from(t.duration_since(t0).as_millis()).unwrap();
    let mut events = events.into_iter().peekable();
    let mut pace = Pace::default();
    let mut free_at = t0;
    let mut out = Vec::new();
    while let Some((first_ms, first)) = events.next() {
        let first_at = at(first_ms).max(free_at);
        let mut pending = Pending::new(first, first_at, pace.not_before(first_at));
        let mut count = 1;
        let mut now = first_at;
        while let Some(wait) = pending.wait(now) {
            match events.peek() {
                Some((next_ms, _)) if at(*next_ms).max(now) <= now + wait => {
                    let (next_ms, signal) = events.next().unwrap();
                    now = at(next_ms).max(now);
                    pending.note(signal, now);
                    count += 1;
                }
                _ => now += wait,
            }
        }
        out.push((ms(now), count));
        pace.changed(now, now + read);
        free_at = now + read;
    }
    out
}

fn written(name: &str) -> Signal {
    Signal::Written(PathBuf::from(format!("/conf/{name}")))
}

/// A VirtualService rewritten by rename, as `kubectl` or an editor does it: its events at once.
fn atomic_write(ms: u64, name: &str) -> Vec<(u64, Signal)> {
    let tmp = PathBuf::from(format!("/conf/.{name}.tmp"));
    vec![
        (ms, Signal::Changed(vec![tmp.clone()])),
        (ms, Signal::Writing(tmp.clone())),
        (ms, Signal::Written(tmp.clone())),
        (ms, Signal::Changed(vec![tmp, PathBuf::from(format!("/conf/{name}"))])),
    ]
}

/// A lone change is read as soon as its events settle (2 ms for one file), whether it follows
/// the previous one by 0.2, 0.6 or 2 s: no change waits for the previous one's second.
#[test]
fn a_change_after_a_quiet_spell_is_read_once_it_settles() {
    for gap in [200, 600, 2000] {
        let events: Vec<_> = (0..5).flat_map(|i| atomic_write(i * gap, "vs.yaml")).collect();
        let want: Vec<_> = (0..5).map(|i| (i * gap + 2, 4)).collect();
        assert_eq!(
            batches(events, Duration::from_millis(1)),
            want,
            "changes {gap} ms apart"
        );
    }
    // Also right after the STORM_GAP.
    let mut events = atomic_write(0, "vs.yaml");
    events.extend(atomic_write(103, "vs.yaml"));
    assert_eq!(batches(events, Duration::from_millis(1)), [(2, 4), (105, 4)]);
}

/// Events that keep coming (a file rewritten every millisecond for 5 s, or every 10 ms for 5 s)
/// are read once a second, as before (the first change at once when a quiet spell ends it).
#[test]
fn a_storm_is_read_once_a_second() {
    for every in [1, 10] {
        let events: Vec<_> = (0..5000 / every)
            .flat_map(|i| atomic_write(i * every, "vs.yaml"))
            .collect();
        let got = batches(events, Duration::from_millis(1));
        if every == 10 {
            assert_eq!(got[0], (2, 4), "the first change is read at once: {got:?}");
        } else {
            // events 1 ms apart never leave the 2 ms quiet: the first batch lasts MAX_BATCH
            assert_eq!(got[0].0, 1000, "{got:?}");
        }
        assert!(
            got.len() <= 7,
            "{} batches in 5 s ({every} ms apart): {got:?}",
            got.len()
        );
        for pair in got[1..].windows(2) {
            assert!(pair[1].0 - pair[0].0 >= 999, "reads a second apart: {got:?}");
        }
    }
    // A storm that stops: the next change after a quiet spell is read at once again.
    let mut events: Vec<_> = (0..100).flat_map(|i| atomic_write(i * 10, "vs.yaml")).collect();
    events.extend(atomic_write(3000, "vs.yaml"));
    let got = batches(events, Duration::from_millis(1));
    assert_eq!(got.last(), Some(&(3002, 4)), "{got:?}");
}

/// A `git checkout` of 3,000 files, their events a few microseconds apart (all at once here) and
/// then a few stragglers up to 50 ms later: read as at most two batches.
#[test]
fn a_checkout_of_many_files_is_one_or_two_batches() {
    let checkout = || -> Vec<_> { (0..3000).map(|i| (0, written(&format!("f{i}.yaml")))).collect() };
    assert_eq!(batches(checkout(), Duration::from_millis(200)), [(10, 3000)]);
    let mut events = checkout();
    events.extend((0..5).map(|i| (20 + i * 10, written(&format!("late{i}.yaml")))));
    let got = batches(events, Duration::from_millis(200));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1].0, 1010, "the stragglers wait for the storm's second: {got:?}");
}

/// An editor that writes a file in several events (write, close, attribute change) within a
/// millisecond: one batch, read once the file is closed.
#[test]
fn an_editor_write_in_several_events_is_one_batch() {
    let path = PathBuf::from("/conf/vs.yaml");
    let events = vec![
        (0, Signal::Writing(path.clone())),
        (0, Signal::Writing(path.clone())),
        (1, Signal::Written(path.clone())),
        (1, Signal::Changed(vec![path.clone()])),
    ];
    assert_eq!(batches(events, Duration::from_millis(1)), [(3, 4)]);
    // A file held open for writing for 300 ms is read once closed, not before.
    let events = vec![
        (0, Signal::Writing(path.clone())),
        (300, Signal::Writing(path.clone())),
        (301, Signal::Written(path)),
    ];
    assert_eq!(batches(events, Duration::from_millis(1)), [(303, 3)]);
}

/// A batch ends [`MAX_BATCH`] after it could first be read, whatever comes: a file open for
/// writing that is never closed is read after a second.
#[test]
fn a_batch_ends_after_max_batch_whatever_comes() {
    let path = PathBuf::from("/conf/vs.yaml");
    let events = vec![(0, Signal::Writing(path.clone())), (5000, Signal::Written(path))];
    let got = batches(events, Duration::from_millis(1));
    assert_eq!(got[0], (1000, 1), "{got:?}");
}
