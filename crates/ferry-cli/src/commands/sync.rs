//! `ferry sync SOURCE DEST`: make DEST a copy of SOURCE, one of them on a server.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use ferry_net::sync::{Plan, SyncReport};

use crate::args::SyncArgs;
use crate::config::SyncJob;
use crate::error::usage;
use crate::progress::Progress;

pub async fn run(args: SyncArgs, quiet: bool) -> Result<ExitCode> {
    let job = SyncJob::new(args).map_err(usage)?;
    let progress = Arc::new(Progress::new(quiet || job.json || job.opts.dry_run));
    let result = ferry_net::sync::sync(
        &job.client,
        &job.direction,
        &job.filter,
        job.opts,
        progress.clone(),
    )
    .await;
    progress.finish();
    let report = result.map_err(super::transfer::failure)?;
    if job.opts.dry_run {
        print_plan(&report.plan, job.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let transfer_errors = report.transfer.iter().flat_map(|t| t.errors.iter());
    for e in transfer_errors.filter(|e| !progress.was_shown(e)) {
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
    let mut s = match &r.transfer {
        Some(t) => super::transfer::summary_line(t),
        None => "sync: nothing to send".to_owned(),
    };
    s.push_str(&format!(", {} unchanged", r.plan.unchanged));
    if !r.plan.delete.is_empty() {
        if r.transfer.as_ref().is_some_and(|t| !t.is_success()) {
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
