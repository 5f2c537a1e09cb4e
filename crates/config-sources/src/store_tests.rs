//! Tests of `FileConfigStore`: per-file last good contents, dropped documents, duplicates, errors.

use std::sync::Mutex;

use model::ConfigKind;

use super::*;
use crate::testutil::{service_entry, service_entry_with_host, write};
use model::event::ConfigEvent;
use model::event::Level;

fn se_key(name: &str) -> ConfigKey {
    ConfigKey {
        kind: ConfigKind::ServiceEntry,
        namespace: "default".into(),
        name: name.into(),
    }
}

fn names(store: &FileConfigStore) -> Vec<String> {
    store.configs().iter().map(|c| c.meta.name.clone()).collect()
}

fn summary(change: &ConfigChange) -> Vec<String> {
    change
        .events
        .iter()
        .map(|e| match e {
            ConfigEvent::Added(c) => format!("+{}", c.meta.name),
            ConfigEvent::Updated { new, .. } => format!("~{}", new.meta.name),
            ConfigEvent::Deleted(c) => format!("-{}", c.meta.name),
        })
        .collect()
}

#[test]
fn loads_nested_files_and_answers_queries() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "a.yaml",
        &format!("{}---\n{}", service_entry("a1"), service_entry("a2")),
    );
    write(tmp.path(), "nested/deeper/b.yml", &service_entry("b"));
    write(tmp.path(), "notes.txt", &service_entry("ignored"));
    let store = FileConfigStore::load(tmp.path()).unwrap();
    assert_eq!(names(&store), ["a1", "a2", "b"]);
    assert_eq!(store.get(&se_key("b")).unwrap().meta.name, "b");
    assert!(store.get(&se_key("ignored")).is_none());
    assert_eq!(
        store.origin(&se_key("b")),
        Some(tmp.path().join("nested/deeper/b.yml").as_path())
    );
    assert!(store.errors().is_empty(), "{:?}", store.errors());
    assert_eq!(store.config_snapshot().len(), 3);
}

#[test]
fn missing_directory_fails_load_but_a_later_loss_keeps_config() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        FileConfigStore::load(tmp.path().join("nope")),
        Err(SourceError::Directory { .. })
    ));

    let dir = tmp.path().join("conf");
    write(&dir, "a.yaml", &service_entry("a"));
    let mut store = FileConfigStore::load(&dir).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    assert!(store.rescan().is_empty());
    assert_eq!(names(&store), ["a"]);
    let errors = store.errors();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].reason.contains("keeping the 1 resources"), "{errors:?}");

    write(&dir, "b.yaml", &service_entry("b"));
    assert_eq!(summary(&store.rescan()), ["+b", "-a"]);
    assert!(store.errors().is_empty());
}

#[test]
fn invalid_documents_are_dropped_counted_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = service_entry("bad").replace("resolution:", "resolutionz:");
    write(tmp.path(), "mixed.yaml", &[service_entry("good"), bad].join("---\n"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut store = FileConfigStore::new(tmp.path());
    let sink = seen.clone();
    store.set_invalid_observer(Arc::new(move |kind: &str| sink.lock().unwrap().push(kind.to_owned())));
    let change = store.rescan();
    assert_eq!(summary(&change), ["+good"]);
    let errors = store.errors();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, tmp.path().join("mixed.yaml"));
    assert_eq!(errors[0].resource.as_deref(), Some("ServiceEntry default/bad"));
    assert_eq!(errors[0].level, Level::Error);
    assert_eq!(store.invalid_counts().get("ServiceEntry"), Some(&1));
    assert_eq!(*seen.lock().unwrap(), ["ServiceEntry"]);

    // Same bytes: not parsed again, so not counted again.
    assert!(store.rescan().is_empty());
    assert_eq!(store.invalid_counts().get("ServiceEntry"), Some(&1));
    assert_eq!(store.snapshot().scans, 2);
}

#[test]
fn syntax_error_keeps_last_good_contents_and_other_files_move_on() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "a.yaml",
        &format!("{}---\n{}", service_entry("a1"), service_entry("a2")),
    );
    write(tmp.path(), "b.yaml", &service_entry("b"));
    let mut store = FileConfigStore::load(tmp.path()).unwrap();

    write(tmp.path(), "a.yaml", "apiVersion: [unclosed\n");
    write(tmp.path(), "b.yaml", &service_entry_with_host("b", "b2.example.com"));
    assert_eq!(summary(&store.rescan()), ["~b"]);
    assert_eq!(names(&store), ["a1", "a2", "b"]);
    let errors = store.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].reason.contains("syntax error"), "{errors:?}");
    assert!(errors[0].reason.contains("keeping the 2 resources"), "{errors:?}");

    write(tmp.path(), "a.yaml", &service_entry("a1"));
    assert_eq!(summary(&store.rescan()), ["-a2"]);
    assert!(store.errors().is_empty());

    // A new file that never parsed contributes nothing.
    write(tmp.path(), "c.json", "{\"kind\": ");
    assert!(store.rescan().is_empty());
    assert_eq!(store.errors().len(), 1);
}

