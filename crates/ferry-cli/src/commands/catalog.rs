//! `ferry stat`, `rm`, `mv`, `mkdir`, `meta set|rm|ls`, `find` and `verify`: requests to a
//! server (`stat` and `meta ls` of several files on one connection), answered from its catalog (and, for rm, mv and mkdir, done on its files) under the
//! token's scopes. Paths are shown from the server's root, with a leading `/`.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferry_net::catalog::{self as cat, Changed};
use ferry_net::{ClientConfig, CopyConfig};
use ferry_proto::{
    CatalogObject, CatalogStat, Compare, FindCondition, FindRequest, MetaEntry, MAX_FIND_CONDITIONS,
};
use serde_json::{json, Value};

use crate::catalog_args::{
    FindArgs, MetaCommand, MkdirArgs, MvArgs, ReachArgs, RmArgs, StatArgs, VerifyArgs,
};
use crate::config::remote_client;
use crate::error::usage;
use crate::output::clean;

/// The remote path and a client for it; a bad argument is a usage error.
fn reach(remote: &str, what: &str, r: &ReachArgs) -> Result<(String, ClientConfig)> {
    let (remote, client) = remote_client(remote, what, &r.auth, &r.conn, &r.wait).map_err(usage)?;
    Ok((remote.path, client))
}

