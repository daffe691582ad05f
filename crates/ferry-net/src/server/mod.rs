//! The daemon: one port for control and data connections, a connection cap, timeouts on every
//! wait, and graceful shutdown.
//!
//! Layers, each importing only those below it: `listener` accepts and hands each connection
//! to `session` (TLS, `Hello`, login, then the transfer), which takes its request from
//! `request` (scopes, limits; a network probe in `measure`). Data connections find their
//! session in `registry`. `admission` bounds who gets in, `access` says what a token may
//! touch, `state` is what all connections share. Third-party copies: `grants` (the
//! destination's side) and `copy` (the source's, which runs the client's put to the other
//! server). A striped put's other hosts: `stripe` (blocks into the coordinator's partial
//! copies, each reported `Landed`). `policy` holds the server's declarative policies per
//! prefix and `replicate` makes the replicas they owe in the background. `catalog` registers every file a put stores and
//! reconciles a crash's leftovers; `catalog_ops` serves a user's catalog requests (stat, rm,
//! mv, mkdir, meta, find), several on one connection in `catalog_session`, their file-system half in `files`, `verify` its fixity audits
//! (`ferry verify`) and `bundle` a tree streamed as a tar (`get --tar`). `metrics`
//! counts sessions, bytes and refusals for a scraper.

pub mod access;
mod admission;
mod bundle;
mod catalog;
mod catalog_ops;
mod catalog_session;
mod config;
mod copy;
mod files;
mod grants;
mod listener;
mod measure;
mod metrics;
mod policy;
mod registry;
mod remove;
mod replicate;
mod request;
mod session;
mod state;
mod stripe;
mod verify;
mod wire;

pub use config::ServerConfig;
pub use listener::Server;
pub use metrics::MetricsView;
pub use policy::{Peer, Policies, Policy, PolicyError};
pub use state::IdleProbe;
