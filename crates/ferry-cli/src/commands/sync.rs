//! `ferry sync SOURCE DEST`: make DEST a copy of SOURCE, one of them on a server, or both
//! (a third-party copy of what changed).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use ferry_net::sync::{Plan, SyncReport};

use super::transfer::{policy_checksum, start_oneshot};
use crate::args::SyncArgs;
use crate::config::{SyncEnds, SyncJob};
use crate::error::usage;
use crate::progress::Progress;

pub async fn run(args: SyncArgs, quiet: bool) -> Result<ExitCode> {
    let mut job = SyncJob::new(args).map_err(usage)?;
    // Held for the whole sync: each ssh-started server serves until its channel closes.
    let mut sessions = Vec::new();
    let [src_ssh, dest_ssh] = job.ssh.clone();
    match &mut job.ends {
        SyncEnds::One { client, .. } => {
            for remote in [src_ssh, dest_ssh].iter().flatten() {
                sessions.extend(start_oneshot(client, remote, &job.conn, false).await?);
            }
        }
        SyncEnds::Between { copy, .. } => {
            if let Some(remote) = &src_ssh {
                sessions.extend(start_oneshot(&mut copy.source, remote, &job.conn, true).await?);
            }
            if let Some(remote) = &dest_ssh {
                sessions.extend(start_oneshot(&mut copy.dest, remote, &job.conn, true).await?);
            }
        }
    }
    let progress = Arc::new(Progress::new(quiet || job.json || job.opts.dry_run));
    let result = match &mut job.ends {
        SyncEnds::One { client, direction } => {
            let reporter = progress.clone();
            let mut r =
                ferry_net::sync::sync(client, direction, &job.filter, job.opts, reporter).await;
            // As put: the server's policy registers another digest than the default, and
            // refused the sync's put before any data moved: sync again with the policy's.
            let chosen = job.checksum_chosen;
            if let Some(want) = policy_checksum(&r, chosen, client.opts.checksum) {
                if !quiet {
                    eprintln!(
                        "note: the server's policy registers {} digests there: syncing with --digest {0}",
                        ferry_core::digest::algo_name(want)
                    );
                }
                client.opts.checksum = want;
                let reporter = progress.clone();
                r = ferry_net::sync::sync(client, direction, &job.filter, job.opts, reporter).await;
            }
            r
        }
        SyncEnds::Between { copy, src, dest } => {
            let (ends, reporter) = ((src.as_str(), dest.as_str()), progress.clone());
            ferry_net::sync::sync_between(copy, ends, &job.filter, job.opts, reporter).await
        }
    };
    progress.finish();
    for o in sessions {
        o.finish().await;
    }
    let report = result.map_err(super::transfer::failure)?;
    if job.opts.dry_run {
        print_plan(&report.plan, job.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let transfer_errors = report.transfer.iter().flat_map(|t| t.errors.iter());
    let copy_errors = report.copy.iter().flat_map(|c| c.errors.iter());
    for e in transfer_errors
        .chain(copy_errors)
        .filter(|e| !progress.was_shown(e))
    {
        eprintln!("error: {}", crate::output::clean(e));
    }
    for e in &report.delete_errors {
        eprintln!("error: {}", crate::output::clean(e));
    }
    if job.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !quiet {
        eprintln!("{}", summary(&report));
    }
    Ok(if report.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// A dry run's output, on stdout: `send PATH` and `delete PATH` lines, or the plan as JSON.
fn print_plan(plan: &Plan, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(plan)?);
        return Ok(());
    }
    for p in &plan.send {
        println!("send {p}");
    }
    for p in &plan.delete {
        println!("delete {p}");
    }
    Ok(())
}

/// One line for people: the transfer's own summary (if one ran), what was left alone, what
/// was removed, and what was not because the transfer failed.
fn summary(r: &SyncReport) -> String {
    let mut s = match (&r.transfer, &r.copy) {
        (Some(t), _) => super::transfer::summary_line(t),
        (None, Some(c)) => super::cp::summary_line(c),
        (None, None) => "sync: nothing to send".to_owned(),
    };
    s.push_str(&format!(", {} unchanged", r.plan.unchanged));
    if !r.plan.delete.is_empty() {
        if !r.sent_all() {
            s.push_str(&format!(
                ", {} NOT deleted (the transfer failed)",
                r.plan.delete.len()
            ));
        } else {
            s.push_str(&format!(", {} deleted", r.deleted));
        }
    }
    s
}