pub async fn stat(args: StatArgs, quiet: bool) -> Result<ExitCode> {
    let what = "stat takes remote files, HOST[:PORT]:PATH (more of the same server as /PATH)";
    let (paths, cfg) = reach_many(&args.remotes, what, &args.reach)?;
    let notices = Notices(quiet);
    let mut session = cat::CatalogSession::new(&cfg, &notices);
    if let [path] = paths.as_slice() {
        let s = session.locate(path).await.context("stat failed")?;
        session.close().await;
        if args.reach.output.json {
            println!("{:#}", stat_json(&s));
        } else {
            print_stat(&s);
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Several: each answered in turn on one connection, a refusal reported and the rest asked.
    let mut failed = false;
    for (i, path) in paths.iter().enumerate() {
        match session.locate(path).await {
            Ok(s) if args.reach.output.json => println!("{:#}", stat_json(&s)),
            Ok(s) => {
                if i > 0 {
                    println!();
                }
                print_stat(&s);
            }
            Err(e) => {
                failed = true;
                refused_one(args.reach.output.json, "stat", path, &e);
            }
        }
    }
    session.close().await;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One path of several refused: said on stderr, and with `--json` as that path's object
/// (`{"path", "error"}`, the error as a failed command's).
fn refused_one(json: bool, what: &str, path: &str, e: &ferry_net::SessionError) {
    eprintln!(
        "error: {what} {} failed: {}",
        clean(path),
        clean(&e.to_string())
    );
    if json {
        let v = json!({
            "path": path,
            "error": {"message": e.to_string(), "kind": "failed", "hint": null, "exit_code": 1},
        });
        println!("{v:#}");
    }
}

/// The remote paths of several arguments naming one server: the first HOST[:PORT]:PATH, the
/// others that again or a bare /PATH. Another server is a usage error.
fn reach_many(
    remotes: &[String],
    what: &str,
    r: &ReachArgs,
) -> Result<(Vec<String>, ClientConfig)> {
    let Some((first, rest)) = remotes.split_first() else {
        return Err(usage(anyhow::anyhow!("{what}")));
    };
    let (path, cfg) = reach(first, what, r)?;
    let mut paths = vec![path];
    for raw in rest {
        if raw.starts_with('/') || !crate::remote::Remote::looks_remote(raw) {
            paths.push(raw.clone());
            continue;
        }
        let (other, other_cfg) = reach(raw, what, r)?;
        if other_cfg.server != cfg.server {
            return Err(usage(anyhow::anyhow!(
                "one command asks one server: {} and {} differ",
                cfg.server,
                other_cfg.server
            )));
        }
        paths.push(other);
    }
    Ok((paths, cfg))
}

pub async fn rm(args: RmArgs, quiet: bool) -> Result<ExitCode> {
    let (path, cfg) = reach(
        &args.remote,
        "rm takes a remote path, HOST[:PORT]:PATH",
        &args.reach,
    )?;
    let done = cat::remove(&cfg, &path, args.recursive, &Notices(quiet))
        .await
        .with_context(|| format!("rm {path} failed"))?;
    report(&args.reach, quiet, json!({"removed": path}), done, || {
        format!("removed {path}")
    });
    Ok(ExitCode::SUCCESS)
}

pub async fn mv(args: MvArgs, quiet: bool) -> Result<ExitCode> {
    let what = "mv takes a remote path, HOST[:PORT]:PATH";
    let (from, cfg) = reach(&args.from, what, &args.reach)?;
    // The destination is on the same server: HOST[:PORT]:PATH naming it again, or a bare PATH.
    let to = if args.to.starts_with('/') || !crate::remote::Remote::looks_remote(&args.to) {
        args.to.clone()
    } else {
        let (to_remote, to_cfg) = remote_client(
            &args.to,
            what,
            &args.reach.auth,
            &args.reach.conn,
            &args.reach.wait,
        )
        .map_err(usage)?;
        if to_cfg.server != cfg.server {
            return Err(usage(anyhow::anyhow!(
                "mv moves within one server: {} and {} differ (ferry cp copies between servers)",
                cfg.server,
                to_cfg.server
            )));
        }
        to_remote.path
    };
    let done = cat::rename(&cfg, &from, &to, &Notices(quiet))
        .await
        .with_context(|| format!("mv {from} {to} failed"))?;
    report(
        &args.reach,
        quiet,
        json!({"from": from, "to": to}),
        done,
        || format!("moved {from} to {to}"),
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn mkdir(args: MkdirArgs, quiet: bool) -> Result<ExitCode> {
    let (path, cfg) = reach(
        &args.remote,
        "mkdir takes a remote path, HOST[:PORT]:PATH",
        &args.reach,
    )?;
    let done = cat::mkdir(&cfg, &path, args.parents, &Notices(quiet))
        .await
        .with_context(|| format!("mkdir {path} failed"))?;
    report(&args.reach, quiet, json!({"made": path}), done, || {
        format!("made {path}")
    });
    Ok(ExitCode::SUCCESS)
}

pub async fn meta(command: MetaCommand, quiet: bool) -> Result<ExitCode> {
    let what = "meta takes a remote file, HOST[:PORT]:PATH";
    let notices = Notices(quiet);
    match command {
        MetaCommand::Set(a) => {
            let (path, cfg) = reach(&a.remote, what, &a.reach)?;
            let entry = MetaEntry {
                attr: a.attr,
                value: a.value,
                unit: a.unit.unwrap_or_default(),
            };
            let shown =
                json!({"path": path, "attr": entry.attr, "value": entry.value, "unit": entry.unit});
            let done = cat::meta_set(&cfg, &path, entry, &notices)
                .await
                .with_context(|| format!("meta set on {path} failed"))?;
            report(&a.reach, quiet, json!({"set": shown}), done, String::new);
        }
        MetaCommand::Rm(a) => {
            let (path, cfg) = reach(&a.remote, what, &a.reach)?;
            let done = cat::meta_rm(&cfg, &path, &a.attr, a.value.as_deref(), &notices)
                .await
                .with_context(|| format!("meta rm on {path} failed"))?;
            report(
                &a.reach,
                quiet,
                json!({"path": path, "attr": a.attr}),
                done,
                || format!("removed {} entries of {}", done.objects, a.attr),
            );
        }
        MetaCommand::Ls(a) => return meta_ls(a, &notices).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// `meta ls` of one file (its entries, a JSON array) or of several on one connection (each
/// under its path; JSON: one `{"path", "meta"}` object a file).
async fn meta_ls(a: crate::catalog_args::MetaLsArgs, notices: &Notices) -> Result<ExitCode> {
    let what = "meta ls takes remote files, HOST[:PORT]:PATH (more of the same server as /PATH)";
    let (paths, cfg) = reach_many(&a.remotes, what, &a.reach)?;
    let json = a.reach.output.json;
    let mut session = cat::CatalogSession::new(&cfg, notices);
    if let [path] = paths.as_slice() {
        let entries = session
            .meta_ls(path)
            .await
            .with_context(|| format!("meta ls of {path} failed"))?;
        session.close().await;
        if json {
            let v: Vec<Value> = entries.iter().map(meta_json).collect();
            println!("{:#}", Value::Array(v));
        } else {
            for e in &entries {
                println!("{}", meta_line(e));
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut failed = false;
    for (i, path) in paths.iter().enumerate() {
        let entries = match session.meta_ls(path).await {
            Ok(entries) => entries,
            Err(e) => {
                failed = true;
                refused_one(json, "meta ls of", path, &e);
                continue;
            }
        };
        if json {
            let v: Vec<Value> = entries.iter().map(meta_json).collect();
            println!("{:#}", json!({"path": path, "meta": v}));
        } else {
            if i > 0 {
                println!();
            }
            println!("{}:", clean(path));
            for e in &entries {
                println!("{}", meta_line(e));
            }
        }
    }
    session.close().await;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

pub async fn find(args: FindArgs, quiet: bool) -> Result<ExitCode> {
    let (under, cfg) = reach(
        &args.remote,
        "find takes a remote directory, HOST[:PORT]:PATH",
        &args.reach,
    )?;
    let request = find_request(&args, under).map_err(usage)?;
    let found = cat::find(&cfg, request, &Notices(quiet))
        .await
        .context("find failed")?;
    if args.reach.output.json {
        let objects: Vec<Value> = found.objects.iter().map(object_json).collect();
        println!("{:#}", json!({"objects": objects, "more": found.more}));
    } else {
        for o in &found.objects {
            println!("/{}", clean(&o.path));
        }
    }
    if found.more && !quiet {
        eprintln!(
            "more: over {} objects match; only the first {} are shown (--limit raises it, up to {})",
            args.limit,
            args.limit,
            ferry_proto::MAX_FIND_LIMIT
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Exit 0 when everything checked is good (and, with -r, nothing is unregistered), 1 when
/// anything is not; a refusal is an error as for any command.
pub async fn verify(args: VerifyArgs, quiet: bool) -> Result<ExitCode> {
    let (path, cfg) = reach(
        &args.remote,
        "verify takes a remote file or directory, HOST[:PORT]:PATH",
        &args.reach,
    )?;
    let from = repair_sources(&args, &cfg)?;
    let v = cat::verify(&cfg, &path, args.recursive, &Notices(quiet))
        .await
        .with_context(|| format!("verify {path} failed"))?;
    let repairs = match args.repair && !v.clean() {
        true => Some(ferry_net::repl::repair(&cfg, &from, &v, Arc::new(Notices(quiet))).await),
        false => None,
    };
    let c = &v.counts;
    if args.reach.output.json {
        let problems: Vec<Value> = v
            .problems
            .iter()
            .map(|(p, path)| json!({"problem": p.as_str(), "path": format!("/{path}")}))
            .collect();
        let mut doc = json!({
            "checked": c.checked, "good": c.good, "bad": c.bad, "missing": c.missing,
            "unregistered": c.unregistered, "bytes": c.bytes,
            "problems": problems, "more": v.more,
        });
        if let (Some(r), Some(o)) = (&repairs, doc.as_object_mut()) {
            let repaired: Vec<Value> = r
                .repaired
                .iter()
                .map(|(path, from)| json!({"path": path, "from": from}))
                .collect();
            let unrepaired: Vec<Value> = r
                .unrepaired
                .iter()
                .map(|(path, why)| json!({"path": path, "why": why}))
                .collect();
            o.insert("repaired".into(), Value::Array(repaired));
            o.insert("unrepaired".into(), Value::Array(unrepaired));
        }
        println!("{doc:#}");
    } else {
        println!(
            "{} checked: {} good, {} bad, {} missing, {} unregistered; {} read",
            c.checked,
            c.good,
            c.bad,
            c.missing,
            c.unregistered,
            ferry_units::units::format_bytes(c.bytes)
        );
        for (p, path) in &v.problems {
            println!("{}\t/{}", p.as_str(), clean(path));
        }
        if v.more && !quiet {
            eprintln!(
                "more: over {} problems; the counts above count them all",
                v.problems.len()
            );
        }
        if let Some(r) = &repairs {
            for (path, from) in &r.repaired {
                println!("repaired\t{}\tfrom {}", clean(path), clean(from));
            }
            for (path, why) in &r.unrepaired {
                println!("unrepaired\t{}\t{}", clean(path), clean(why));
            }
        }
    }
    // Repaired: every bad or missing replica listed was mended, none left unlisted, and
    // nothing unregistered (a repair adopts nothing).
    let clean = match &repairs {
        Some(r) => r.all_done() && !v.more && c.unregistered == 0,
        None => v.clean(),
    };
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The servers a repair copies from, each as a third-party copy's source with the verified
/// server as its destination.
fn repair_sources(args: &VerifyArgs, target: &ClientConfig) -> Result<Vec<CopyConfig>> {
    let r = &args.reach;
    let mut auth = r.auth.clone();
    if let Some(t) = &args.from_token {
        auth.token = Some(t.clone());
    }
    let mut out = Vec::with_capacity(args.from.len());
    for f in &args.from {
        let server = crate::remote::Remote::parse_endpoint(f)
            .with_context(|| format!("--from {f}"))
            .map_err(usage)?;
        let (_, source) = remote_client(
            &format!("{}:/", server.server()),
            "--from takes HOST[:PORT]",
            &auth,
            &r.conn,
            &r.wait,
        )
        .map_err(usage)?;
        out.push(CopyConfig {
            source,
            dest: target.clone(),
            dest_addr: None,
        });
    }
    Ok(out)
}

/// The find the arguments ask for; a condition, date or size that does not read is a usage
/// error.
fn find_request(args: &FindArgs, under: String) -> Result<FindRequest> {
    if args.meta.len() > MAX_FIND_CONDITIONS {
        bail!("at most {MAX_FIND_CONDITIONS} --meta conditions");
    }
    let mut conditions = Vec::with_capacity(args.meta.len());
    for m in &args.meta {
        conditions.push(condition(m)?);
    }
    let newer_ns = match &args.newer {
        Some(d) => Some(parse_date(d).with_context(|| format!("--newer {d}"))?),
        None => None,
    };
    let larger = match &args.larger {
        Some(s) => {
            Some(ferry_units::units::parse_size(s).with_context(|| format!("--larger {s}"))?)
        }
        None => None,
    };
    Ok(FindRequest {
        under,
        conditions,
        name: args.name.clone(),
        newer_ns,
        larger,
        limit: args.limit,
    })
}

/// `ATTR=VALUE`, `ATTR>N` or `ATTR<N`: the first `=`, `>` or `<` splits it.
fn condition(s: &str) -> Result<FindCondition> {
    let Some(at) = s.find(['=', '>', '<']) else {
        bail!("--meta {s:?}: expected ATTR=VALUE, 'ATTR>N' or 'ATTR<N'");
    };
    let (attr, rest) = s.split_at(at);
    let (op, value) = rest.split_at(1);
    if attr.is_empty() {
        bail!("--meta {s:?}: no attribute before {op:?}");
    }
    let compare = match op {
        "=" => Compare::Eq,
        ">" => Compare::Gt,
        _ => Compare::Lt,
    };
    if compare != Compare::Eq && !value.trim().parse::<f64>().is_ok_and(f64::is_finite) {
        bail!("--meta {s:?}: `>` and `<` compare with a number");
    }
    Ok(FindCondition {
        compare,
        attr: attr.to_owned(),
        value: value.to_owned(),
    })
}

/// `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM[:SS]` (UTC, a trailing `Z` allowed) or `@SECONDS`, as
/// nanoseconds since the epoch.
fn parse_date(s: &str) -> Result<i64> {
    const NS: i64 = 1_000_000_000;
    if let Some(secs) = s.strip_prefix('@') {
        let secs: i64 = secs.parse().context("expected @SECONDS since the epoch")?;
        return secs.checked_mul(NS).context("too far from the epoch");
    }
    let bad = || anyhow::anyhow!("expected YYYY-MM-DD[THH:MM[:SS]] (UTC) or @SECONDS");
    let s = s.strip_suffix('Z').unwrap_or(s);
    let (date, time) = s.split_once(['T', ' ']).unwrap_or((s, "00:00:00"));
    let num = |p: Option<&str>| p.and_then(|p| p.parse::<i64>().ok()).ok_or_else(bad);
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next())?, num(d.next())?, num(d.next())?);
    let mut t = time.split(':');
    let (h, min) = (num(t.next())?, num(t.next())?);
    let sec = match t.next() {
        Some(p) => num(Some(p))?,
        None => 0,
    };
    if d.next().is_some() || t.next().is_some() {
        return Err(bad());
    }
    let fields = [
        (m, 1, 12),
        (day, 1, 31),
        (h, 0, 23),
        (min, 0, 59),
        (sec, 0, 60),
    ];
    if !(1..=9999).contains(&y) || fields.iter().any(|&(v, lo, hi)| v < lo || v > hi) {
        return Err(bad());
    }
    let secs = days_from_civil(y, m, day) * 86_400 + h * 3600 + min * 60 + sec;
    // Nanoseconds in an i64 reach the year 2262.
    secs.checked_mul(NS)
        .context("too far from the epoch (dates up to 2262 are taken)")
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What a change prints: its JSON (with the counts) or a line, unless quiet.
fn report(r: &ReachArgs, quiet: bool, mut v: Value, done: Changed, line: impl FnOnce() -> String) {
    if r.output.json {
        if let Some(o) = v.as_object_mut() {
            o.insert("entries".into(), json!(done.entries));
            o.insert("objects".into(), json!(done.objects));
        }
        println!("{v:#}");
    } else if !quiet {
        let line = line();
        if !line.is_empty() {
            println!("{}", clean(&line));
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn utc(ns: i64) -> String {
    ferry_probe::net::utc_text(ns.div_euclid(1_000_000_000), ' ') + " UTC"
}

fn object_json(o: &CatalogObject) -> Value {
    json!({
        "path": format!("/{}", o.path), "size": o.size, "mtime_ns": o.mtime_ns,
        "digest": hex(&o.digest), "algo": o.algo, "stored_by": o.stored_by,
        "stored_at_ns": o.stored_at,
    })
}

fn meta_json(e: &MetaEntry) -> Value {
    json!({"attr": e.attr, "value": e.value, "unit": e.unit})
}

fn meta_line(e: &MetaEntry) -> String {
    let unit = if e.unit.is_empty() {
        String::new()
    } else {
        format!(" {}", clean(&e.unit))
    };
    format!("{} = {}{unit}", clean(&e.attr), clean(&e.value))
}

fn stat_json(s: &CatalogStat) -> Value {
    let mut v = object_json(&s.object);
    let replicas: Vec<Value> = s
        .replicas
        .iter()
        .map(|r| {
            json!({"server": r.server, "physical": r.physical, "state": r.state.as_str(),
                   "address": r.address, "path": format!("/{}", r.path_or(&s.object.path))})
        })
        .collect();
    let metadata: Vec<Value> = s.metadata.iter().map(meta_json).collect();
    let policy = s.policy.as_ref().map_or(Value::Null, |p| {
        json!({
            "prefix": format!("/{}", p.prefix),
            "replicas_wanted": p.replicas,
            "replicas_good": good_replicas(s),
            "retain_s": p.retain_s,
            "checksum": p.checksum,
            "owed": p.owed.as_ref().map_or(Value::Null, |o| json!({
                "tries": o.tries,
                "next_in_ms": o.next_in_ms,
                "note": o.note,
            })),
        })
    });
    if let Some(o) = v.as_object_mut() {
        o.insert("replicas".into(), Value::Array(replicas));
        o.insert("metadata".into(), Value::Array(metadata));
        o.insert("policy".into(), policy);
    }
    v
}

fn good_replicas(s: &CatalogStat) -> usize {
    s.replicas
        .iter()
        .filter(|r| r.state == ferry_proto::ReplicaHealth::Good)
        .count()
}

/// The policy's line: what it wants and has, then what it owes ("2 wanted, 1 good; next try
/// in 30 s: peer siteB …: connection refused").
fn policy_line(s: &CatalogStat, p: &ferry_proto::CatalogPolicy) -> String {
    let mut line = format!(
        "/{}: {} wanted, {} good",
        clean(&p.prefix),
        p.replicas,
        good_replicas(s)
    );
    if let Some(o) = &p.owed {
        let next = o.next_in_ms.div_ceil(1000);
        match o.tries {
            0 => line.push_str("; replicating"),
            _ => line.push_str(&format!(
                "; next try in {next} s (after {} failed): {}",
                o.tries,
                clean(&o.note)
            )),
        }
    }
    if p.retain_s > 0 {
        line.push_str(&format!("; retained {}", retain_words(p.retain_s)));
    }
    if !p.checksum.is_empty() {
        line.push_str(&format!("; checksum {}", clean(&p.checksum)));
    }
    line
}

fn retain_words(s: u64) -> String {
    match s {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s => format!("{s}s"),
    }
}

fn print_stat(s: &CatalogStat) {
    let o = &s.object;
    println!("path:      /{}", clean(&o.path));
    println!(
        "size:      {} ({})",
        o.size,
        ferry_units::units::format_bytes(o.size)
    );
    println!("mtime:     {}", utc(o.mtime_ns));
    println!("digest:    {}:{}", clean(&o.algo), hex(&o.digest));
    println!("stored by: {} at {}", clean(&o.stored_by), utc(o.stored_at));
    for (i, r) in s.replicas.iter().enumerate() {
        let head = if i == 0 { "replicas:" } else { "" };
        let at = match r.address.is_empty() {
            true => String::new(),
            false => format!(" (at {})", clean(&r.address)),
        };
        // A copy a `repl` made at another path: where its server holds it.
        let at = match r.path.is_empty() {
            true => at,
            false => format!(" as /{}{at}", clean(&r.path)),
        };
        println!(
            "{head:<10} {} {} {}{at}",
            clean(&r.server),
            r.state.as_str(),
            clean(&r.physical)
        );
    }
    for (i, e) in s.metadata.iter().enumerate() {
        let head = if i == 0 { "metadata:" } else { "" };
        println!("{head:<10} {}", meta_line(e));
    }
    if let Some(p) = &s.policy {
        println!("policy:    {}", policy_line(s, p));
    }
}

/// Warnings (a newly pinned server key, a retry) on stderr, unless quiet.
pub(super) struct Notices(pub(super) bool);

impl ferry_core::Reporter for Notices {
    fn on_warning(&self, msg: &str) {
        if !self.0 {
            eprintln!("warning: {}", clean(msg));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_as_utc() {
        assert_eq!(parse_date("1970-01-01").unwrap(), 0);
        assert_eq!(
            parse_date("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000_000_000
        );
        assert_eq!(
            parse_date("@1700000000").unwrap(),
            1_700_000_000_000_000_000
        );
        assert_eq!(
            parse_date("2000-03-01").unwrap(),
            951_868_800 * 1_000_000_000
        );
        for bad in [
            "yesterday",
            "2023-13-01",
            "2023-11-14T25:00",
            "2023-11",
            "@x",
        ] {
            assert!(parse_date(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn conditions_read_as_find_does() {
        let c = condition("temp>40.5").unwrap();
        assert_eq!(
            (c.compare, c.attr.as_str(), c.value.as_str()),
            (Compare::Gt, "temp", "40.5")
        );
        let c = condition("run=a=b").unwrap();
        assert_eq!(
            (c.compare, c.attr.as_str(), c.value.as_str()),
            (Compare::Eq, "run", "a=b")
        );
        assert!(condition("temp>warm").is_err());
        assert!(condition("=x").is_err());
        assert!(condition("plain").is_err());
    }
}