#[test]
fn deleted_file_deletes_its_configs() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    write(tmp.path(), "sub/b.yaml", &service_entry("b"));
    let mut store = FileConfigStore::load(tmp.path()).unwrap();
    fs::remove_dir_all(tmp.path().join("sub")).unwrap();
    assert_eq!(summary(&store.rescan()), ["-b"]);
    fs::remove_file(tmp.path().join("a.yaml")).unwrap();
    assert_eq!(summary(&store.rescan()), ["-a"]);
    assert!(store.configs().is_empty());
}

#[test]
fn duplicate_key_first_sorted_path_wins_and_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "a.yaml",
        &service_entry_with_host("dup", "from-a.example.com"),
    );
    write(
        tmp.path(),
        "b.yaml",
        &service_entry_with_host("dup", "from-b.example.com"),
    );
    let mut store = FileConfigStore::load(tmp.path()).unwrap();
    let host = |store: &FileConfigStore| match &store.get(&se_key("dup")).unwrap().spec {
        model::ConfigSpec::ServiceEntry(se) => se.hosts[0].clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(host(&store), "from-a.example.com");
    let errors = store.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].file, tmp.path().join("b.yaml"));
    assert!(
        errors[0]
            .reason
            .contains(&tmp.path().join("a.yaml").display().to_string()),
        "{errors:?}"
    );
    assert_eq!(errors[0].resource.as_deref(), Some("ServiceEntry default/dup"));

    // The second copy takes over when the first goes away.
    fs::remove_file(tmp.path().join("a.yaml")).unwrap();
    assert_eq!(summary(&store.rescan()), ["~dup"]);
    assert_eq!(host(&store), "from-b.example.com");
    assert!(store.errors().is_empty());
}

#[test]
fn unknown_kinds_skipped_and_unsupported_kinds_kept_with_warnings() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\n\
                apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: logs, namespace: istio-system}\n\
                spec: {}\n";
    write(tmp.path(), "telemetry.yaml", text);
    let store = FileConfigStore::load(tmp.path()).unwrap();
    let configs = store.configs();
    assert_eq!(configs.len(), 1);
    assert_eq!(configs[0].kind, ConfigKind::Telemetry);
    let errors = store.errors();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().all(|e| e.level == Level::Warning), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.reason.contains("unknown kind \"Widget\"")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.reason.contains("not yet supported")),
        "{errors:?}"
    );
    assert!(store.invalid_counts().is_empty());
}

#[cfg(unix)]
#[test]
fn unreadable_file_keeps_last_good_contents() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    let mut store = FileConfigStore::load(tmp.path()).unwrap();
    let path = tmp.path().join("a.yaml");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o000)).unwrap();
    if fs::read(&path).is_ok() {
        return; // running as root: permissions are not enforced
    }
    assert!(store.rescan().is_empty());
    assert_eq!(names(&store), ["a"]);
    assert!(store.errors()[0].reason.contains("cannot read"), "{:?}", store.errors());
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    assert!(store.rescan().is_empty());
    assert!(store.errors().is_empty());
}

#[test]
fn non_utf8_contents_keep_last_good_contents() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &service_entry("a"));
    let mut store = FileConfigStore::load(tmp.path()).unwrap();
    fs::write(tmp.path().join("a.yaml"), b"kind: \xff\xfe\n").unwrap();
    assert!(store.rescan().is_empty());
    assert_eq!(names(&store), ["a"]);
    let errors = store.errors();
    assert!(errors[0].reason.contains("not UTF-8"), "{errors:?}");
    assert!(errors[0].reason.contains("keeping the 1 resources"), "{errors:?}");
}

