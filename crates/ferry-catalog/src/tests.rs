use proptest::prelude::*;

use crate::find::plan;
use crate::*;

fn mem() -> Catalog {
    Catalog::open(&Location::Memory, "here").unwrap()
}

fn commit(path: &str, size: u64) -> Commit {
    Commit {
        path: path.to_owned(),
        size,
        mtime_ns: 1_000 * size as i64,
        digest: vec![size as u8; 32],
        algo: "blake3".into(),
        stored_by: "alice".into(),
        physical: format!("/srv/{path}"),
    }
}

fn avu(attr: &str, value: &str, unit: &str) -> Avu {
    Avu {
        attr: attr.into(),
        value: value.into(),
        unit: unit.into(),
    }
}

fn paths(found: Vec<Object>) -> Vec<String> {
    found.into_iter().map(|o| o.path).collect()
}

#[test]
fn an_audit_pages_this_servers_objects_and_marks_its_replicas() {
    let c = mem();
    for p in ["d/a", "d/b", "d/sub/c", "d0", "e/x", "d"] {
        c.register_commit(&commit(p, 3)).unwrap();
    }
    // At the path and under it, in path order, page by page; not `d0` nor `e/x`.
    assert_eq!(paths(c.held_page("d", "", 2).unwrap()), ["d", "d/a"]);
    assert_eq!(
        paths(c.held_page("d/", "d/a", 10).unwrap()),
        ["d/b", "d/sub/c"]
    );
    assert_eq!(c.held_page("", "", 100).unwrap().len(), 6);
    assert_eq!(paths(c.held_page("e/x", "", 9).unwrap()), ["e/x"]);
    assert!(c.set_replica_state("d/b", ReplicaState::Bad).unwrap());
    assert_eq!(
        c.stat("d/b").unwrap().unwrap().replicas[0].state,
        ReplicaState::Bad
    );
    assert!(!c.set_replica_state("nope", ReplicaState::Bad).unwrap());
    assert!(c.is_registered("d/sub/c").unwrap());
    assert!(!c.is_registered("d/sub").unwrap());
}

#[test]
fn register_then_stat_shows_the_object_and_its_replica() {
    let c = mem();
    assert_eq!(c.schema_version().unwrap(), 2);
    c.register_commit(&commit("a/b.txt", 7)).unwrap();
    let s = c.stat("a/b.txt").unwrap().unwrap();
    assert_eq!(s.object.size, 7);
    assert_eq!(s.object.digest, vec![7; 32]);
    assert_eq!(s.object.stored_by, "alice");
    assert!(s.object.stored_at > 0);
    assert_eq!(
        s.replicas,
        vec![Replica {
            server: "here".into(),
            physical: "/srv/a/b.txt".into(),
            state: ReplicaState::Good
        }]
    );
    assert!(c.stat("a/b").unwrap().is_none());
    // Registering again replaces, it does not add.
    c.register_commit(&commit("a/b.txt", 9)).unwrap();
    assert_eq!(c.count().unwrap(), 1);
    assert_eq!(c.stat("a/b.txt").unwrap().unwrap().object.size, 9);
}

#[test]
fn reopening_a_file_keeps_what_was_registered_and_migrates_once() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::Sqlite(dir.path().join("catalog.sqlite"));
    Catalog::open(&loc, "here")
        .unwrap()
        .register_commit(&commit("x", 1))
        .unwrap();
    let c = Catalog::open(&loc, "here").unwrap();
    assert_eq!(c.schema_version().unwrap(), 2);
    assert_eq!(c.count().unwrap(), 1);
    let mode: String = c
        .lock()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_catalog_is_kept_for_one_root_of_a_server() {
    let c = mem();
    c.claim_root("/srv/a").unwrap();
    c.claim_root("/srv/a").unwrap();
    let e = c.claim_root("/srv/b").unwrap_err();
    assert!(matches!(e, CatalogError::OtherRoot { .. }), "{e}");
    assert!(e.to_string().contains("/srv/a"), "{e}");
    // Another server of a shared catalog has a root of its own.
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::Sqlite(dir.path().join("c.sqlite"));
    Catalog::open(&loc, "one")
        .unwrap()
        .claim_root("/a")
        .unwrap();
    Catalog::open(&loc, "two")
        .unwrap()
        .claim_root("/b")
        .unwrap();
    assert!(Catalog::open(&loc, "one")
        .unwrap()
        .claim_root("/b")
        .is_err());
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let loc = Location::Sqlite(dir.path().join("c.sqlite"));
    let c = Catalog::open(&loc, "here").unwrap();
    c.lock()
        .execute(
            "INSERT INTO catalog_migrations (version, applied_at) VALUES (99, 0)",
            [],
        )
        .unwrap();
    drop(c);
    let e = Catalog::open(&loc, "here").unwrap_err();
    assert!(
        matches!(
            e,
            CatalogError::TooNew {
                found: 99,
                known: 2
            }
        ),
        "{e}"
    );
}

