//! The catalog's tests. Most run on both backends: each is a function of a [`Backend`], run
//! once on SQLite (a test each) and once on PostgreSQL (all in [`on_postgresql`], on one
//! cluster for this test binary, each in a database of its own).

use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::db::{args, Conn, Db};
use crate::find::plan;
use crate::*;

/// Where a test's catalogs are.
enum Backend {
    Sqlite(tempfile::TempDir, AtomicU32),
    /// The cluster, and a directory for the servers' local intents (as a server's state
    /// directory holds them).
    Postgres(TestCluster, tempfile::TempDir),
}

impl Backend {
    fn sqlite() -> Self {
        Self::Sqlite(tempfile::tempdir().unwrap(), AtomicU32::new(0))
    }

    /// A new, empty catalog's location.
    fn fresh(&self) -> Location {
        match self {
            Self::Sqlite(dir, n) => Location::Sqlite(
                dir.path()
                    .join(format!("c{}.sqlite", n.fetch_add(1, Ordering::Relaxed))),
            ),
            Self::Postgres(cluster, _) => cluster.database(),
        }
    }

    /// A new, empty catalog of the server `here` (SQLite's in memory; PostgreSQL's keeping its
    /// intents in a local file, as `ferry serve` opens it).
    fn catalog(&self) -> Catalog {
        match self {
            Self::Sqlite(..) => Catalog::open(&Location::Memory, "here").unwrap(),
            Self::Postgres(cluster, _) => self.open(&cluster.database(), "here"),
        }
    }

    /// The catalog at `location` as the server `server` opens it: on PostgreSQL with its
    /// intents in a local file of its own (the same file for the same location and server).
    fn open(&self, location: &Location, server: &str) -> Catalog {
        match self {
            Self::Sqlite(..) => Catalog::open(location, server).unwrap(),
            Self::Postgres(_, dir) => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (location.to_string(), server).hash(&mut h);
                let file = dir.path().join(format!("{:x}.sqlite", h.finish()));
                Catalog::open_with_local_intents(location, server, &file).unwrap()
            }
        }
    }
}

/// Each test of the list as a test on SQLite, and all of them on PostgreSQL in one.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(&super::Backend::sqlite())
            })*
        }

        /// Every shared test on PostgreSQL. One cluster for them all: initdb and a start take
        /// seconds, a database a few milliseconds.
        #[test]
        fn on_postgresql() {
            let Some(cluster) = ferry_netem::needs(
                "ferry_catalog::tests::on_postgresql",
                TestCluster::start(),
            ) else {
                return;
            };
            let b = Backend::Postgres(cluster, tempfile::tempdir().unwrap());
            let mut failed = Vec::new();
            $(if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $name(&b))).is_err() {
                failed.push(stringify!($name));
            })*
            assert!(failed.is_empty(), "failed on PostgreSQL: {failed:?}");
        }
    };
}

on_both!(
    an_audit_pages_this_servers_objects_and_marks_its_replicas,
    register_then_stat_shows_the_object_and_its_replica,
    reopening_keeps_what_was_registered_and_migrates_once,
    a_catalog_is_kept_for_one_root_of_a_server,
    replicas_carry_their_servers_addresses,
    a_newer_schema_is_refused,
    intents_are_reconciled_by_what_is_there,
    queued_registrations_are_seen_by_every_read_after_them,
    a_queued_registration_that_fails_is_reported_and_its_intent_kept,
    registering_older_contents_keeps_a_newer_intent_of_the_same_path,
    remove_and_remove_prefix_touch_only_their_paths,
    rename_moves_a_file_or_a_directory_and_refuses_to_clobber,
    a_move_leaves_other_servers_copies_where_they_are,
    metadata_set_rm_ls_and_bounds,
    find_combines_metadata_name_age_size_and_prefix,
    known_digests_are_this_servers_good_ones,
    servers_sharing_a_catalog_each_name_their_replicas,
    prefix_range_is_exact,
    metadata_round_trips,
    replicas_elsewhere_are_recorded_under_a_path,
    a_policy_path_registered_owes_its_replicas_until_met,
    a_move_carries_what_is_owed_to_the_new_paths_policy,
    newest_stored_is_measured_at_a_path_or_under_it,
    register_new_writes_what_register_writes_many_rows_at_once,
    removing_a_subtree_leaves_no_replica_or_metadata_of_it,
    a_numeric_find_under_a_prefix_answers_the_same_every_time,
    a_batch_registers_what_one_file_at_a_time_would,
    a_catalog_of_schema_6_reads_its_replicas_at_the_objects_path,
);

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

fn an_audit_pages_this_servers_objects_and_marks_its_replicas(b: &Backend) {
    let c = b.catalog();
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

fn register_then_stat_shows_the_object_and_its_replica(b: &Backend) {
    let c = b.catalog();
    assert_eq!(c.schema_version().unwrap(), 7);
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
            state: ReplicaState::Good,
            path: None,
            address: String::new(),
        }]
    );
    assert!(c.stat("a/b").unwrap().is_none());
    // Registering again replaces, it does not add.
    c.register_commit(&commit("a/b.txt", 9)).unwrap();
    assert_eq!(c.count().unwrap(), 1);
    assert_eq!(c.stat("a/b.txt").unwrap().unwrap().object.size, 9);
}

