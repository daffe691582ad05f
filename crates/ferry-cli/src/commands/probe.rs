//! `ferry probe host|disk|net`: reports on stdout (text, or JSON with `--json`), progress on
//! stderr.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_net::speedtest::{ProbeDirection, ProbePoint, MAX_PROBE_DURATION};
use ferry_probe::net::{NetOptions, NetReport, NetSample};
use ferry_probe::ProbeProgress;
use ferry_units::units::parse_size;

use crate::args::{ProbeCommand, ProbeDiskArgs, ProbeHostArgs, ProbeNetArgs};
use crate::error::usage;
use crate::remote::Remote;

/// Step names on stderr, only for a person watching a terminal.
struct Steps {
    show: bool,
}

impl ProbeProgress for Steps {
    fn on_step(&self, what: &str) {
        if self.show {
            eprintln!("probing: {what}");
        }
    }
}

pub async fn run(cmd: ProbeCommand, quiet: bool) -> Result<ExitCode> {
    let steps = Steps {
        show: !quiet && std::io::stderr().is_terminal(),
    };
    let (text, json) = match cmd {
        ProbeCommand::Host(a) => {
            let json = a.output.json;
            let report = host(a, steps).await?;
            (report.render_text(), to_json(json, &report)?)
        }
        ProbeCommand::Net(a) => {
            let json = a.output.json;
            let report = net(*a, steps, quiet).await?;
            (report.render_text(), to_json(json, &report)?)
        }
        ProbeCommand::Disk(a) => {
            let json = a.output.json;
            let report = disk(a, steps).await?;
            (report.render_text(), to_json(json, &report)?)
        }
    };
    match json {
        Some(j) => println!("{j}"),
        None => println!("{}", text.strip_suffix('\n').unwrap_or(&text)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The report as JSON, if asked for.
fn to_json(json: bool, report: &impl serde::Serialize) -> Result<Option<String>> {
    Ok(json
        .then(|| serde_json::to_string_pretty(report))
        .transpose()?)
}

/// `ferry probe host`: measured on a blocking thread.
async fn host(a: ProbeHostArgs, steps: Steps) -> Result<ferry_probe::host::HostReport> {
    let mut opts = if a.quick {
        ferry_probe::host::HostOptions::quick()
    } else {
        Default::default()
    };
    opts.rtt_ms = a.rtt_ms;
    opts.target_mbps = a.target_mbps;
    Ok(tokio::task::spawn_blocking(move || ferry_probe::host::probe_host(&opts, &steps)).await?)
}

/// `ferry probe disk PATH`: measured on a blocking thread, saved as the file system's profile
/// unless `--no-save`.
async fn disk(a: ProbeDiskArgs, steps: Steps) -> Result<ferry_probe::disk::DiskReport> {
    let mut opts = if a.quick {
        ferry_probe::disk::DiskOptions::quick()
    } else if a.full {
        ferry_probe::disk::DiskOptions::full()
    } else {
        Default::default()
    };
    if let Some(n) = a.max_threads {
        opts.max_threads = n.max(1);
    }
    let path = a.path.clone();
    let mut report =
        tokio::task::spawn_blocking(move || ferry_probe::disk::probe_disk(&path, &opts, &steps))
            .await?
            .with_context(|| format!("probing {}", a.path.display()))?;
    if !a.no_save {
        let now = ferry_probe::net::rfc3339(std::time::SystemTime::now());
        if let Some(entry) = report.profile_entry(now) {
            let dir = crate::state::state_dir()?;
            let path = ferry_probe::disk::save_disk_profile(&dir, &a.path, entry)
                .with_context(|| format!("saving the profile in {}", dir.display()))?;
            report.profile = Some(path);
        }
    }
    Ok(report)
}

/// Prints the warnings of a probe session (a server key pinned on first contact).
struct Notices {
    quiet: bool,
}

impl ferry_core::Reporter for Notices {
    fn on_warning(&self, msg: &str) {
        if !self.quiet {
            eprintln!("warning: {msg}");
        }
    }
}

/// `ferry probe net`: the sweep runs on a blocking thread (ferry-probe has no async runtime)
/// and measures each point with `ferry_net::speedtest::run` on this runtime.
async fn net(a: ProbeNetArgs, steps: Steps, quiet: bool) -> Result<ferry_probe::net::NetReport> {
    let remote = Remote::parse_endpoint(&a.endpoint).map_err(usage)?;
    let opts = net_options(&a)?;
    let cfg = crate::config::control_config(
        &a.auth,
        &a.conn,
        &remote,
        std::time::Duration::from_secs(30),
    )
    .map_err(usage)?;
    let notices = Notices {
        quiet: quiet || a.output.json,
    };
    let (mut report, fatal) =
        sweep(cfg, remote.server(), !a.download, opts, steps, notices).await?;
    if report.best.is_none() {
        let why = match fatal {
            Some(e) => anyhow::Error::new(e),
            None => anyhow::anyhow!(
                "{}",
                report
                    .points
                    .iter()
                    .flat_map(|p| p.errors.first())
                    .next()
                    .cloned()
                    .unwrap_or_else(|| "nothing was measured".into())
            ),
        };
        return Err(why.context(format!("probing {}", report.endpoint)));
    }
    if !a.no_save {
        let entry = report.profile_entry(ferry_probe::net::rfc3339(std::time::SystemTime::now()));
        if let Some(entry) = entry {
            let dir = crate::state::state_dir()?;
            let path = ferry_probe::net::save_profile(&dir, &report.endpoint, entry)
                .with_context(|| format!("saving the profile in {}", dir.display()))?;
            report.profile = Some(path);
        }
    }
    Ok(report)
}

/// The sweep `probe net`'s options ask for: points, their length, the socket buffers.
fn net_options(a: &ProbeNetArgs) -> Result<NetOptions> {
    let mut opts = if a.quick {
        NetOptions::quick()
    } else {
        NetOptions::default()
    };
    opts.full = a.full;
    if let Some(s) = a.seconds {
        if !(0.5..=MAX_PROBE_DURATION.as_secs_f64()).contains(&s) {
            return Err(usage(anyhow::anyhow!(
                "--seconds must be between 0.5 and {}",
                MAX_PROBE_DURATION.as_secs()
            )));
        }
        opts.seconds = s;
        opts.skip = opts.skip.min(s / 4.0);
    }
    if let Some(s) = a.skip {
        if !(0.0..opts.seconds).contains(&s) {
            return Err(usage(anyhow::anyhow!(
                "--skip must be at least 0 and less than --seconds"
            )));
        }
        opts.skip = s;
    }
    if let Some(r) = a.runs {
        opts.runs = r.clamp(1, 20);
    }
    let max_streams = a.max_streams.clamp(1, ferry_proto::MAX_STREAMS);
    opts.streams.retain(|&n| n <= max_streams);
    if opts.streams.last() != Some(&max_streams) && !a.quick {
        opts.streams.push(max_streams);
    }
    if !a.quick {
        opts.windows = vec![0];
        if a.windows.trim() != "none" {
            for w in a.windows.split(',').filter(|w| !w.trim().is_empty()) {
                let n = parse_size(w).map_err(|e| usage(e.into()))?;
                if n == 0 || n > u64::from(u32::MAX / 2) {
                    return Err(usage(anyhow::anyhow!(
                        "--windows: {w} is out of range (1 byte to 2G)"
                    )));
                }
                opts.windows.push(n as u32);
            }
        }
    }
    Ok(opts)
}

/// Measures every point of `opts` against `endpoint`, on a blocking thread. An error that a
/// retry cannot fix (wrong token, TLS, a changed server key) ends the sweep and is returned
/// beside the report: every further point would fail the same way, and the server brakes
/// logins.
async fn sweep(
    cfg: ferry_net::ClientConfig,
    endpoint: String,
    upload: bool,
    opts: NetOptions,
    steps: Steps,
    notices: Notices,
) -> Result<(NetReport, Option<ferry_net::SessionError>)> {
    let direction = if upload {
        ProbeDirection::ClientToServer
    } else {
        ProbeDirection::ServerToClient
    };
    let handle = tokio::runtime::Handle::current();
    let tcp = ferry_probe::net::local_tcp_settings();
    Ok(tokio::task::spawn_blocking(move || {
        let mut fatal: Option<ferry_net::SessionError> = None;
        let report = ferry_probe::net::probe_net(&endpoint, upload, &opts, tcp, &steps, |p| {
            if let Some(e) = &fatal {
                return Err(e.to_string());
            }
            let point = ProbePoint {
                direction,
                streams: p.streams,
                duration: std::time::Duration::from_secs_f64(p.seconds),
                window: p.window,
            };
            match handle.block_on(ferry_net::speedtest::run(&cfg, &point, &notices)) {
                Ok(r) => Ok(sample(&r, p.skip)),
                Err(e) => {
                    let msg = e.to_string();
                    if !e.is_retryable() {
                        fatal = Some(e);
                    }
                    Err(msg)
                }
            }
        });
        (report, fatal)
    })
    .await?)
}

/// One point's measurement as the sweep records it, leaving out the first `skip` seconds
/// (slow start) from the rate.
fn sample(r: &ferry_net::speedtest::ProbeResult, skip: f64) -> NetSample {
    NetSample {
        streams: r.streams,
        rate_mbps: r.rate_mbps(std::time::Duration::from_secs_f64(skip)),
        sent_bytes: r.sent_bytes,
        received_bytes: r.received_bytes,
        rtt_idle_ms: f64::from(if r.rtt_idle_min_us > 0 {
            r.rtt_idle_min_us
        } else {
            r.rtt_idle_us
        }) / 1000.0,
        rtt_load_ms: r.rtt_load_ms(),
        cwnd_bytes: r.cwnd_bytes(),
        retransmits: r.retransmits(),
        mss: r.per_stream.first().map_or(0, |s| s.snd_mss),
    }
}
