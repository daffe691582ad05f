//! The shared catalog on PostgreSQL: the connection, kept on a thread of its own, and the
//! dialect: the one place where the catalog's SQL is changed for PostgreSQL.
//!
//! The synchronous `postgres` client drives a runtime of its own, which may not be entered
//! from a thread already inside an async runtime; its own thread makes every caller (the
//! server's async start, its blocking pool, the catalog's registering thread) the same.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::net::IpAddr;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use postgres::types::{IsNull, ToSql, Type};
use postgres::{Client, Config, NoTls, Statement};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::db::{Arg, Db, Row, Val};
use crate::error::CatalogError;

/// How long opening the catalog waits for the server, unless the location says otherwise.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A PostgreSQL location: a `postgres://` or `postgresql://` URL, or `key=value` words
/// (`host=/run/postgresql dbname=ferry`). Shown with its password hidden.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl(String);

impl PgUrl {
    /// Whether `s` names a PostgreSQL database rather than a SQLite file.
    pub(crate) fn is_one(s: &str) -> bool {
        s.starts_with("postgres://")
            || s.starts_with("postgresql://")
            || [
                "host=",
                "hostaddr=",
                "dbname=",
                "user=",
                "port=",
                "service=",
            ]
            .iter()
            .any(|k| s.starts_with(k))
    }

    /// Reads and checks `s`, refusing what the client cannot read.
    pub(crate) fn parse(s: &str) -> Result<Self, CatalogError> {
        let url = Self(s.to_owned());
        url.config()?;
        Ok(url)
    }

    /// The client's settings, with a bounded connect time and the login user as the
    /// default user (as `psql` has it), and how the connection is secured.
    pub(crate) fn config(&self) -> Result<(Config, Tls), CatalogError> {
        let bad = |why: String| CatalogError::Location {
            location: self.to_string(),
            why,
        };
        let (rest, mode, root) = split_tls(&self.0).map_err(bad)?;
        let mut config: Config = rest.parse().map_err(|e| bad(format!("{e}")))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_user().is_none() {
            if let Ok(user) = std::env::var("USER") {
                config.user(&user);
            }
        }
        if config.get_application_name().is_none() {
            config.application_name("ferry");
        }
        let tls = tls_for(&config, mode.as_deref(), root.as_deref()).map_err(bad)?;
        config.ssl_mode(match tls {
            Tls::Off => SslMode::Disable,
            Tls::Verified(_) => SslMode::Require,
        });
        Ok((config, tls))
    }
}

/// How the connection to the database is secured.
#[derive(Clone)]
pub(crate) enum Tls {
    /// Clear text: a Unix socket or loopback, or `sslmode=disable` said so.
    Off,
    /// TLS, the server's certificate checked against the CAs of `sslrootcert` and its name
    /// against the host the location names (libpq's `verify-full`).
    Verified(MakeRustlsConnect),
}

impl Tls {
    fn connect(&self, config: &Config) -> Result<Client, postgres::Error> {
        match self {
            Self::Off => config.connect(NoTls),
            Self::Verified(tls) => config.connect(tls.clone()),
        }
    }
}

/// The security a location asks for, or why it cannot have it. A database reached over a
/// network is never spoken to in clear text unless the location says `sslmode=disable`, and
/// never over TLS without checking whose certificate it is: a catalog's statements carry its
/// password's proof and every path and digest it holds.
fn tls_for(config: &Config, mode: Option<&str>, root: Option<&str>) -> Result<Tls, String> {
    let verified = |root: Option<&str>| match root {
        Some(file) => verifier(file).map(Tls::Verified),
        None => Err(
            "TLS to the catalog's database needs sslrootcert=FILE: the CA (PEM) that \
                     signed its certificate"
                .to_owned(),
        ),
    };
    match mode {
        Some("disable") => Ok(Tls::Off),
        Some("require" | "verify-full") => verified(root),
        Some("verify-ca") => Err("sslmode=verify-ca: ferry checks the server's name as well \
                                  as its CA; use sslmode=verify-full"
            .to_owned()),
        Some("prefer" | "allow") | None if root.is_some() => verified(root),
        Some("prefer" | "allow") | None => match remote_host(config) {
            None => Ok(Tls::Off),
            Some(host) => Err(format!(
                "the catalog's database is reached over the network ({host}): give \
                 sslmode=verify-full and sslrootcert=FILE (the CA that signed its \
                 certificate), or sslmode=disable on a network you trust"
            )),
        },
        Some(other) => Err(format!(
            "sslmode={other}: expected disable, require or verify-full"
        )),
    }
}