#[test]
fn postgres_is_refused_until_it_exists() {
    assert!(matches!(
        Location::parse("postgres://db/ferry"),
        Err(CatalogError::Unsupported(_))
    ));
    assert_eq!(
        Location::parse("/var/lib/ferry/catalog.sqlite").unwrap(),
        Location::Sqlite("/var/lib/ferry/catalog.sqlite".into())
    );
    assert!(Location::parse("").is_err());
}

#[test]
fn intents_are_reconciled_by_what_is_there() {
    let c = mem();
    c.intend(&[commit("kept", 1), commit("lost", 2)]).unwrap();
    assert_eq!(c.pending().unwrap().len(), 2);
    let r = c.reconcile(|f| f.path == "kept").unwrap();
    assert_eq!(
        r,
        Reconciled {
            registered: 1,
            dropped: 1
        }
    );
    assert!(c.pending().unwrap().is_empty());
    assert!(c.stat("kept").unwrap().is_some());
    assert!(c.stat("lost").unwrap().is_none());
    // Registering clears a file's intent.
    c.intend(&[commit("n", 3)]).unwrap();
    c.register(&[commit("n", 3)]).unwrap();
    assert!(c.pending().unwrap().is_empty());
}

#[test]
fn queued_registrations_are_seen_by_every_read_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let c = Catalog::open(&Location::Sqlite(dir.path().join("c.sqlite")), "here").unwrap();
    assert_eq!(
        c.device(),
        Some(std::os::unix::fs::MetadataExt::dev(
            &std::fs::metadata(dir.path()).unwrap()
        ))
    );
    let files: Vec<Commit> = (0..3000).map(|i| commit(&format!("q/{i:04}"), 7)).collect();
    for chunk in files.chunks(100) {
        c.intend_unsynced(chunk).unwrap();
        c.register_later(chunk.to_vec());
    }
    // No settle first: the reads wait for what was queued before them.
    assert_eq!(c.count().unwrap(), 3000);
    assert!(c.pending().unwrap().is_empty());
    assert!(c.stat("q/2999").unwrap().is_some());
    c.settle().unwrap();
    // What is queued when the catalog closes is registered before it does.
    c.intend_unsynced(&[commit("last", 1)]).unwrap();
    c.register_later(vec![commit("last", 1)]);
    drop(c);
    let c = Catalog::open(&Location::Sqlite(dir.path().join("c.sqlite")), "here").unwrap();
    assert!(c.stat("last").unwrap().is_some());
    assert!(c.pending().unwrap().is_empty());
}

