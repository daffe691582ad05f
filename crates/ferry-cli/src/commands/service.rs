//! `ferry service`: the transfer service daemon (ferry-service), until SIGTERM or ctrl-c.

use std::process::ExitCode;

use anyhow::{Context, Result};
use ferry_service::{Limits, Service, ServiceConfig};

use crate::error::usage;
use crate::service_args::ServiceArgs;

pub async fn run(args: ServiceArgs, quiet: bool) -> Result<ExitCode> {
    let state = match args.state {
        Some(d) => d,
        None => crate::state::state_dir().map_err(usage)?.join("service"),
    };
    let mut cfg = ServiceConfig::new(args.listen, &state);
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
    let tokens = cfg
        .tokens
        .clone()
        .unwrap_or_else(|| state.join(ferry_service::service::TOKENS_FILE));
    let service = Service::bind(cfg)
        .await
        .map_err(|e| usage(anyhow::Error::new(e)))
        .context("starting the service")?;
    let addr = service.local_addr()?;
    if !quiet {
        eprintln!("ferry: service on {addr}, state in {}", state.display());
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
