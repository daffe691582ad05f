//! The service's client commands: `ferry submit`, `jobs`, `job ID`, `cancel ID` and `links`,
//! each a request to the service's HTTP API, printed for people or (`--json`) as the API's JSON.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use ferry_service::api::SubmitRequest;
use ferry_service::client::Client;
use ferry_service::tls::Trust;
use ferry_service::{Job, ServiceError};
use ferry_units::units::format_bytes_2dp as human_bytes;

use crate::error::usage;
use crate::output::clean;
use crate::service_args::{
    JobArgs, JobsArgs, LinksArgs, ServiceClientArgs, SubmitArgs, DEFAULT_SERVICE_PORT,
};

/// How long one request to the service may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The client for the service the arguments name.
fn client(a: &ServiceClientArgs) -> Result<Client> {
    let given = a
        .service
        .clone()
        .or_else(|| {
            std::env::var("FERRY_SERVICE")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| format!("127.0.0.1:{DEFAULT_SERVICE_PORT}"));
    let addr = with_port(&given);
    let token = crate::args::token_given(a.token.as_deref())
        .context("no token: pass --token or set FERRY_TOKEN")
        .map_err(usage)?;
    let trust = match &a.service_fingerprint {
        Some(fp) => Trust::Pinned(fp.parse().map_err(|e| usage(anyhow::Error::new(e)))?),
        None => {
            let file = a
                .known_hosts
                .clone()
                .or_else(|| std::env::var_os("FERRY_KNOWN_HOSTS").map(Into::into))
                .or_else(crate::config::default_known_hosts)
                .context("no place for the known-hosts file: set HOME, or pass --known-hosts or --service-fingerprint")
                .map_err(usage)?;
            Trust::KnownHosts {
                file: ferry_net::KnownHosts::new(file),
                host: addr.clone(),
            }
        }
    };
    Ok(Client {
        addr,
        token,
        trust,
        timeout: REQUEST_TIMEOUT,
        kept: None,
    })
}

/// `HOST` gets the service's default port; `HOST:PORT` and `[V6]:PORT` stay as they are.
fn with_port(s: &str) -> String {
    let has_port = match s.strip_prefix('[') {
        Some(rest) => rest.contains("]:"),
        None => s.matches(':').count() == 1,
    };
    if has_port {
        s.to_owned()
    } else if s.contains(':') && !s.starts_with('[') {
        format!("[{s}]:{DEFAULT_SERVICE_PORT}")
    } else {
        format!("{s}:{DEFAULT_SERVICE_PORT}")
    }
}

/// A refusal for what the user typed (400) is a usage error, exit 2; the rest exit 1.
fn failed(e: ServiceError) -> anyhow::Error {
    match e {
        ServiceError::Api { status: 400, .. } => usage(anyhow::Error::new(e)),
        e => anyhow::Error::new(e),
    }
}

/// `--deadline`: a duration from now, or `@UNIX_SECONDS`.
fn deadline(s: &str) -> Result<i64> {
    if let Some(n) = s.strip_prefix('@') {
        return n
            .parse()
            .with_context(|| format!("--deadline {s}: expected @UNIX_SECONDS"));
    }
    let d = ferry_units::units::parse_duration(s).with_context(|| {
        format!("--deadline {s}: expected a duration (30m, 2h) or @UNIX_SECONDS")
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(i64::try_from((now + d).as_secs()).unwrap_or(i64::MAX))
}

pub async fn submit(a: SubmitArgs, quiet: bool) -> Result<ExitCode> {
    let c = client(&a.client)?;
    let mut paths = a.paths;
    let dest = paths.pop().context("no destination").map_err(usage)?;
    let deadline = a
        .deadline
        .as_deref()
        .map(deadline)
        .transpose()
        .map_err(usage)?;
    let req = SubmitRequest {
        sources: paths,
        dest,
        sync: a.sync,
        priority: a.priority,
        deadline,
        label: a.label,
    };
    let job = c.submit(&req).await.map_err(failed)?;
    if a.client.output.json {
        println!("{}", serde_json::to_string_pretty(&job)?);
    } else if quiet {
        println!("{}", job.id);
    } else {
        println!(
            "job {} queued: {} {} -> {}",
            job.id,
            job.kind.as_str(),
            job.sources.len(),
            clean(&job.dest)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// How often `jobs --watch` asks again.
const WATCH_EVERY: Duration = Duration::from_secs(2);

pub async fn jobs(a: JobsArgs) -> Result<ExitCode> {
    let mut c = client(&a.client)?;
    if a.watch {
        // Asked again every few seconds: one connection kept open, not a handshake each time.
        c.kept = Some(Default::default());
    }
    loop {
        let jobs = c.jobs(a.limit).await.map_err(failed)?;
        if a.client.output.json {
            println!("{}", serde_json::to_string_pretty(&jobs)?);
            return Ok(ExitCode::SUCCESS);
        }
        print_table(&jobs);
        // Ends with the jobs it shows: each ends by its attempts or its cancel.
        if !a.watch || jobs.iter().all(|j| j.state.is_final()) {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            _ = tokio::time::sleep(WATCH_EVERY) => println!(),
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

fn print_table(jobs: &[Job]) {
    println!(
        "{:>6}  {:<9}  {:<4}  {:>6}  {:>12}  {:<8}  LABEL",
        "ID", "STATE", "KIND", "DONE", "RATE", "OWNER"
    );
    for j in jobs {
        println!(
            "{:>6}  {:<9}  {:<4}  {:>5.1}%  {:>10}/s  {:<8}  {}",
            j.id,
            j.state.as_str(),
            j.kind.as_str(),
            percent(j),
            human_bytes(j.rate as u64),
            clean(&j.owner),
            clean(&j.label)
        );
    }
}

pub async fn job(a: JobArgs) -> Result<ExitCode> {
    let c = client(&a.client)?;
    let j = c.job(a.id).await.map_err(failed)?;
    print_job(&j, a.client.output.json)
}

pub async fn cancel(a: JobArgs, quiet: bool) -> Result<ExitCode> {
    let c = client(&a.client)?;
    let j = c.cancel(a.id).await.map_err(failed)?;
    if a.client.output.json {
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else if !quiet {
        println!("job {} cancelled", j.id);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn links(a: LinksArgs) -> Result<ExitCode> {
    let c = client(&a.client)?;
    let links = c.links().await.map_err(failed)?;
    if a.client.output.json {
        println!("{}", serde_json::to_string_pretty(&links)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<24}  {:>12}  {:>12}  {:>8}  {:<8}  {:>4}  {:>7}  STATE",
        "LINK", "LAST", "MEDIAN", "RTT", "SOURCE", "JOBS", "STREAMS"
    );
    let rate =
        |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{}/s", human_bytes(r as u64)));
    for l in &links.links {
        let last = l.last.as_ref();
        let tuning = l.tuning.as_ref();
        println!(
            "{:<24}  {:>12}  {:>12}  {:>8}  {:<8}  {:>4}  {:>7}  {}",
            clean(&l.name),
            rate(last.map(|s| s.rate)),
            rate(l.median_rate),
            last.and_then(|s| s.rtt_ms)
                .map_or("-".to_owned(), |ms| format!("{ms:.2} ms")),
            last.map_or("-", |s| s.source.as_str()),
            tuning.map_or("-".to_owned(), |t| t.jobs.to_string()),
            tuning
                .filter(|t| t.streams > 0)
                .map_or("-".to_owned(), |t| t.streams.to_string()),
            match &l.reason {
                Some(why) => format!("SLOW: {}", clean(why)),
                None => "ok".to_owned(),
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn percent(j: &Job) -> f64 {
    if j.bytes_total == 0 {
        return if j.state == ferry_service::State::Done {
            100.0
        } else {
            0.0
        };
    }
    100.0 * j.bytes_done as f64 / j.bytes_total as f64
}

fn print_job(j: &Job, json: bool) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(j)?);
        return Ok(ExitCode::SUCCESS);
    }
    let eta = (j.state == ferry_service::State::Running && j.rate > 0.0)
        .then(|| (j.bytes_total.saturating_sub(j.bytes_done) as f64 / j.rate).ceil());
    println!("job {}: {} ({})", j.id, j.state.as_str(), j.kind.as_str());
    for s in &j.sources {
        println!("  from   {}", clean(s));
    }
    println!("  to     {}", clean(&j.dest));
    println!(
        "  owner  {}, priority {}, sync {}",
        clean(&j.owner),
        j.priority,
        j.sync.as_str()
    );
    if !j.label.is_empty() {
        println!("  label  {}", clean(&j.label));
    }
    println!("  files  {} of {}", j.files_done, j.files_total);
    println!(
        "  bytes  {} of {} ({:.1}%), {}/s{}",
        human_bytes(j.bytes_done),
        human_bytes(j.bytes_total),
        percent(j),
        human_bytes(j.rate as u64),
        eta.map_or(String::new(), |s| format!(", ETA {s} s"))
    );
    println!("  attempts {}", j.attempts);
    if let Some(e) = &j.last_error {
        println!("  last error: {}", clean(e));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_without_a_port_gets_the_default() {
        assert_eq!(with_port("dtn1"), "dtn1:7080");
        assert_eq!(with_port("dtn1:9000"), "dtn1:9000");
        assert_eq!(with_port("[::1]:9000"), "[::1]:9000");
        assert_eq!(with_port("::1"), "[::1]:7080");
    }

    #[test]
    fn deadlines_are_durations_or_unix_seconds() {
        assert_eq!(deadline("@1700000000").unwrap(), 1_700_000_000);
        let d = deadline("1h").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!((d - now - 3600).abs() <= 2);
        assert!(deadline("soon").is_err());
        assert!(deadline("@x").is_err());
    }
}
