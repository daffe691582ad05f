//! `ferry ls HOST[:PORT]:PATH`: one remote directory, as `ls -l` would show it.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::args::LsArgs;
use crate::config::Listing;
use crate::error::usage;

pub async fn run(args: LsArgs, quiet: bool) -> Result<ExitCode> {
    let Listing {
        remote,
        client: cfg,
        json,
    } = Listing::new(&args).map_err(usage)?;
    let entries = ferry_net::client::list(&cfg, &remote.path, &Notices(quiet))
        .await
        .context("listing failed")?;
    if json {
        let v: Vec<_> = entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "name": e.name, "kind": format!("{:?}", e.kind).to_lowercase(),
                    "size": e.size, "mode": e.mode, "mtime_ns": e.mtime_ns,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for e in &entries {
            let kind = match e.kind {
                ferry_proto::EntryKind::Dir => 'd',
                ferry_proto::EntryKind::Symlink => 'l',
                ferry_proto::EntryKind::File => '-',
                ferry_proto::EntryKind::Other => '?',
            };
            let suffix = if kind == 'd' { "/" } else { "" };
            // A name is whatever the server sent: escaped, it cannot drive the terminal.
            println!(
                "{kind}{} {:>14} {} {}{suffix}",
                mode_string(e.mode),
                e.size,
                utc(e.mtime_ns),
                crate::output::clean(&e.name)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// For commands without a progress bar: warnings (such as a newly pinned server key) only.
struct Notices(bool);

impl ferry_core::Reporter for Notices {
    fn on_warning(&self, msg: &str) {
        if !self.0 {
            eprintln!("warning: {}", crate::output::clean(msg));
        }
    }

    fn on_retry(&self, attempt: u32, wait: std::time::Duration, error: &str) {
        if !self.0 {
            eprintln!(
                "warning: attempt {attempt} failed: {}; retrying in {} s",
                crate::output::clean(error),
                wait.as_secs()
            );
        }
    }
}

fn mode_string(mode: u32) -> String {
    let mut s = String::with_capacity(9);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
fn utc(ns: i64) -> String {
    ferry_probe::net::utc_text(ns.div_euclid(1_000_000_000), ' ')
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_formats() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::utc(1_700_000_000_000_000_000), "2023-11-14 22:13:20");
        assert_eq!(super::mode_string(0o754), "rwxr-xr--");
    }
}