/// The first host of `config` that is neither a Unix socket nor loopback.
fn remote_host(config: &Config) -> Option<String> {
    let loopback = |h: &str| {
        h.eq_ignore_ascii_case("localhost")
            || h.trim_matches(['[', ']'])
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    let hosts = config.get_hosts().iter().filter_map(|h| match h {
        Host::Tcp(name) if !loopback(name) => Some(name.clone()),
        _ => None,
    });
    let addrs = config
        .get_hostaddrs()
        .iter()
        .filter(|ip| !ip.is_loopback())
        .map(ToString::to_string);
    hosts.chain(addrs).next()
}

/// A TLS client that trusts the CAs of one PEM file (ferry's own crypto provider, aws-lc).
fn verifier(file: &str) -> Result<MakeRustlsConnect, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs =
        CertificateDer::pem_file_iter(file).map_err(|e| format!("sslrootcert {file}: {e}"))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("sslrootcert {file}: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert {file}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert {file}: no certificate in it"));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(client))
}

/// `s` without its `sslmode` and `sslrootcert` settings (which the client library reads
/// only in part: it knows neither `verify-full` nor a root certificate), and their values.
fn split_tls(s: &str) -> Result<(String, Option<String>, Option<String>), String> {
    let mut mode = None;
    let mut root = None;
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            mode = Some(value);
            true
        }
        "sslrootcert" => {
            root = Some(value);
            true
        }
        _ => false,
    };
    let rest = if s.starts_with("postgres://") || s.starts_with("postgresql://") {
        let Some((base, query)) = s.split_once('?') else {
            return Ok((s.to_owned(), None, None));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !take(key, percent_decoded(value)?) {
                kept.push(pair);
            }
        }
        if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        let mut kept = String::new();
        for (key, value, text) in words(s)? {
            if !take(key, value) {
                if !kept.is_empty() {
                    kept.push(' ');
                }
                kept.push_str(text);
            }
        }
        kept
    };
    Ok((rest, mode, root))
}

/// A URL query value with its `%XX` escapes decoded.
fn percent_decoded(v: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(v.len());
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = v
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("a bad %-escape in {v:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{v:?} is not UTF-8 once decoded"))
}

/// The `key=value` words of a libpq connection string: each key, its value (quotes and
/// backslash escapes removed) and the word's own text.
fn words(s: &str) -> Result<Vec<(&str, String, &str)>, String> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let start = rest;
        let eq = rest.find('=').ok_or_else(|| {
            format!(
                "{:?}: expected key=value",
                rest.split(' ').next().unwrap_or("")
            )
        })?;
        let key = rest[..eq].trim();
        rest = rest[eq + 1..].trim_start();
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = if rest.starts_with('\'') {
            chars.next();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '\'' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => value.push(c),
                }
            }
            end.ok_or_else(|| format!("{key}: an unterminated quote"))?
        } else {
            let mut end = rest.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    c if c.is_whitespace() => {
                        end = i;
                        break;
                    }
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    c => value.push(c),
                }
            }
            end
        };
        let used = start.len() - rest.len() + end;
        out.push((key, value, &start[..used]));
        rest = start[used..].trim_start();
    }
    Ok(out)
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({:?})", redact(&self.0))
    }
}

/// `s` with any password replaced by `***`: the URL's `user:password@` and every
/// `password=` value (of a URL's query or of `key=value` words).
pub(crate) fn redact(s: &str) -> String {
    let mut out = s.to_owned();
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let end = out[start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| start + i);
        if let Some(at) = out[start..end].rfind('@').map(|i| start + i) {
            if let Some(colon) = out[start..at].find(':').map(|i| start + i) {
                out.replace_range(colon + 1..at, "***");
            }
        }
    }
    let mut from = 0;
    while let Some(i) = out[from..]
        .find("password=")
        .map(|i| from + i + "password=".len())
    {
        let rest = &out[i..];
        let len = if let Some(quoted) = rest.strip_prefix('\'') {
            quoted.find('\'').map_or(rest.len(), |j| j + 2)
        } else {
            rest.find(['&', ' ']).unwrap_or(rest.len())
        };
        out.replace_range(i..i + len, "***");
        from = i + 3;
    }
    out
}

