//! A catalog on a PostgreSQL across a network: TLS, the server's certificate checked against
//! the CA the location names and its name against the host; clear text only when asked for.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use crate::db::Db;
use crate::pg::{Pg, PgUrl};
use crate::*;

/// A CA, and a certificate it signed for `names` with its key (PEM).
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn pki(names: &[&str]) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    Pki {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// Whether the session `url` opens is encrypted, as the server itself reports it.
fn encrypted(url: &str) -> bool {
    let mut pg = Pg::connect(&PgUrl::parse(url).unwrap()).unwrap();
    let mut rows = pg
        .rows(
            "SELECT count(*) FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
            &[],
        )
        .unwrap();
    rows.remove(0).int(0).unwrap() == 1
}

#[test]
fn a_catalog_across_a_network_speaks_tls_to_the_certificate_its_location_trusts() {
    let ours = pki(&["localhost"]);
    let Some(cluster) = ferry_netem::needs(
        "ferry_catalog::tls_tests::a_catalog_across_a_network_speaks_tls",
        TestCluster::start_tls(&ours.cert, &ours.key),
    ) else {
        return;
    };
    let port = cluster.tls_port().expect("started with TLS");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &ours.ca).unwrap();
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, pki(&["localhost"]).ca).unwrap();
    let at = |host: &str, tls: &str| {
        format!("host={host} port={port} user=postgres dbname=postgres connect_timeout=5 {tls}")
    };

    // Verified: the catalog works through it, and the server sees an encrypted session.
    let good = at(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={}", ca.display()),
    );
    assert!(encrypted(&good));
    let catalog = Catalog::open(&Location::parse(&good).unwrap(), "here").unwrap();
    catalog
        .register_commit(&Commit {
            path: "a/b.txt".into(),
            size: 3,
            mtime_ns: 1,
            digest: vec![1; 32],
            algo: "blake3".into(),
            stored_by: "alice".into(),
            physical: "/srv/a/b.txt".into(),
        })
        .unwrap();
    assert_eq!(catalog.stat("a/b.txt").unwrap().unwrap().object.size, 3);
    // The URL form, its root certificate's path %-escaped, says the same.
    let escaped = ca.display().to_string().replace('/', "%2F");
    let url = format!(
        "postgresql://postgres@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={escaped}"
    );
    assert!(encrypted(&url));
    // A root certificate alone asks for TLS.
    assert!(encrypted(&at(
        "localhost",
        &format!("sslrootcert={}", ca.display())
    )));

    // Another CA's certificate, or a certificate for another name: no connection at all.
    let wrong_ca = at(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={}", other_ca.display()),
    );
    let Err(e) = Catalog::open(&Location::parse(&wrong_ca).unwrap(), "here") else {
        panic!("a certificate from a CA the location does not trust is refused");
    };
    assert!(format!("{e}").contains("certificate"), "{e}");
    let wrong_name = at(
        "127.0.0.1",
        &format!("sslmode=verify-full sslrootcert={}", ca.display()),
    );
    let Err(e) = Catalog::open(&Location::parse(&wrong_name).unwrap(), "here") else {
        panic!("a certificate for another name is refused");
    };
    assert!(format!("{e}").contains("certificate"), "{e}");

    // Clear text to loopback stays possible, and is clear text.
    assert!(!encrypted(&at("127.0.0.1", "")));
    assert!(!encrypted(&at("localhost", "sslmode=disable")));
}