fn reopening_keeps_what_was_registered_and_migrates_once(b: &Backend) {
    let loc = b.fresh();
    Catalog::open(&loc, "here")
        .unwrap()
        .register_commit(&commit("x", 1))
        .unwrap();
    let c = Catalog::open(&loc, "here").unwrap();
    assert_eq!(c.schema_version().unwrap(), 7);
    assert_eq!(c.count().unwrap(), 1);
    let migrations = c
        .lock()
        .one("SELECT COUNT(*) FROM catalog_migrations", &[])
        .unwrap()
        .int(0)
        .unwrap();
    assert_eq!(migrations, 7);
    let conn = c.lock();
    if let Conn::Sqlite(conn) = &*conn {
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
}

fn a_catalog_is_kept_for_one_root_of_a_server(b: &Backend) {
    let c = b.catalog();
    c.claim_root("/srv/a").unwrap();
    c.claim_root("/srv/a").unwrap();
    let e = c.claim_root("/srv/b").unwrap_err();
    assert!(matches!(e, CatalogError::OtherRoot { .. }), "{e}");
    assert!(e.to_string().contains("/srv/a"), "{e}");
    // Another server of a shared catalog has a root of its own.
    let loc = b.fresh();
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

fn replicas_carry_their_servers_addresses(b: &Backend) {
    let loc = b.fresh();
    let one = Catalog::open(&loc, "one").unwrap();
    one.claim_root("/a").unwrap();
    one.advertise("dtn1:7070").unwrap();
    one.register_commit(&commit("f", 3)).unwrap();
    let addresses = |c: &Catalog| -> Vec<(String, String)> {
        c.stat("f")
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .map(|r| (r.server, r.address))
            .collect()
    };
    assert_eq!(addresses(&one), [("one".into(), "dtn1:7070".into())]);
    if one.is_shared() {
        // A second server of the zone registers the same contents: both addresses shown.
        let two = Catalog::open(&loc, "two").unwrap();
        two.claim_root("/b").unwrap();
        two.advertise("dtn2:7070").unwrap();
        two.register_commit(&commit("f", 3)).unwrap();
        let both = vec![
            ("one".to_owned(), "dtn1:7070".to_owned()),
            ("two".to_owned(), "dtn2:7070".to_owned()),
        ];
        assert_eq!(addresses(&one), both);
        // A record's address never replaces the one a server gave itself.
        one.note_address("two", "elsewhere:1").unwrap();
        assert_eq!(addresses(&one), both);
        return;
    }
    // Separate catalogs: the other server is known by a repl's record and its address.
    assert_eq!(
        one.record_replicas("f", false, "two", "/b/f", None)
            .unwrap(),
        1
    );
    assert_eq!(
        addresses(&one),
        [
            ("one".to_owned(), "dtn1:7070".to_owned()),
            ("two".to_owned(), String::new())
        ]
    );
    one.note_address("two", "dtn2:7070").unwrap();
    one.note_address("two", "dtn2:7071").unwrap();
    // Its own name in a record changes nothing.
    one.note_address("one", "elsewhere:1").unwrap();
    assert_eq!(
        addresses(&one),
        [
            ("one".to_owned(), "dtn1:7070".to_owned()),
            ("two".to_owned(), "dtn2:7071".to_owned())
        ]
    );
    // A server later started on this catalog under the recorded name claims the row.
    let two = Catalog::open(&loc, "two").unwrap();
    two.claim_root("/b").unwrap();
    two.advertise("").unwrap();
    assert_eq!(addresses(&one)[1], ("two".to_owned(), String::new()));
    let long = "h".repeat(MAX_ADDRESS + 1);
    assert!(one.advertise(&long).is_err());
}

fn a_newer_schema_is_refused(b: &Backend) {
    let loc = b.fresh();
    let c = Catalog::open(&loc, "here").unwrap();
    c.lock()
        .run(
            "INSERT INTO catalog_migrations (version, applied_at) VALUES (99, 0)",
            &[],
        )
        .unwrap();
    drop(c);
    let e = Catalog::open(&loc, "here").unwrap_err();
    assert!(
        matches!(
            e,
            CatalogError::TooNew {
                found: 99,
                known: 7
            }
        ),
        "{e}"
    );
}

#[test]
fn locations_are_a_postgresql_url_or_words_or_a_sqlite_path() {
    for pg in [
        "postgres://ferry@localhost/ferry",
        "postgresql://ferry:pw@db:5433/ferry?sslmode=disable",
        "host=/run/postgresql dbname=ferry",
    ] {
        let loc = Location::parse(pg).unwrap();
        assert!(loc.is_shared(), "{pg}");
        assert!(!loc.to_string().contains("pw"), "{loc}");
    }
    assert!(matches!(
        Location::parse("mysql://db/ferry"),
        Err(CatalogError::Unsupported(_))
    ));
    let e = Location::parse("postgres://u:secret@db:notaport/x").unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
    // Across a network: TLS to a trusted CA, or clear text said out loud.
    let e = Location::parse("postgres://u:secret@db.example/x").unwrap_err();
    assert!(e.to_string().contains("sslmode=verify-full"), "{e}");
    assert!(!e.to_string().contains("secret"), "{e}");
    assert_eq!(
        Location::parse("/var/lib/ferry/catalog.sqlite").unwrap(),
        Location::Sqlite("/var/lib/ferry/catalog.sqlite".into())
    );
    assert!(Location::parse("").is_err());
}

fn intents_are_reconciled_by_what_is_there(b: &Backend) {
    let c = b.catalog();
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

fn queued_registrations_are_seen_by_every_read_after_them(b: &Backend) {
    let loc = b.fresh();
    let c = b.open(&loc, "here");
    // The intents' file system: the SQLite catalog's own, or PostgreSQL's local intents'.
    let (Backend::Sqlite(dir, _) | Backend::Postgres(_, dir)) = b;
    assert_eq!(
        c.device(),
        Some(std::os::unix::fs::MetadataExt::dev(
            &std::fs::metadata(dir.path()).unwrap()
        ))
    );
    if let Backend::Postgres(..) = b {
        // Not a file of this machine: no sync of a local file system makes it durable.
        assert_eq!(Catalog::open(&loc, "here").unwrap().device(), None);
    }
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
    let c = b.open(&loc, "here");
    assert!(c.stat("last").unwrap().is_some());
    assert!(c.pending().unwrap().is_empty());
}

fn a_queued_registration_that_fails_is_reported_and_its_intent_kept(b: &Backend) {
    let c = b.catalog();
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

fn registering_older_contents_keeps_a_newer_intent_of_the_same_path(b: &Backend) {
    let c = b.catalog();
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

fn remove_and_remove_prefix_touch_only_their_paths(b: &Backend) {
    let c = b.catalog();
    for p in ["d/a", "d/b/c", "d0", "dd/x", "d"] {
        c.register_commit(&commit(p, 1)).unwrap();
    }
    assert!(c.remove("d0").unwrap());
    assert!(!c.remove("d0").unwrap());
    // `d` itself (a file of that name) and everything under `d/`, not `dd/`.
    assert_eq!(c.remove_prefix("d/").unwrap(), 3);
    assert_eq!(paths(c.find(&Query::default()).unwrap()), ["dd/x"]);
}

fn rename_moves_a_file_or_a_directory_and_refuses_to_clobber(b: &Backend) {
    let c = b.catalog();
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

/// A `mv` moves this server's files only: this server's replica gets its physical path under
/// the new name; another catalog's server's copy (a record) keeps the path it is at (its
/// replica's own path) and a move back to where it is drops that path again; a copy of a
/// server sharing the catalog, which knows its replicas at the objects' paths, is stale.
fn a_move_leaves_other_servers_copies_where_they_are(b: &Backend) {
    let loc = b.fresh();
    let here = b.open(&loc, "here");
    let paths = ["d/x", "d/s/y", "f"];
    for p in paths {
        here.register_commit(&commit(p, 1)).unwrap();
    }
    if here.is_shared() {
        // A server of the same zone registers its own copies.
        let far = b.open(&loc, "far");
        for p in paths {
            let c = Commit {
                physical: format!("/far/{p}"),
                ..commit(p, 1)
            };
            far.register_commit(&c).unwrap();
        }
    } else {
        // A server of another catalog, as a `repl` records it.
        here.record_replicas("d", true, "far", "/far/d", None)
            .unwrap();
        here.record_replicas("f", false, "far", "/far/f", None)
            .unwrap();
    }
    assert_eq!(here.rename("d", "e/d2").unwrap(), 2);
    assert_eq!(here.rename("f", "g").unwrap(), 1);
    let at = |path: &str| -> Vec<(String, String, Option<String>)> {
        let mut r: Vec<_> = here
            .stat(path)
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .map(|r| (r.server, r.physical, r.path))
            .collect();
        r.sort();
        r
    };
    let row = |s: &str, physical: &str, path: Option<&str>| {
        (s.to_owned(), physical.to_owned(), path.map(str::to_owned))
    };
    let shared = here.is_shared();
    // A record keeps its copy's old path; a zone server's copy is not pinned.
    let pinned = |p: &'static str| (!shared).then_some(p);
    assert_eq!(
        at("e/d2/s/y"),
        [
            row("far", "/far/d/s/y", pinned("d/s/y")),
            row("here", "/srv/e/d2/s/y", None)
        ]
    );
    assert_eq!(
        at("e/d2/x"),
        [
            row("far", "/far/d/x", pinned("d/x")),
            row("here", "/srv/e/d2/x", None)
        ]
    );
    assert_eq!(
        at("g"),
        [
            row("far", "/far/f", pinned("f")),
            row("here", "/srv/g", None)
        ]
    );
    let far_state = |path: &str| {
        here.stat(path)
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .find(|r| r.server == "far")
            .map(|r| r.state)
    };
    let moved_far = match shared {
        true => ReplicaState::Stale,
        false => ReplicaState::Good,
    };
    assert_eq!(far_state("g"), Some(moved_far));
    // Moved back where the far copy is: at the object's path again.
    assert_eq!(here.rename("g", "f").unwrap(), 1);
    assert_eq!(
        at("f"),
        [row("far", "/far/f", None), row("here", "/srv/f", None)]
    );
    assert_eq!(far_state("f"), Some(moved_far));
}

fn metadata_set_rm_ls_and_bounds(b: &Backend) {
    let c = b.catalog();
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
    let left = c
        .lock()
        .one("SELECT COUNT(*) FROM metadata", &[])
        .unwrap()
        .int(0)
        .unwrap();
    assert_eq!(left, 0);
}

fn find_combines_metadata_name_age_size_and_prefix(b: &Backend) {
    let c = b.catalog();
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

/// SQLite's plans; PostgreSQL's planner chooses by the table's statistics, so a plan of a
/// test's few rows says nothing of a large catalog's.
#[test]
fn stat_and_indexed_finds_never_scan_the_table() {
    let c = Catalog::open(&Location::Memory, "here").unwrap();
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
        .rows(
            "EXPLAIN QUERY PLAN SELECT id FROM objects WHERE path = ?1",
            args!["x"],
        )
        .unwrap()
        .into_iter()
        .map(|mut r| r.text(3).unwrap())
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

fn known_digests_are_this_servers_good_ones(b: &Backend) {
    let c = b.catalog();
    let f = commit("k", 5);
    c.register_commit(&f).unwrap();
    let known = |size, algo| c.known_digest("k", size, f.mtime_ns, algo).unwrap();
    assert_eq!(known(5, "blake3"), Some(f.digest.clone()));
    assert_eq!(known(6, "blake3"), None);
    assert_eq!(known(5, "md5"), None);
    c.set_replica_state("k", ReplicaState::Bad).unwrap();
    assert_eq!(known(5, "blake3"), None);
}

/// Two servers on one catalog: each registers its own replica, a new copy on one makes the
/// other's stale, and each knows every replica.
/// A registration of many files at once (a few statements per 256) keeps every rule of one
/// file's: the same contents add a replica and keep the object, other contents replace it and
/// make the other servers' copies stale, a path twice takes its later contents, and each
/// intent of exactly the registered contents is cleared.
fn a_batch_registers_what_one_file_at_a_time_would(b: &Backend) {
    let loc = b.fresh();
    let one = Catalog::open(&loc, "one").unwrap();
    let two = Catalog::open(&loc, "two").unwrap();
    one.register(&[commit("same", 3), commit("changed", 3)])
        .unwrap();
    let before = one.stat("same").unwrap().unwrap().object;
    let mut batch = vec![commit("same", 3), commit("changed", 4)];
    // A path twice, next to each other and across the 256-row statements.
    batch.extend([commit("dup", 1), commit("dup", 2)]);
    batch.extend((0..1200).map(|i| commit(&format!("n/{i:04}"), 5)));
    batch.push(commit("dup", 6));
    // A later put's intent of other contents for a path of the batch stays.
    let later = commit("n/0007", 9);
    two.intend(&batch).unwrap();
    two.intend(std::slice::from_ref(&later)).unwrap();
    two.register(&batch).unwrap();
    assert_eq!(two.pending().unwrap(), [later]);
    let states = |path: &str| -> Vec<(String, ReplicaState)> {
        let mut r: Vec<_> = two
            .stat(path)
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .map(|r| (r.server, r.state))
            .collect();
        r.sort_by(|a, b| a.0.cmp(&b.0));
        r
    };
    let good = ReplicaState::Good;
    assert_eq!(two.stat("same").unwrap().unwrap().object, before);
    assert_eq!(states("same"), [("one".into(), good), ("two".into(), good)]);
    assert_eq!(two.stat("changed").unwrap().unwrap().object.size, 4);
    assert_eq!(
        states("changed"),
        [("one".into(), ReplicaState::Stale), ("two".into(), good)]
    );
    assert_eq!(two.stat("dup").unwrap().unwrap().object.size, 6);
    assert_eq!(states("dup"), [("two".into(), good)]);
    let n = two.stat("n/1199").unwrap().unwrap();
    assert_eq!((n.object.size, n.replicas.len()), (5, 1));
    assert_eq!(n.replicas[0].physical, "/srv/n/1199");
    let all = two.find(&Query::default()).unwrap();
    assert_eq!(all.len(), 1203);
}

fn servers_sharing_a_catalog_each_name_their_replicas(b: &Backend) {
    let loc = b.fresh();
    let one = Catalog::open(&loc, "one").unwrap();
    let two = Catalog::open(&loc, "two").unwrap();
    one.claim_root("/srv/one").unwrap();
    two.claim_root("/srv/two").unwrap();
    one.register_commit(&commit("f", 1)).unwrap();
    // Other contents under the same path: the object is replaced, the other copy is stale.
    two.register_commit(&Commit {
        digest: vec![7; 32],
        ..commit("f", 1)
    })
    .unwrap();
    let states_of = |c: &Catalog, path: &str| -> Vec<(String, ReplicaState)> {
        c.stat(path)
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .map(|r| (r.server, r.state))
            .collect()
    };
    let both = vec![
        ("one".to_owned(), ReplicaState::Stale),
        ("two".to_owned(), ReplicaState::Good),
    ];
    let states = |c: &Catalog| states_of(c, "f");
    assert_eq!(states(&one), both);
    assert_eq!(states(&two), both);
    assert_eq!(one.stat("f").unwrap().unwrap().object.digest, [7; 32]);
    // The same contents (a `repl`): a second good replica, the object as it was.
    one.register_commit(&commit("s", 4)).unwrap();
    let first = one.stat("s").unwrap().unwrap().object;
    two.register_commit(&Commit {
        stored_by: "bob".into(),
        physical: "/srv/two/s".into(),
        ..commit("s", 4)
    })
    .unwrap();
    let s = two.stat("s").unwrap().unwrap();
    assert_eq!(s.object, first);
    assert_eq!(
        states_of(&one, "s"),
        [
            ("one".to_owned(), ReplicaState::Good),
            ("two".to_owned(), ReplicaState::Good)
        ]
    );
    assert_eq!(paths(one.held_page("", "", 10).unwrap()), ["f", "s"]);
    // Each server's start settles its own intents only, even of the same path.
    one.intend(&[commit("g", 1), commit("h", 1)]).unwrap();
    two.intend(&[commit("g", 2)]).unwrap();
    let r = two.reconcile(|_| false).unwrap();
    assert_eq!(r.dropped, 1);
    assert_eq!(one.pending().unwrap().len(), 2);
    one.register(&[commit("g", 1)]).unwrap();
    assert_eq!(paths_of(one.pending().unwrap()), ["h"]);
}

fn paths_of(commits: Vec<Commit>) -> Vec<String> {
    commits.into_iter().map(|c| c.path).collect()
}

/// A catalog of schema 2 (one server's intents, keyed by path alone) keeps its intents,
/// as this server's, through the migration that keys them by server.
#[test]
fn intents_from_before_the_server_column_stay_this_servers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sqlite");
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    run_migrations(&mut conn, "catalog_migrations", &schema::MIGRATIONS[..2], 0).unwrap();
    conn.execute(
        "INSERT INTO pending VALUES ('old', 1, 1000, x'01', 'blake3', 'alice', '/srv/old', 0)",
        [],
    )
    .unwrap();
    drop(conn);
    let c = Catalog::open(&Location::Sqlite(path), "here").unwrap();
    assert_eq!(paths_of(c.pending().unwrap()), ["old"]);
    assert_eq!(c.reconcile(|_| true).unwrap().registered, 1);
    assert!(c.pending().unwrap().is_empty());
}

/// Whatever paths are registered, a prefix find returns exactly those under it, and
/// remove_prefix removes exactly those (plus the prefix itself). One catalog for every case,
/// emptied first.
fn prefix_range_is_exact(b: &Backend) {
    let c = b.catalog();
    let cases = (
        proptest::collection::btree_set("[a-c]{1,2}(/[a-c0/]{1,3})?", 1..30),
        "[a-c]{1,2}",
    );
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(32)
    });
    runner
        .run(&cases, |(names, prefix)| {
            c.remove_prefix("").unwrap();
            let names: Vec<String> = names
                .into_iter()
                .map(|n| {
                    n.split('/')
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                        .join("/")
                })
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
            let q = Query {
                under: Some(prefix.clone()),
                ..Query::default()
            };
            prop_assert_eq!(paths(c.find(&q).unwrap()), want.clone());
            let removed = c.remove_prefix(&prefix).unwrap();
            let itself = u64::from(names.contains(&prefix));
            prop_assert_eq!(removed, want.len() as u64 + itself);
            Ok(())
        })
        .unwrap();
}

/// Metadata set then listed comes back as set, whatever the text.
fn metadata_round_trips(b: &Backend) {
    let c = b.catalog();
    let cases = ("\\PC{1,20}", "\\PC{0,40}", "\\PC{0,8}");
    let mut runner = TestRunner::new(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(32)
    });
    runner
        .run(&cases, |(attr, value, unit)| {
            c.remove("f").unwrap();
            c.register_commit(&commit("f", 1)).unwrap();
            let a = avu(&attr, &value, &unit);
            c.meta_set("f", &a).unwrap();
            prop_assert_eq!(c.meta_ls("f").unwrap(), vec![a]);
            Ok(())
        })
        .unwrap();
}

/// A registration that fails (the database gone for a while) is tried again on its own: the
/// stored files wait for it, no new intents are taken meanwhile (so files and catalog cannot
/// drift apart for as long as the database is away), and once it is back they are registered
/// without a restart.
#[test]
fn a_failed_registration_is_tried_again_and_holds_new_intents_back_meanwhile() {
    let Some(mut cluster) = ferry_netem::needs(
        "ferry_catalog::tests::a_failed_registration_is_tried_again_and_holds_new_intents_back_meanwhile",
        TestCluster::start(),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (loc, file) = (cluster.database(), dir.path().join("intents.sqlite"));
    let c = Catalog::open_with_local_intents(&loc, "here", &file).unwrap();
    c.claim_root("/srv").unwrap();
    let files: Vec<Commit> = (0..10).map(|i| commit(&format!("a/f{i}"), 3)).collect();
    c.intend_unsynced(&files).unwrap();
    cluster.pause();
    c.register_later(files);
    assert!(c.settle().is_err(), "registered with the database down");
    match c.intend_unsynced(&[commit("b", 1)]) {
        Err(CatalogError::Unregistered { files: 10, .. }) => {}
        other => panic!("a new intent with 10 files unregistered: {other:?}"),
    }
    cluster.resume().unwrap();
    // Tried again after 1, 2, 4… s (the first try after the restart may meet the old
    // connection cut): within a minute, or the test fails.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match c.intend_unsynced(&[commit("b", 1)]) {
            Ok(()) => break,
            Err(CatalogError::Unregistered { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Err(e) => panic!("not registered again within a minute: {e}"),
        }
    }
    assert_eq!(c.count().unwrap(), 10);
    assert_eq!(c.stat("a/f7").unwrap().unwrap().object.size, 3);
    // Their intents are cleared; "b"'s, just written, is the only one left.
    let left: Vec<String> = c.pending().unwrap().into_iter().map(|p| p.path).collect();
    assert_eq!(left, ["b"]);
}

/// A server on PostgreSQL killed between a batch's intents and their registration (the
/// catalog dropped with nothing queued, as `kill -9` leaves it): the intents are in its local
/// file, none in the database, and its next start registers those whose files are there.
#[test]
fn a_postgresql_catalogs_intents_are_local_and_registered_at_the_next_start() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_catalog::tests::a_postgresql_catalogs_intents_are_local_and_registered_at_the_next_start",
        TestCluster::start(),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (loc, file) = (cluster.database(), dir.path().join("intents.sqlite"));
    let c = Catalog::open_with_local_intents(&loc, "here", &file).unwrap();
    c.claim_root("/srv").unwrap();
    let files: Vec<Commit> = (0..700).map(|i| commit(&format!("d/{i:03}"), 5)).collect();
    c.intend_unsynced(&files).unwrap();
    c.intend(&[commit("gone", 1)]).unwrap();
    drop(c);
    // The database has none of them; the file all.
    let in_db = Catalog::open(&loc, "here").unwrap();
    assert!(in_db.pending().unwrap().is_empty());
    let in_file = Catalog::open(&Location::Sqlite(file.clone()), "here").unwrap();
    assert_eq!(in_file.pending().unwrap().len(), 701);
    drop(in_file);

    let c = Catalog::open_with_local_intents(&loc, "here", &file).unwrap();
    c.claim_root("/srv").unwrap();
    assert_eq!(c.pending().unwrap().len(), 701);
    let r = c.reconcile(|f| f.path != "gone").unwrap();
    assert_eq!(
        r,
        Reconciled {
            registered: 700,
            dropped: 1
        }
    );
    assert!(c.pending().unwrap().is_empty());
    assert_eq!(in_db.count().unwrap(), 700);
    assert!(in_db.stat("gone").unwrap().is_none());
    // A registration queued as a put queues it clears its local intents once it committed.
    c.intend_unsynced(&[commit("later", 2)]).unwrap();
    c.register_later(vec![commit("later", 2)]);
    c.settle().unwrap();
    assert!(c.pending().unwrap().is_empty());
    assert!(in_db.stat("later").unwrap().is_some());
    // The file is this root's: a server of the same name on the same state directory, with
    // another catalog for another root, is refused it.
    drop(c);
    let other = Catalog::open_with_local_intents(&cluster.database(), "here", &file).unwrap();
    let e = other.claim_root("/elsewhere").unwrap_err();
    assert!(matches!(e, CatalogError::IntentsElsewhere { .. }), "{e}");
}

/// Intents an older build left in a PostgreSQL catalog (written there, before intents were
/// kept locally) are reconciled at the first start of this one, beside the local ones, and a
/// path in both registers the local (newer) contents.
#[test]
fn intents_an_older_build_left_in_postgresql_are_reconciled_too() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_catalog::tests::intents_an_older_build_left_in_postgresql_are_reconciled_too",
        TestCluster::start(),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (loc, file) = (cluster.database(), dir.path().join("intents.sqlite"));
    // The older build: its intents in the database itself, as its statement wrote them.
    let old = Catalog::open(&loc, "here").unwrap();
    let mut conn = old.lock();
    for (path, size) in [("old", 1_i64), ("both", 2), ("old-gone", 3)] {
        conn.run(
            "INSERT INTO pending
                 (server, path, size, mtime_ns, digest, algo, stored_by, physical, since)
             VALUES ('here', ?1, ?2, 1000, ?3, 'blake3', 'alice', ?4, 0)",
            args![path, size, &vec![7_u8; 32], &format!("/srv/{path}")],
        )
        .unwrap();
    }
    drop(conn);
    assert_eq!(old.pending().unwrap().len(), 3);

    let c = Catalog::open_with_local_intents(&loc, "here", &file).unwrap();
    c.intend_unsynced(&[commit("new", 4), commit("both", 5)])
        .unwrap();
    assert_eq!(
        paths_of(c.pending().unwrap()),
        ["both", "old", "old-gone", "both", "new"]
    );
    let r = c.reconcile(|f| f.path != "old-gone").unwrap();
    assert_eq!(
        r,
        Reconciled {
            registered: 4,
            dropped: 1
        }
    );
    assert!(c.pending().unwrap().is_empty());
    assert!(
        old.pending().unwrap().is_empty(),
        "none left in the database"
    );
    assert_eq!(
        paths(c.find(&Query::default()).unwrap()),
        ["both", "new", "old"]
    );
    assert_eq!(c.stat("both").unwrap().unwrap().object.size, 5);
    assert_eq!(
        c.stat("old").unwrap().unwrap().object.digest,
        vec![7_u8; 32]
    );
}

/// A server's PostgreSQL catalog works again after the database restarts, without a restart
/// of its own: the call that finds the old connection cut fails (it cannot know whether its
/// statement ran), the next connects again.
#[test]
fn a_postgresql_catalog_connects_again_after_the_database_restarts() {
    let Some(mut cluster) = ferry_netem::needs(
        "ferry_catalog::tests::a_postgresql_catalog_connects_again_after_the_database_restarts",
        TestCluster::start(),
    ) else {
        return;
    };
    let c = Catalog::open(&cluster.database(), "here").unwrap();
    c.register_commit(&commit("a", 1)).unwrap();
    for round in 0..2 {
        cluster.restart().unwrap();
        let mut failures = 0;
        let seen = loop {
            match c.stat("a") {
                Ok(s) => break s,
                Err(e) => {
                    failures += 1;
                    assert!(failures < 2, "round {round}: still failing: {e}");
                }
            }
        };
        assert_eq!(seen.unwrap().object.size, 1, "round {round}");
        c.register_commit(&commit(&format!("b{round}"), 2)).unwrap();
        assert_eq!(c.count().unwrap(), round + 2);
    }
}

/// Two servers of one PostgreSQL catalog at once: one removes a subtree while the other adds
/// its replica of each object and a metadata entry to it. Whichever wins each object, no
/// replica or metadata row outlives its object (the schema has no foreign key to keep them
/// apart; `forget`'s lock order does).
#[test]
fn a_shared_catalog_keeps_no_row_of_an_object_removed_while_another_server_writes_to_it() {
    let Some(cluster) = ferry_netem::needs(
        "ferry_catalog::tests::a_shared_catalog_keeps_no_row_of_an_object_removed_while_another_server_writes_to_it",
        TestCluster::start(),
    ) else {
        return;
    };
    let loc = cluster.database();
    let one = Catalog::open(&loc, "one").unwrap();
    let two = Catalog::open(&loc, "two").unwrap();
    for round in 0..12 {
        let tree: Vec<Commit> = (0..150)
            .map(|i| commit(&format!("r{round}/d{}/f{i}", i % 3), 7))
            .collect();
        one.register_new(&tree).unwrap();
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let writer = s.spawn(|| {
                start.wait();
                // From the end, so that the two meet inside the tree.
                for f in tree.iter().rev() {
                    // The same contents: `register` adds this server's replica beside one's
                    // (or, the object gone, registers it anew).
                    two.register_commit(f).unwrap();
                    match two.meta_set(&f.path, &avu("seen", "1", "")) {
                        Ok(()) | Err(CatalogError::NotFound(_)) => {}
                        Err(e) => panic!("meta_set {}: {e}", f.path),
                    }
                }
            });
            start.wait();
            one.remove_prefix(&format!("r{round}")).unwrap();
            writer.join().unwrap();
        });
        assert_eq!(orphans(&one, "replicas"), 0, "round {round}");
        assert_eq!(orphans(&one, "metadata"), 0, "round {round}");
        // What is left of the tree is what `two` registered anew after the removal: its
        // replica alone.
        for o in one
            .find(&Query {
                under: Some(format!("r{round}")),
                limit: 1_000,
                ..Query::default()
            })
            .unwrap()
        {
            let s = one.stat(&o.path).unwrap().unwrap();
            let servers: Vec<_> = s.replicas.iter().map(|r| r.server.as_str()).collect();
            assert_eq!(servers, ["two"], "{}", o.path);
        }
    }
}

fn replicas_elsewhere_are_recorded_under_a_path(b: &Backend) {
    let c = b.catalog();
    if c.is_shared() {
        // Each server of a shared catalog registers its own replicas; none is recorded.
        c.register_commit(&commit("v", 2)).unwrap();
        assert!(matches!(
            c.record_replicas("v", false, "far", "/v", None),
            Err(CatalogError::Shared)
        ));
        return;
    }
    for p in ["t/a", "t/sub/b", "t0", "u"] {
        c.register_commit(&commit(p, 2)).unwrap();
    }
    c.set_replica_state("t/sub/b", ReplicaState::Bad).unwrap();
    // A tree: each object this server holds good, at the remote top plus its rest.
    assert_eq!(
        c.record_replicas("t", true, "far", "/x/t/", None).unwrap(),
        1
    );
    let far = |path: &str| {
        c.stat(path)
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .find(|r| r.server == "far")
            .map(|r| (r.physical, r.state))
    };
    assert_eq!(far("t/a"), Some(("/x/t/a".to_owned(), ReplicaState::Good)));
    assert_eq!(
        far("t/sub/b"),
        None,
        "a bad replica here vouches for nothing"
    );
    assert_eq!(far("t0"), None);
    // A file alone, and the whole tree from the root.
    assert_eq!(
        c.record_replicas("u", false, "far", "/y/u", None).unwrap(),
        1
    );
    assert_eq!(far("u"), Some(("/y/u".to_owned(), ReplicaState::Good)));
    assert_eq!(c.record_replicas("t", false, "far", "/z", None).unwrap(), 0);
    assert_eq!(c.record_replicas("", true, "other", "/r", None).unwrap(), 3);
    assert_eq!(c.stat("t0").unwrap().unwrap().replicas[1].physical, "/r/t0");
    // Never this server's own replicas, by a client's word.
    assert_eq!(
        c.record_replicas("u", false, "here", "/elsewhere", None)
            .unwrap(),
        0
    );
    let replicas = c.stat("u").unwrap().unwrap().replicas;
    let own = replicas.iter().find(|r| r.server == "here").unwrap();
    assert_eq!(
        (own.physical.as_str(), own.state),
        ("/srv/u", ReplicaState::Good)
    );
    // A copy at another path keeps its own there, each object's below the copy's top; at
    // the object's own path it keeps none (the object's path is its path).
    let own = |path: &str, server: &str| {
        c.stat(path)
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .find(|r| r.server == server)
            .map(|r| (r.physical, r.path))
    };
    assert_eq!(
        c.record_replicas("t", true, "moved", "/m/x/t2", Some("/x/t2/"))
            .unwrap(),
        1
    );
    assert_eq!(
        own("t/a", "moved"),
        Some(("/m/x/t2/a".to_owned(), Some("x/t2/a".to_owned())))
    );
    assert_eq!(
        c.record_replicas("u", false, "moved", "/m/u", Some("u"))
            .unwrap(),
        1
    );
    assert_eq!(own("u", "moved"), Some(("/m/u".to_owned(), None)));
    // Recorded again at the object's path, the copy's own path goes.
    c.record_replicas("t", true, "moved", "/m/t", None).unwrap();
    assert_eq!(own("t/a", "moved"), Some(("/m/t/a".to_owned(), None)));
    for bad in ["x/../y", "x//y", "./x"] {
        assert!(
            matches!(
                c.record_replicas("u", false, "moved", "/m/u", Some(bad)),
                Err(CatalogError::BadPath(..))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        c.record_replicas("u", false, "moved", "/m/u", Some("/")),
        Err(CatalogError::Empty(_))
    ));
    // A later put of other contents makes the recorded copy stale.
    c.register_commit(&Commit {
        digest: vec![9; 32],
        ..commit("u", 2)
    })
    .unwrap();
    assert_eq!(far("u"), Some(("/y/u".to_owned(), ReplicaState::Stale)));
}

/// A `mv` settles what is owed by where the objects are now: out of a replicated prefix
/// nothing is owed any more, into one the moved objects owe its copies, within one the debt
/// follows the new paths.
fn a_move_carries_what_is_owed_to_the_new_paths_policy(b: &Backend) {
    let loc = b.fresh();
    let c = b.open(&loc, "here");
    c.set_wanted(std::sync::Arc::new(|p: &str| match p.starts_with("raw/") {
        true => 2,
        false => 1,
    }));
    for p in ["raw/a", "raw/d/b", "cooked/c"] {
        c.register_commit(&commit(p, 1)).unwrap();
    }
    if c.is_shared() {
        // An object only another server of the zone holds is that server's to copy: moved
        // into the prefix by this one, it owes nothing here.
        let far = b.open(&loc, "far");
        far.register_commit(&commit("cooked/z", 1)).unwrap();
        c.rename("cooked/z", "raw/z").unwrap();
        assert_eq!(c.owed("raw/z").unwrap(), None);
    }
    let owed = || {
        let mut o = owed_paths(c.owed_due(i64::MAX, 10).unwrap());
        o.sort();
        o
    };
    assert_eq!(owed(), ["raw/a", "raw/d/b"]);
    c.rename("raw/a", "cooked/a").unwrap();
    c.rename("cooked/c", "raw/c").unwrap();
    c.rename("raw/d", "raw/e").unwrap();
    assert_eq!(owed(), ["raw/c", "raw/e/b"]);
    let moved = c.owed("raw/c").unwrap().unwrap();
    assert_eq!((moved.wanted, moved.tries), (2, 0));
}

fn a_policy_path_registered_owes_its_replicas_until_met(b: &Backend) {
    let c = b.catalog();
    c.register_commit(&commit("before/x", 1)).unwrap();
    c.set_wanted(std::sync::Arc::new(|p: &str| match p.starts_with("raw/") {
        true => 2,
        false => 1,
    }));
    c.register_commit(&commit("raw/a", 1)).unwrap();
    c.register_later(vec![commit("raw/b", 2), commit("cooked/c", 3)]);
    assert_eq!(c.owed_count().unwrap(), 2, "raw/a and raw/b, not cooked/c");
    let due = c.owed_due(i64::MAX, 10).unwrap();
    let mut due_paths: Vec<&str> = due.iter().map(|o| o.path.as_str()).collect();
    due_paths.sort_unstable();
    assert_eq!(due_paths, ["raw/a", "raw/b"]);
    assert!(due
        .iter()
        .all(|o| o.wanted == 2 && o.tries == 0 && o.note.is_empty()));
    // A failed try is due later, with its reason; not due before then.
    let later = crate::now_ns() + 60_000_000_000;
    c.owed_later("raw/a", 1, later, "peer b unreachable")
        .unwrap();
    let a = c.owed("raw/a").unwrap().unwrap();
    assert_eq!(
        (a.tries, a.next_at, a.note.as_str()),
        (1, later, "peer b unreachable")
    );
    assert_eq!(owed_paths(c.owed_due(later - 1, 10).unwrap()), ["raw/b"]);
    c.owed_met("raw/b").unwrap();
    assert_eq!(c.owed("raw/b").unwrap(), None);
    // A second good replica known (separate catalogs: a record) meets the policy: the same
    // contents registered again owe nothing.
    if !c.is_shared() {
        c.record_replicas("raw/a", false, "far", "/far/raw/a", None)
            .unwrap();
        c.owed_met("raw/a").unwrap();
        c.register_commit(&commit("raw/a", 1)).unwrap();
        assert_eq!(c.owed("raw/a").unwrap(), None);
        // Other contents make the far copy stale: owed again, from the start.
        c.register_commit(&commit("raw/a", 5)).unwrap();
        assert_eq!(c.owed("raw/a").unwrap().unwrap().tries, 0);
    }
    // Intents a crash left are owed when reconciled, as a registration is.
    c.intend(&[commit("raw/crashed", 4)]).unwrap();
    c.reconcile(|_| true).unwrap();
    assert!(c.owed("raw/crashed").unwrap().is_some());
}

fn owed_paths(owed: Vec<Owed>) -> Vec<String> {
    owed.into_iter().map(|o| o.path).collect()
}

fn newest_stored_is_measured_at_a_path_or_under_it(b: &Backend) {
    let c = b.catalog();
    assert_eq!(c.newest_stored("d", true).unwrap(), None);
    c.register_commit(&commit("d/a", 1)).unwrap();
    let first = c.stat("d/a").unwrap().unwrap().object.stored_at;
    c.register_commit(&commit("d/sub/b", 2)).unwrap();
    let second = c.stat("d/sub/b").unwrap().unwrap().object.stored_at;
    c.register_commit(&commit("d0", 3)).unwrap();
    assert_eq!(c.newest_stored("d/a", false).unwrap(), Some(first));
    assert_eq!(c.newest_stored("d", true).unwrap(), Some(second.max(first)));
    assert_eq!(
        c.newest_stored("d/", true).unwrap(),
        Some(second.max(first))
    );
    assert_eq!(c.newest_stored("d", false).unwrap(), None, "d is no object");
}

/// The bulk path writes the rows `register` writes (across several statements of
/// `BULK_ROWS`), and refuses a path registered already without writing any of its batch.
fn register_new_writes_what_register_writes_many_rows_at_once(b: &Backend) {
    let one = b.catalog();
    let bulk = b.catalog();
    let files: Vec<Commit> = (0..1203)
        .map(|i| commit(&format!("d{}/f{i}", i % 7), i))
        .collect();
    one.register(&files).unwrap();
    bulk.register_new(&files).unwrap();
    assert_eq!(bulk.count().unwrap(), 1203);
    for f in [&files[0], &files[499], &files[500], &files[1202]] {
        let (mut a, mut b) = (
            one.stat(&f.path).unwrap().unwrap(),
            bulk.stat(&f.path).unwrap().unwrap(),
        );
        a.object.stored_at = 0;
        b.object.stored_at = 0;
        assert_eq!(a, b, "{}", f.path);
    }
    let again = [commit("new", 1), files[3].clone()];
    assert!(bulk.register_new(&again).is_err());
    assert!(
        bulk.stat("new").unwrap().is_none(),
        "the batch is rolled back"
    );
    assert_eq!(
        bulk.remove_prefix("d3").unwrap(),
        one.remove_prefix("d3").unwrap()
    );
    assert_eq!(bulk.count().unwrap(), one.count().unwrap());
}

/// How many rows of `table` belong to no object (the schema has no foreign keys since
/// version 6: the catalog deletes them itself).
fn orphans(c: &Catalog, table: &str) -> i64 {
    c.lock()
        .one(
            &format!("SELECT COUNT(*) FROM {table} WHERE object NOT IN (SELECT id FROM objects)"),
            &[],
        )
        .unwrap()
        .int(0)
        .unwrap()
}

fn rows_of(c: &Catalog, table: &str) -> i64 {
    c.lock()
        .one(&format!("SELECT COUNT(*) FROM {table}"), &[])
        .unwrap()
        .int(0)
        .unwrap()
}

/// `rm -r`'s catalog half: a subtree's objects go with their replicas (this server's and
/// another's) and their metadata, in one transaction; what is beside it keeps all of its.
fn removing_a_subtree_leaves_no_replica_or_metadata_of_it(b: &Backend) {
    let loc = b.fresh();
    let c = Catalog::open(&loc, "here").unwrap();
    let other = Catalog::open(&loc, "there").unwrap();
    let tree: Vec<Commit> = (0..300)
        .map(|i| commit(&format!("t/d{}/f{i}", i % 3), 7))
        .collect();
    c.register_new(&tree).unwrap();
    for p in ["t", "t0/x", "u/y"] {
        c.register_commit(&commit(p, 7)).unwrap();
    }
    for (i, f) in tree.iter().enumerate().step_by(10) {
        c.meta_set(&f.path, &avu("n", &i.to_string(), "")).unwrap();
        other.register_commit(f).unwrap();
    }
    c.meta_set("t0/x", &avu("n", "1", "")).unwrap();
    other.register_commit(&commit("u/y", 7)).unwrap();
    assert_eq!(rows_of(&c, "replicas"), 303 + 30 + 1);
    assert_eq!(rows_of(&c, "metadata"), 31);

    assert!(c.remove("t/d0/f0").unwrap());
    assert_eq!(rows_of(&c, "replicas"), 303 + 30 + 1 - 2);
    assert_eq!(c.remove_prefix("t").unwrap(), 300);
    assert_eq!(orphans(&c, "replicas"), 0);
    assert_eq!(orphans(&c, "metadata"), 0);
    assert_eq!(rows_of(&c, "replicas"), 3);
    assert_eq!(c.meta_ls("t0/x").unwrap(), [avu("n", "1", "")]);
    assert_eq!(c.stat("u/y").unwrap().unwrap().replicas.len(), 2);
    assert_eq!(paths(c.find(&Query::default()).unwrap()), ["t0/x", "u/y"]);
    // A path registered again after its removal starts with no metadata of the old one.
    c.register_commit(&tree[5]).unwrap();
    let s = c.stat(&tree[5].path).unwrap().unwrap();
    assert!(s.metadata.is_empty());
    assert_eq!(s.replicas.len(), 1);
}

/// `find --meta 'ATTR>N'` under a prefix, many times over (PostgreSQL would plan the sixth
/// run of one prepared statement generically): always the objects under the prefix whose
/// number is larger, and never one outside it.
fn a_numeric_find_under_a_prefix_answers_the_same_every_time(b: &Backend) {
    let c = b.catalog();
    let files: Vec<Commit> = (0..2_000)
        .map(|i| commit(&format!("{}/d{}/f{i}", ["a", "b"][(i / 3) % 2], i % 7), 3))
        .collect();
    c.register_new(&files).unwrap();
    for (i, f) in files.iter().enumerate().filter(|(i, _)| i % 20 == 0) {
        c.meta_set(&f.path, &avu("exposure", &(i / 20).to_string(), "s"))
            .unwrap();
    }
    for round in 0..8 {
        let n = 40 + round;
        let q = Query {
            under: Some("a".into()),
            conditions: vec![Condition::Gt {
                attr: "exposure".into(),
                n: n as f64,
            }],
            limit: 1_001,
            ..Query::default()
        };
        let mut want: Vec<String> = files
            .iter()
            .enumerate()
            .filter(|(i, f)| i % 20 == 0 && i / 20 > n && f.path.starts_with("a/"))
            .map(|(_, f)| f.path.clone())
            .collect();
        want.sort();
        assert!(!want.is_empty());
        assert_eq!(paths(c.find(&q).unwrap()), want, "round {round}");
    }
}

/// A catalog of schema 5 (replicas and metadata with foreign keys) keeps every replica and
/// metadata entry through the migration that drops them, and its indexes.
#[test]
fn replicas_and_metadata_survive_the_migration_without_foreign_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sqlite");
    let mut conn = rusqlite::Connection::open(&path).unwrap();
    run_migrations(&mut conn, "catalog_migrations", &schema::MIGRATIONS[..5], 0).unwrap();
    conn.execute_batch(
        "INSERT INTO objects VALUES (1, 'a/x', 3, 3000, x'03', 'blake3', 'alice', 0);
         INSERT INTO replicas VALUES (1, 'here', '/srv/a/x', 'good');
         INSERT INTO replicas VALUES (1, 'there', '/m/a/x', 'stale');
         INSERT INTO metadata VALUES (1, 'exposure', '30', 's', 30.0);",
    )
    .unwrap();
    drop(conn);
    let c = Catalog::open(&Location::Sqlite(path), "here").unwrap();
    assert_eq!(c.schema_version().unwrap(), 7);
    let s = c.stat("a/x").unwrap().unwrap();
    assert_eq!(s.replicas.len(), 2);
    assert_eq!(s.metadata, [avu("exposure", "30", "s")]);
    let q = Query {
        under: Some("a".into()),
        conditions: vec![Condition::Gt {
            attr: "exposure".into(),
            n: 29.0,
        }],
        ..Query::default()
    };
    assert_eq!(paths(c.find(&q).unwrap()), ["a/x"]);
    let indexes = c
        .lock()
        .rows(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'metadata_%'
             ORDER BY name",
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|mut r| r.text(0).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(indexes, ["metadata_num", "metadata_value"]);
    assert_eq!(c.remove_prefix("a").unwrap(), 1);
    assert_eq!(rows_of(&c, "replicas") + rows_of(&c, "metadata"), 0);
}

/// A catalog made at schema 6 (no replica paths) migrates to 7: its replicas read back at
/// their object's path (none of their own), and a replica with a path of its own reads it.
fn a_catalog_of_schema_6_reads_its_replicas_at_the_objects_path(b: &Backend) {
    let loc = b.fresh();
    let mut conn = match &loc {
        Location::Sqlite(p) => Conn::Sqlite(rusqlite::Connection::open(p).unwrap()),
        Location::Postgres(url) => Conn::Postgres(crate::pg::Pg::connect(url).unwrap()),
        Location::Memory => unreachable!("a fresh catalog has a location"),
    };
    schema::migrate_on(&mut conn, "catalog_migrations", &schema::MIGRATIONS[..6], 0).unwrap();
    conn.run(
        "INSERT INTO objects (id, path, size, mtime_ns, digest, algo, stored_by, stored_at)
         VALUES (1, 'a/x', 3, 3000, ?1, 'blake3', 'alice', 0)",
        args![&[3u8][..]],
    )
    .unwrap();
    for (server, physical) in [("here", "/srv/a/x"), ("there", "/m/a/x")] {
        conn.run(
            "INSERT INTO replicas (object, server, physical, state) VALUES (1, ?1, ?2, 'good')",
            args![server, physical],
        )
        .unwrap();
    }
    drop(conn);
    let c = b.open(&loc, "here");
    assert_eq!(c.schema_version().unwrap(), 7);
    let paths = |c: &Catalog| -> Vec<(String, Option<String>)> {
        c.stat("a/x")
            .unwrap()
            .unwrap()
            .replicas
            .into_iter()
            .map(|r| (r.server, r.path))
            .collect()
    };
    assert_eq!(
        paths(&c),
        [("here".to_owned(), None), ("there".to_owned(), None)]
    );
    c.lock()
        .run(
            "UPDATE replicas SET path = ?1 WHERE server = 'there'",
            args!["b/y"],
        )
        .unwrap();
    assert_eq!(paths(&c)[1], ("there".to_owned(), Some("b/y".to_owned())));
    // This server's registration of its own copy keeps its replica at the object's path.
    c.register_commit(&commit("a/x", 3)).unwrap();
    assert_eq!(paths(&c)[0], ("here".to_owned(), None));
}