/// A statement's text for PostgreSQL: `?N` parameters as `$N`, and no `+` before an
/// `ORDER BY` column (SQLite's way of keeping the planner off that column's index; PostgreSQL
/// has no unary `+` on text).
pub(crate) fn statement(sql: &str) -> String {
    let sql = sql.replace("ORDER BY +", "ORDER BY ");
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

/// A migration's text for PostgreSQL: SQLite's row id (`INTEGER PRIMARY KEY`) as an identity
/// column, integers as 64-bit, blobs as `bytea`, and text compared byte by byte (`COLLATE
/// "C"`, SQLite's own order), which the path ranges of [`crate::under`] rely on.
pub(crate) fn schema(sql: &str) -> String {
    sql.replace(
        "INTEGER PRIMARY KEY",
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    )
    .replace(" INTEGER", " BIGINT")
    .replace(" BLOB", " BYTEA")
    .replace(" TEXT", " TEXT COLLATE \"C\"")
}

/// Prepared statements kept per connection; the catalog's own texts are a few dozen.
const MOST_PREPARED: usize = 256;

/// The connection and its prepared statements, on the connection's thread.
///
/// A connection the database closed (it restarted, an administrator ended it, the network
/// dropped) is made again at the next call, so a server's catalog works again without a
/// restart of its own. Never within a transaction: one that lost its connection fails every
/// statement up to its end, and its `COMMIT` fails, as PostgreSQL rolled it back; nothing is
/// retried, since a statement cut off may or may not have run.
struct Session {
    config: Config,
    tls: Tls,
    client: Option<Client>,
    prepared: HashMap<String, Statement>,
    /// A transaction is open: `BEGIN` ran, its `COMMIT` or `ROLLBACK` not yet.
    in_tx: bool,
    /// The open transaction lost its connection.
    lost_in_tx: bool,
}

impl Session {
    /// The live connection, made again if the last one was closed (outside a transaction).
    fn client(&mut self) -> Result<&mut Client, CatalogError> {
        if self.lost_in_tx {
            return Err(CatalogError::Lost);
        }
        if self.client.as_ref().is_none_or(Client::is_closed) {
            if self.in_tx {
                self.lost_in_tx = true;
                return Err(CatalogError::Lost);
            }
            self.client = None;
            self.prepared.clear();
            self.client = Some(
                self.tls
                    .connect(&self.config)
                    .map_err(CatalogError::Reconnect)?,
            );
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    /// After a statement's error: a closed connection is dropped (made again at the next
    /// call), and an open transaction is lost with it.
    fn failed(&mut self, e: postgres::Error) -> CatalogError {
        // Closed, or closing: the server's last word on a connection it ends is an error of
        // class 57 (operator intervention: shutdown, termination) or 08 (connection).
        let ending = e
            .code()
            .is_some_and(|c| c.code().starts_with("57P") || c.code().starts_with("08"));
        if e.is_closed() || ending || self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
            if self.in_tx {
                self.lost_in_tx = true;
            }
        }
        e.into()
    }

    fn prepared(&mut self, sql: &str) -> Result<Statement, CatalogError> {
        // Connected first: a new connection has none of the old one's statements.
        self.client()?;
        if let Some(st) = self.prepared.get(sql) {
            return Ok(st.clone());
        }
        // Each is kept by the database for the connection's life: a statement text made
        // from input would otherwise grow both without bound.
        if self.prepared.len() >= MOST_PREPARED {
            self.prepared.clear();
        }
        let r = self.client()?.prepare(&statement(sql));
        let st = r.map_err(|e| self.failed(e))?;
        self.prepared.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    fn query(&mut self, sql: &str, args: &[Val]) -> Result<Vec<Row>, CatalogError> {
        let st = self.prepared(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let r = self.client()?.query(&st, &params);
        let rows = r.map_err(|e| self.failed(e))?;
        rows.iter().map(read_row).collect()
    }

    /// As [`Self::query`] with a statement of its own, prepared and closed again: a new
    /// statement is planned for its parameters (PostgreSQL turns to a generic plan only after
    /// five executions of one statement).
    fn query_planned(&mut self, sql: &str, args: &[Val]) -> Result<Vec<Row>, CatalogError> {
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let text = statement(sql);
        let r = self.client()?.query(text.as_str(), &params);
        let rows = r.map_err(|e| self.failed(e))?;
        rows.iter().map(read_row).collect()
    }

    fn execute(&mut self, sql: &str, args: &[Val]) -> Result<u64, CatalogError> {
        let st = self.prepared(sql)?;
        let params: Vec<&(dyn ToSql + Sync)> =
            args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
        let r = self.client()?.execute(&st, &params);
        r.map_err(|e| self.failed(e))
    }

    /// Statements without parameters; keeps track of the transaction `BEGIN`, `COMMIT` and
    /// `ROLLBACK` open and close.
    fn batch(&mut self, sql: &str) -> Result<(), CatalogError> {
        let word = sql.trim().to_ascii_uppercase();
        match word.as_str() {
            "COMMIT" | "ROLLBACK" if self.lost_in_tx => {
                self.in_tx = false;
                self.lost_in_tx = false;
                return if word == "COMMIT" {
                    Err(CatalogError::Lost)
                } else {
                    Ok(())
                };
            }
            _ => {}
        }
        let r = self.client()?.batch_execute(sql);
        match word.as_str() {
            "BEGIN" if r.is_ok() => self.in_tx = true,
            "COMMIT" | "ROLLBACK" => self.in_tx = false,
            _ => {}
        }
        r.map_err(|e| {
            let e = self.failed(e);
            if self.lost_in_tx && (word == "COMMIT" || word == "ROLLBACK") {
                self.lost_in_tx = false;
            }
            e
        })
    }
}

type Job = Box<dyn FnOnce(&mut Session) + Send>;

/// A connection to PostgreSQL, on a thread of its own (see the module's doc).
pub(crate) struct Pg {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Pg {
    /// Connects; a server that cannot be reached, or refuses the login, is an error here.
    pub(crate) fn connect(url: &PgUrl) -> Result<Self, CatalogError> {
        let (config, tls) = url.config()?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, connected) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("ferry-catalog-pg".into())
            .spawn(move || {
                let client = match tls.connect(&config) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                let mut session = Session {
                    config,
                    tls,
                    client: Some(client),
                    prepared: HashMap::new(),
                    in_tx: false,
                    lost_in_tx: false,
                };
                while let Ok(job) = queue.recv() {
                    job(&mut session);
                }
            })?;
        let pg = Self {
            jobs: Some(jobs),
            thread: Some(thread),
        };
        match connected.recv() {
            Ok(Ok(())) => Ok(pg),
            Ok(Err(e)) => Err(CatalogError::Connect {
                location: url.to_string(),
                source: e,
            }),
            Err(_) => Err(CatalogError::Gone),
        }
    }

    /// Runs `f` on the connection's thread and waits for what it returns.
    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Session) -> Result<R, CatalogError> + Send + 'static,
    ) -> Result<R, CatalogError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |s| {
            let _ = tx.send(f(s));
        });
        self.jobs
            .as_ref()
            .ok_or(CatalogError::Gone)?
            .send(job)
            .map_err(|_| CatalogError::Gone)?;
        rx.recv().map_err(|_| CatalogError::Gone)?
    }
}