#[test]
fn invalid_update_keeps_the_last_valid_version() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "se.yaml",
        &format!("{}---\n{}", service_entry("a"), service_entry("b")),
    );
    let mut store = FileConfigStore::load(tmp.path()).unwrap();
    let before = store.get(&se_key("a")).unwrap();
    // "a" becomes invalid (an unknown field), "b" is removed from the file.
    let broken = service_entry("a").replace("resolution: STATIC", "resolution: STATIC\n  bogus: 1");
    assert_ne!(
        broken,
        service_entry("a"),
        "test fixture must contain the replaced line"
    );
    write(tmp.path(), "se.yaml", &broken);
    let change = store.rescan();
    assert_eq!(summary(&change), vec!["-b"]);
    assert_eq!(store.get(&se_key("a")), Some(before));
    let errors = store.errors();
    assert!(errors.iter().any(|e| e.reason.contains("bogus")), "{errors:?}");
    assert_eq!(store.invalid_counts().get("ServiceEntry"), Some(&1));
    // A new resource that is invalid from the start is not kept.
    write(
        tmp.path(),
        "new.yaml",
        &service_entry("c").replace("resolution: STATIC", "resolution: STATIC\n  bogus: 1"),
    );
    store.rescan();
    assert!(store.get(&se_key("c")).is_none());
}

/// A file that sorts earlier and redefines a live resource does not take it over: the live one
/// keeps serving, the newcomer is named in the error, warned about and counted once.
#[test]
fn a_newcomer_never_replaces_a_live_resource() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "b.yaml",
        &service_entry_with_host("dup", "live.example.com"),
    );
    let mut store = FileConfigStore::new(tmp.path());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    store.set_invalid_observer(Arc::new(move |kind: &str| sink.lock().unwrap().push(kind.to_owned())));
    assert_eq!(summary(&store.rescan()), ["+dup"]);
    let host = |store: &FileConfigStore| match &store.get(&se_key("dup")).unwrap().spec {
        model::ConfigSpec::ServiceEntry(se) => se.hosts[0].clone(),
        other => panic!("{other:?}"),
    };

    write(
        tmp.path(),
        "a.yaml",
        &service_entry_with_host("dup", "newcomer.example.com"),
    );
    assert!(store.rescan().is_empty(), "the live resource is unchanged");
    assert_eq!(host(&store), "live.example.com");
    let errors = store.errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].file, tmp.path().join("a.yaml"), "the newcomer is named");
    assert!(errors[0].reason.contains("b.yaml"), "{errors:?}");
    store.rescan();
    assert_eq!(*seen.lock().unwrap(), ["ServiceEntry"], "counted once");
    assert_eq!(store.invalid_counts().get("ServiceEntry"), Some(&1));

    // The newcomer takes over once the live one is gone.
    fs::remove_file(tmp.path().join("b.yaml")).unwrap();
    assert_eq!(summary(&store.rescan()), ["~dup"]);
    assert_eq!(host(&store), "newcomer.example.com");
    assert!(store.errors().is_empty());
}

/// `rescan_paths` reads only the files events named, and falls back to a full walk when the
/// paths cannot tell what changed.
#[test]
fn rescan_paths_reads_only_the_named_files_unless_it_cannot_tell() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for i in 0..20 {
        write(dir, &format!("se-{i}.yaml"), &service_entry(&format!("se-{i}")));
    }
    let mut store = FileConfigStore::load(dir).unwrap();
    let read = |s: &FileConfigStore| s.snapshot().files_read;
    assert_eq!(read(&store), 20);

    // One file changed (written beside, renamed over): that file is read, the hidden
    // temporary name is not config.
    write(dir, "se-3.yaml", &service_entry_with_host("se-3", "other.example.com"));
    let tmp_name = dir.join(".se-3.yaml.tmp");
    let change = store.rescan_paths([tmp_name.as_path(), dir.join("se-3.yaml").as_path()]);
    assert_eq!(summary(&change), ["~se-3"]);
    assert_eq!(read(&store), 21);

    // A removed file, and a new one.
    fs::remove_file(dir.join("se-4.yaml")).unwrap();
    write(dir, "new.yaml", &service_entry("new"));
    let change = store.rescan_paths([dir.join("se-4.yaml").as_path(), dir.join("new.yaml").as_path()]);
    assert_eq!(summary(&change), ["+new", "-se-4"]);
    assert_eq!(read(&store), 22);

    // Not config: nothing read, nothing changed.
    write(dir, "notes.txt", "hello");
    assert!(store.rescan_paths([dir.join("notes.txt").as_path()]).is_empty());
    assert_eq!(read(&store), 22);

    // A directory moved in: only a walk finds its files (the unchanged ones are read, not parsed).
    write(dir, "sub/a.yaml", &service_entry("sub-a"));
    let change = store.rescan_paths([dir.join("sub").as_path()]);
    assert_eq!(summary(&change), ["+sub-a"]);
    assert_eq!(read(&store), 22 + 21);

    // ... and moved away: what was under it goes, without a walk.
    fs::rename(dir.join("sub"), tmp.path().join(".gone")).unwrap();
    let change = store.rescan_paths([dir.join("sub").as_path()]);
    assert_eq!(summary(&change), ["-sub-a"]);
    assert_eq!(read(&store), 43);

    // A tree with a symlink in it: always a full walk (a ConfigMap's files change through `..data`).
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.join("se-0.yaml"), dir.join("link.yaml")).unwrap();
        store.rescan();
        let before = read(&store);
        write(dir, "se-5.yaml", &service_entry_with_host("se-5", "five.example.com"));
        let change = store.rescan_paths([dir.join("se-5.yaml").as_path()]);
        assert_eq!(summary(&change), ["~se-5"]);
        assert!(read(&store) - before > 10, "a full walk");
    }
}

