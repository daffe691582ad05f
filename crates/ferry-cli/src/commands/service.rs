//! `ferry service`: the transfer service daemon (ferry-service), until SIGTERM or ctrl-c.

use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_service::notify::Notifications;
use ferry_service::prober::ProbeSchedule;
use ferry_service::{Limits, Service, ServiceConfig};
use ferry_units::units::parse_duration;

use crate::error::usage;
use crate::service_args::ServiceArgs;

pub async fn run(args: ServiceArgs, quiet: bool) -> Result<ExitCode> {
    let state = match args.state {
        Some(d) => d,
        None => crate::state::state_dir().map_err(usage)?.join("service"),
    };
    let mut cfg = ServiceConfig::new(args.listen, &state);
    cfg.store = args
        .store
        .as_deref()
        .map(ferry_catalog::Location::parse)
        .transpose()
        .context("--store")
        .map_err(usage)?;
    cfg.name = args.name;
    // Shown with its password hidden.
    let store_location = cfg.store.as_ref().map(ToString::to_string);
    cfg.tokens = args.tokens;
    cfg.endpoints = args.endpoints;
    cfg.admins = args.admins;
    cfg.local_root = args.local_root;
    cfg.limits = Limits {
        per_server: usize::from(args.per_server),
        total: usize::from(args.max_jobs),
        max_attempts: args.max_attempts,
        ..Limits::default()
    };
    cfg.probe = probe_schedule(args.probe_every.as_deref(), &args.probe_duration)?;
    cfg.notify = Notifications {
        command: args.on_end_command.map(|p| {
            let mut argv = vec![p];
            argv.extend(args.on_end_args);
            argv
        }),
        command_limit: parse_duration(&args.on_end_timeout)
            .context("--on-end-timeout")
            .map_err(usage)?,
        webhook: args.on_end_webhook,
        webhook_ca: args.on_end_webhook_ca,
        ..Notifications::default()
    };
    let tokens = cfg
        .tokens
        .clone()
        .unwrap_or_else(|| state.join(ferry_service::service::TOKENS_FILE));
    // A daemon: its pool of block buffers bounded, not grown to its largest burst.
    ferry_core::buf::set_idle_limit(ferry_service::service::IDLE_POOL);
    let service = Service::bind(cfg)
        .await
        .map_err(|e| usage(anyhow::Error::new(e)))
        .context("starting the service")?;
    let addr = service.local_addr()?;
    if !quiet {
        eprintln!("ferry: service on {addr}, state in {}", state.display());
        let store = service.scheduler().store();
        match &store_location {
            Some(l) if store.is_shared() => eprintln!(
                "ferry: job queue {l} (shared; this service is {:?})",
                store.name()
            ),
            Some(l) => eprintln!("ferry: job queue {l}"),
            None => {}
        }
        eprintln!("ferry: certificate fingerprint {}", service.fingerprint());
        let empty = ferry_net::access::load(&tokens).is_ok_and(|f| f.tokens.is_empty());
        if empty {
            eprintln!(
                "ferry: no tokens in {}: add one with `ferry token add --tokens {} NAME`",
                tokens.display(),
                tokens.display()
            );
        }
    }
    service.run(super::serve::shutdown_signal()).await;
    if !quiet {
        eprintln!("ferry: service stopped");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--probe-every` and `--probe-duration`: no schedule without the first.
fn probe_schedule(every: Option<&str>, duration: &str) -> Result<Option<ProbeSchedule>> {
    let Some(every) = every else {
        return Ok(None);
    };
    let every = parse_duration(every)
        .context("--probe-every")
        .map_err(usage)?;
    let duration = parse_duration(duration)
        .context("--probe-duration")
        .map_err(usage)?;
    let (lo, hi) = (
        ferry_net::speedtest::MIN_PROBE_DURATION,
        ferry_net::speedtest::MAX_PROBE_DURATION,
    );
    if !(lo..=hi).contains(&duration) {
        return Err(usage(anyhow::anyhow!(
            "--probe-duration: a probe runs {} ms to {} s",
            lo.as_millis(),
            hi.as_secs()
        )));
    }
    if every < duration {
        return Err(usage(anyhow::anyhow!(
            "--probe-every must be at least --probe-duration"
        )));
    }
    Ok(Some(ProbeSchedule { every, duration }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_probe_schedule_needs_an_interval_and_a_duration_a_probe_can_run() {
        assert!(probe_schedule(None, "2s").unwrap().is_none());
        let s = probe_schedule(Some("30m"), "2s").unwrap().unwrap();
        assert_eq!(
            (s.every, s.duration),
            (Duration::from_secs(1800), Duration::from_secs(2))
        );
        assert!(probe_schedule(Some("soon"), "2s").is_err());
        let e = probe_schedule(Some("30m"), "1h").unwrap_err();
        assert!(format!("{e:#}").contains("100 ms to 30 s"), "{e:#}");
        assert!(probe_schedule(Some("1s"), "5s").is_err());
    }
}