impl Drop for Pg {
    /// Closes the connection: the thread ends once its queue does.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Db for Pg {
    fn run(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, CatalogError> {
        let (sql, args) = owned(sql, args);
        self.call(move |s| s.execute(&sql, &args))
    }

    fn rows(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        let (sql, args) = owned(sql, args);
        self.call(move |s| s.query(&sql, &args))
    }

    fn rows_planned(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<Vec<Row>, CatalogError> {
        let (sql, args) = owned(sql, args);
        self.call(move |s| s.query_planned(&sql, &args))
    }

    fn batch(&mut self, sql: &str) -> Result<(), CatalogError> {
        let sql = schema(sql);
        self.call(move |s| s.batch(&sql))
    }
}

fn owned(sql: &str, args: &[Arg<'_>]) -> (String, Vec<Val>) {
    (sql.to_owned(), args.iter().map(|&a| Val::from(a)).collect())
}

/// A row's columns as [`Val`]s, by the types the catalog's schema uses.
fn read_row(r: &postgres::Row) -> Result<Row, CatalogError> {
    let mut out = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let ty = col.type_();
        let v = match *ty {
            Type::INT8 => r.try_get::<_, Option<i64>>(i)?.map(Val::Int),
            Type::INT4 => r.try_get::<_, Option<i32>>(i)?.map(|n| Val::Int(n.into())),
            Type::INT2 => r.try_get::<_, Option<i16>>(i)?.map(|n| Val::Int(n.into())),
            Type::BOOL => r
                .try_get::<_, Option<bool>>(i)?
                .map(|b| Val::Int(i64::from(b))),
            Type::FLOAT8 => r.try_get::<_, Option<f64>>(i)?.map(Val::Real),
            Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR => {
                r.try_get::<_, Option<String>>(i)?.map(Val::Text)
            }
            Type::BYTEA => r.try_get::<_, Option<Vec<u8>>>(i)?.map(Val::Blob),
            Type::VOID => None,
            _ => {
                return Err(CatalogError::Column(
                    i,
                    "a type the catalog uses",
                    ty.to_string(),
                ))
            }
        };
        out.push(v.unwrap_or(Val::Null));
    }
    Ok(Row(out))
}

/// A parameter in whatever type the server asks for: PostgreSQL infers each one's type from
/// the statement (an `int4` for `substr`'s start, an `int8` for a column), where SQLite takes
/// any.
impl ToSql for Val {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match self {
            Self::Null => Ok(IsNull::Yes),
            Self::Int(n) => match *ty {
                Type::INT8 => n.to_sql(ty, out),
                Type::INT4 => i32::try_from(*n)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*n)?.to_sql(ty, out),
                Type::BOOL => (*n != 0).to_sql(ty, out),
                // Every i64 a catalog holds (sizes, times) is exact enough as a double.
                #[allow(clippy::cast_precision_loss)]
                Type::FLOAT8 => (*n as f64).to_sql(ty, out),
                _ => Err(format!("an integer for a parameter of type {ty}").into()),
            },
            Self::Real(n) => n.to_sql(ty, out),
            Self::Text(s) => s.as_str().to_sql(ty, out),
            Self::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        let cases = [
            (
                "postgres://ferry:s3cret@db.example/cat",
                "postgres://ferry:***@db.example/cat",
            ),
            (
                "postgresql://ferry@db/cat?password=s3cret&sslmode=disable",
                "postgresql://ferry@db/cat?password=***&sslmode=disable",
            ),
            (
                "host=/run/pg user=ferry password='a b' dbname=cat",
                "host=/run/pg user=ferry password=*** dbname=cat",
            ),
            ("host=/run/pg dbname=cat", "host=/run/pg dbname=cat"),
        ];
        for (given, shown) in cases {
            let url = PgUrl(given.to_owned());
            assert_eq!(url.to_string(), shown);
            assert!(!format!("{url:?}").contains("s3cret"));
        }
    }

    #[test]
    fn tls_settings_are_read_from_either_form_and_the_rest_left_to_the_client() {
        let (rest, mode, root) =
            split_tls("host=db port=5 sslmode=verify-full sslrootcert='/etc/a b.pem' dbname=c")
                .unwrap();
        assert_eq!(rest, "host=db port=5 dbname=c");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/a b.pem"));
        let (rest, mode, root) = split_tls(
            "postgres://u@db/c?sslmode=require&connect_timeout=3&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@db/c?connect_timeout=3");
        assert_eq!(mode.as_deref(), Some("require"));
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
        let (rest, mode, _) = split_tls("postgres://u@db/c?sslmode=disable").unwrap();
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("postgres://u@db/c", Some("disable"))
        );
        let (rest, mode, root) = split_tls("host=/run/pg password='a \\' b' dbname=c").unwrap();
        assert_eq!(rest, "host=/run/pg password='a \\' b' dbname=c");
        assert_eq!((mode, root), (None, None));
        assert!(split_tls("host=db sslrootcert='/x").is_err());
        assert!(split_tls("host=db dbname").is_err());
        assert!(split_tls("postgres://u@db/c?sslrootcert=%zz").is_err());
    }