/// `rescan_paths` updates only the keys of the files it read, and ends where a full rebuild ends:
/// the same configs, owners, duplicates and errors, and the same events, through a long run of
/// writes, rewrites and deletions of files that define the same keys (a deterministic sequence).
#[test]
fn reading_named_files_ends_as_a_full_rebuild_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut incremental = FileConfigStore::load(dir).unwrap();
    let mut full = FileConfigStore::load(dir).unwrap();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    for step in 0..400 {
        let file = format!("f{}.yaml", next(6));
        let path = dir.join(&file);
        if next(5) == 0 {
            let _ = std::fs::remove_file(&path);
        } else {
            // One to three documents from a small set of names: duplicates within and across files.
            let docs: Vec<String> = (0..=next(3))
                .map(|_| {
                    let name = format!("se-{}", next(4));
                    match next(4) {
                        0 => "kind: [broken\n".to_owned(),
                        1 => service_entry_with_host(&name, &format!("v{step}.example.com")),
                        _ => service_entry(&name),
                    }
                })
                .collect();
            write(dir, &file, &docs.join("---\n"));
        }
        let got = incremental.rescan_paths([path.as_path()]);
        let want = full.rescan();
        assert_eq!(summary(&got), summary(&want), "step {step}: {file}");
        assert_eq!(incremental.configs, full.configs, "step {step}");
        assert_eq!(incremental.origins, full.origins, "step {step}");
        assert_eq!(incremental.source_errors(), full.source_errors(), "step {step}");
        assert_eq!(incremental.invalid_counts, full.invalid_counts, "step {step}");
    }
}

/// A snapshot keeps what it showed while the store reads on: once `detach` gave the store maps of
/// its own, reading a file changes them in place, never the snapshot's; without it, a map the
/// snapshot shares is copied first.
#[test]
fn snapshots_keep_their_configs_while_the_store_changes_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(dir, "se-1.yaml", &service_entry("se-1"));
    write(dir, "se-2.yaml", &service_entry("se-2"));
    let mut store = FileConfigStore::load(dir).unwrap();
    let before = store.snapshot();
    store.detach();
    let (configs, origins) = (Arc::as_ptr(&store.configs), Arc::as_ptr(&store.origins));

    write(dir, "se-1.yaml", &service_entry_with_host("se-1", "other.example.com"));
    fs::remove_file(dir.join("se-2.yaml")).unwrap();
    let change = store.rescan_paths([dir.join("se-1.yaml").as_path(), dir.join("se-2.yaml").as_path()]);
    assert_eq!(summary(&change), ["~se-1", "-se-2"]);
    assert_eq!(Arc::as_ptr(&store.configs), configs, "changed in place");
    assert_eq!(Arc::as_ptr(&store.origins), origins, "changed in place");
    assert_eq!(before.configs.len(), 2);
    assert_eq!(before.origins.len(), 2);
    let old = &before.configs[&se_key("se-1")];
    let new = store.get(&se_key("se-1")).unwrap();
    assert!(!Arc::ptr_eq(old, &new) && **old != *new);

    let shared = store.snapshot();
    write(dir, "se-1.yaml", &service_entry("se-1"));
    let change = store.rescan_paths([dir.join("se-1.yaml").as_path()]);
    assert_eq!(summary(&change), ["~se-1"]);
    assert!(Arc::ptr_eq(&shared.configs[&se_key("se-1")], &new));
    assert!(!Arc::ptr_eq(&store.configs, &shared.configs));
}
