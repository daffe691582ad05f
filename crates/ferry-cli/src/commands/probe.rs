//! `ferry probe host|disk`: reports on stdout (text, or JSON with `--json`), progress on stderr.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_probe::ProbeProgress;

use crate::args::ProbeCommand;

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
            let mut opts = if a.quick {
                ferry_probe::host::HostOptions::quick()
            } else {
                Default::default()
            };
            opts.rtt_ms = a.rtt_ms;
            opts.target_mbps = a.target_mbps;
            let report =
                tokio::task::spawn_blocking(move || ferry_probe::host::probe_host(&opts, &steps))
                    .await?;
            (
                report.render_text(),
                a.json
                    .then(|| serde_json::to_string_pretty(&report))
                    .transpose()?,
            )
        }
        ProbeCommand::Disk(a) => {
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
            let report = tokio::task::spawn_blocking(move || {
                ferry_probe::disk::probe_disk(&path, &opts, &steps)
            })
            .await?
            .with_context(|| format!("probing {}", a.path.display()))?;
            (
                report.render_text(),
                a.json
                    .then(|| serde_json::to_string_pretty(&report))
                    .transpose()?,
            )
        }
    };
    match json {
        Some(j) => println!("{j}"),
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