#[test]
fn a_queued_registration_that_fails_is_reported_and_its_intent_kept() {
    let c = mem();
    let heard = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = heard.clone();
    c.on_register_error(Box::new(move |_, n| {
        h.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }));
    let mut bad = commit("bad", 1);
    bad.algo = "x".repeat(17);
    c.intend(&[commit("good", 1)]).unwrap();
    c.register_later(vec![bad]);
    assert!(matches!(c.settle(), Err(CatalogError::TooLong { .. })));
    assert_eq!(heard.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert!(c.settle().is_ok(), "an error is told once");
    assert_eq!(c.pending().unwrap().len(), 1);
}

#[test]
fn registering_older_contents_keeps_a_newer_intent_of_the_same_path() {
    let c = mem();
    let old = commit("p", 1);
    let new = commit("p", 2);
    c.intend(std::slice::from_ref(&old)).unwrap();
    // A second put of the same path writes its intent before the first is registered.
    c.intend(std::slice::from_ref(&new)).unwrap();
    c.register(&[old]).unwrap();
    assert_eq!(c.pending().unwrap(), std::slice::from_ref(&new));
    c.register(&[new]).unwrap();
    assert!(c.pending().unwrap().is_empty());
}

#[test]
fn remove_and_remove_prefix_touch_only_their_paths() {
    let c = mem();
    for p in ["d/a", "d/b/c", "d0", "dd/x", "d"] {
        c.register_commit(&commit(p, 1)).unwrap();
    }
    assert!(c.remove("d0").unwrap());
    assert!(!c.remove("d0").unwrap());
    // `d` itself (a file of that name) and everything under `d/`, not `dd/`.
    assert_eq!(c.remove_prefix("d/").unwrap(), 3);
    assert_eq!(paths(c.find(&Query::default()).unwrap()), ["dd/x"]);
}

#[test]
fn rename_moves_a_file_or_a_directory_and_refuses_to_clobber() {
    let c = mem();
    for p in ["a/x", "a/y/z", "ab", "b"] {
        c.register_commit(&commit(p, 1)).unwrap();
    }
    c.meta_set("a/x", &avu("k", "v", "")).unwrap();
    assert_eq!(c.rename("a", "c/d").unwrap(), 2);
    assert_eq!(
        paths(c.find(&Query::default()).unwrap()),
        ["ab", "b", "c/d/x", "c/d/y/z"]
    );
    assert_eq!(c.meta_ls("c/d/x").unwrap(), [avu("k", "v", "")]);
    assert!(matches!(c.rename("ab", "b"), Err(CatalogError::Exists(_))));
    assert!(matches!(c.rename("ab", "c"), Err(CatalogError::Exists(_))));
    assert!(matches!(
        c.rename("nope", "n"),
        Err(CatalogError::NotFound(_))
    ));
    assert_eq!(c.rename("ab", "é/ü").unwrap(), 1);
    assert_eq!(c.rename("é", "e").unwrap(), 1);
    assert!(c.stat("e/ü").unwrap().is_some());
}

#[test]
fn metadata_set_rm_ls_and_bounds() {
    let c = mem();
    c.register_commit(&commit("f", 1)).unwrap();
    c.meta_set("f", &avu("project", "pds", "")).unwrap();
    c.meta_set("f", &avu("project", "mars", "")).unwrap();
    c.meta_set("f", &avu("temp", "20", "C")).unwrap();
    c.meta_set("f", &avu("temp", "20", "K")).unwrap();
    assert_eq!(
        c.meta_ls("f").unwrap(),
        [
            avu("project", "mars", ""),
            avu("project", "pds", ""),
            avu("temp", "20", "K")
        ]
    );
    assert_eq!(c.meta_rm("f", "project", Some("pds")).unwrap(), 1);
    assert_eq!(c.meta_rm("f", "temp", None).unwrap(), 1);
    assert_eq!(c.meta_ls("f").unwrap(), [avu("project", "mars", "")]);
    assert!(matches!(
        c.meta_set("nope", &avu("a", "b", "")),
        Err(CatalogError::NotFound(_))
    ));
    let long = "x".repeat(MAX_VALUE + 1);
    assert!(matches!(
        c.meta_set("f", &avu("a", &long, "")),
        Err(CatalogError::TooLong { .. })
    ));
    assert!(matches!(
        c.meta_set("f", &avu("", "v", "")),
        Err(CatalogError::Empty(_))
    ));
    // Removing the object removes its metadata.
    assert!(c.remove("f").unwrap());
    let left: i64 = c
        .lock()
        .query_row("SELECT COUNT(*) FROM metadata", [], |r| r.get(0))
        .unwrap();
    assert_eq!(left, 0);
}

#[test]
fn find_combines_metadata_name_age_size_and_prefix() {
    let c = mem();
    for (p, size) in [
        ("p/a.fits", 10),
        ("p/b.fits", 20),
        ("p/c.txt", 30),
        ("q/d.fits", 40),
    ] {
        c.register_commit(&commit(p, size)).unwrap();
    }
    c.meta_set("p/a.fits", &avu("temp", "5", "C")).unwrap();
    c.meta_set("p/b.fits", &avu("temp", "25", "C")).unwrap();
    c.meta_set("q/d.fits", &avu("temp", "30", "C")).unwrap();
    c.meta_set("q/d.fits", &avu("mission", "mars", "")).unwrap();
    let q = |s: &str| Query {
        conditions: vec![Condition::parse(s).unwrap()],
        ..Query::default()
    };
    assert_eq!(
        paths(c.find(&q("temp>10")).unwrap()),
        ["p/b.fits", "q/d.fits"]
    );
    assert_eq!(paths(c.find(&q("temp<10")).unwrap()), ["p/a.fits"]);
    assert_eq!(paths(c.find(&q("mission=mars")).unwrap()), ["q/d.fits"]);
    let both = Query {
        under: Some("p".into()),
        ..q("temp>10")
    };
    assert_eq!(paths(c.find(&both).unwrap()), ["p/b.fits"]);
    let glob = Query {
        name: Some("*.fits".into()),
        larger: Some(15),
        ..Query::default()
    };
    assert_eq!(paths(c.find(&glob).unwrap()), ["p/b.fits", "q/d.fits"]);
    let newer = Query {
        newer_ns: Some(25_000),
        limit: 1,
        ..Query::default()
    };
    assert_eq!(paths(c.find(&newer).unwrap()), ["p/c.txt"]);
    assert!(Condition::parse("temp>warm").is_err());
    assert!(Condition::parse("=x").is_err());
    assert!(Condition::parse("plain").is_err());
}

#[test]
fn stat_and_indexed_finds_never_scan_the_table() {
    let c = mem();
    let queries = [
        Query {
            under: Some("p".into()),
            ..Query::default()
        },
        Query {
            conditions: vec![Condition::parse("a=b").unwrap()],
            ..Query::default()
        },
        Query {
            conditions: vec![Condition::parse("a>3").unwrap()],
            ..Query::default()
        },
        Query {
            newer_ns: Some(5),
            ..Query::default()
        },
        Query {
            larger: Some(5),
            ..Query::default()
        },
    ];
    for q in &queries {
        let plan = plan(&c, q);
        assert!(
            plan.iter().all(|step| !step.starts_with("SCAN")),
            "{q:?}: {plan:?}"
        );
    }
    let stat: Vec<String> = c
        .lock()
        .prepare("EXPLAIN QUERY PLAN SELECT id FROM objects WHERE path = ?1")
        .unwrap()
        .query_map(["x"], |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(stat.iter().all(|s| s.starts_with("SEARCH")), "{stat:?}");
}

#[test]
fn globs() {
    assert!(glob_match("*.fits", "a.fits"));
    assert!(glob_match("a?c", "abc"));
    assert!(glob_match("*", ""));
    assert!(glob_match("a*b*c", "aXbYbZc"));
    assert!(!glob_match("*.fits", "a.fit"));
    assert!(!glob_match("a?c", "ac"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Whatever paths are registered, a prefix find returns exactly those under it, and
    /// remove_prefix removes exactly those (plus the prefix itself).
    #[test]
    fn prefix_range_is_exact(
        names in proptest::collection::btree_set("[a-c]{1,2}(/[a-c0/]{1,3})?", 1..30),
        prefix in "[a-c]{1,2}",
    ) {
        let c = mem();
        let names: Vec<String> = names
            .into_iter()
            .map(|n| n.split('/').filter(|s| !s.is_empty()).collect::<Vec<_>>().join("/"))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for n in &names {
            c.register_commit(&commit(n, 1)).unwrap();
        }
        let want: Vec<String> = names
            .iter()
            .filter(|n| n.starts_with(&format!("{prefix}/")))
            .cloned()
            .collect();
        let q = Query { under: Some(prefix.clone()), ..Query::default() };
        prop_assert_eq!(paths(c.find(&q).unwrap()), want.clone());
        let removed = c.remove_prefix(&prefix).unwrap();
        let itself = u64::from(names.contains(&prefix));
        prop_assert_eq!(removed, want.len() as u64 + itself);
    }

    /// Metadata set then listed comes back as set, whatever the text.
    #[test]
    fn metadata_round_trips(attr in "\\PC{1,20}", value in "\\PC{0,40}", unit in "\\PC{0,8}") {
        let c = mem();
        c.register_commit(&commit("f", 1)).unwrap();
        let a = avu(&attr, &value, &unit);
        c.meta_set("f", &a).unwrap();
        prop_assert_eq!(c.meta_ls("f").unwrap(), vec![a]);
    }
}