    #[test]
    fn a_database_across_a_network_needs_tls_or_a_location_that_declines_it() {
        let err = |s: &str| {
            PgUrl::parse(s)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("host=db.example.org dbname=cat").contains("sslmode=verify-full"));
        assert!(err("postgres://ferry@10.1.2.3/cat").contains("over the network (10.1.2.3)"));
        assert!(err("host=db sslmode=verify-full dbname=c").contains("sslrootcert=FILE"));
        assert!(err("host=db sslmode=verify-ca sslrootcert=/x").contains("verify-full"));
        assert!(err("host=db sslmode=bogus").contains("sslmode=bogus"));
        assert!(
            err("host=db sslmode=require sslrootcert=/nonexistent/ca.pem")
                .contains("/nonexistent/ca.pem")
        );
        for ok in [
            "host=/run/postgresql dbname=c",
            "host=localhost dbname=c",
            "host=127.0.0.1 dbname=c",
            "postgres://u@[::1]/c",
            "host=db.example.org sslmode=disable dbname=c",
        ] {
            let (config, tls) = PgUrl::parse(ok).unwrap().config().unwrap();
            assert!(matches!(tls, Tls::Off), "{ok}");
            assert_eq!(config.get_ssl_mode(), SslMode::Disable, "{ok}");
        }
    }

    #[test]
    fn statements_and_schemas_in_postgresql_s_dialect() {
        assert_eq!(
            statement("SELECT a FROM t WHERE b = ?1 AND c < ?12 ORDER BY +a"),
            "SELECT a FROM t WHERE b = $1 AND c < $12 ORDER BY a"
        );
        assert_eq!(
            schema("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, d BLOB, s TEXT)"),
            "CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, \
             n BIGINT NOT NULL, d BYTEA, s TEXT COLLATE \"C\")"
        );
    }
}
