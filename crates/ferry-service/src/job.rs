//! What a job is: its kind, where it reads and writes, how it compares what exists, and the
//! state it is in. Plain values shared by the store, the scheduler and the API.

use serde::{Deserialize, Serialize};

use crate::error::ServiceError;

/// Longest label, source or destination accepted, in bytes (Linux's PATH_MAX for paths).
pub const MAX_LABEL: usize = 256;
pub const MAX_PATH: usize = 4096;
/// Most sources one job may name.
pub const MAX_SOURCES: usize = 1000;

/// Which way the bytes go, seen from the service's host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Local files or trees to a server.
    Put,
    /// From a server to a local directory.
    Get,
    /// From one server to another (third-party copy: the data never passes the service).
    Cp,
}

/// How a job compares files that already exist at the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// A plain put/get/cp: an existing file of the same size and mtime is proven by digest
    /// (how a rerun resumes), any other existing file fails.
    #[default]
    Off,
    /// Files of the same size are left alone unread, others replaced.
    Size,
    /// `ferry sync`: files of the same size and mtime are left alone unread, others replaced.
    Mtime,
    /// `ferry sync --checksum`: every file compared by digest, those that differ replaced.
    Checksum,
}

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Queued,
    Running,
    Done,
    Failed,
    Cancelled,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Queued,
        State::Running,
        State::Done,
        State::Failed,
        State::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Done, failed or cancelled: nothing more happens to the job.
    pub fn is_final(self) -> bool {
        matches!(self, State::Done | State::Failed | State::Cancelled)
    }
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Put => "put",
            Kind::Get => "get",
            Kind::Cp => "cp",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Kind::Put, Kind::Get, Kind::Cp]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

impl SyncMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Off => "off",
            SyncMode::Size => "size",
            SyncMode::Mtime => "mtime",
            SyncMode::Checksum => "checksum",
        }
    }

    /// The CLI's and the API's spelling.
    pub fn parse(s: &str) -> Result<Self, ServiceError> {
        match s {
            "off" => Ok(SyncMode::Off),
            "size" => Ok(SyncMode::Size),
            "mtime" => Ok(SyncMode::Mtime),
            "checksum" => Ok(SyncMode::Checksum),
            other => Err(ServiceError::Invalid(format!(
                "sync mode {other:?}: expected size, mtime or checksum"
            ))),
        }
    }
}

/// A job as submitted: what the store records before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewJob {
    pub kind: Kind,
    pub sources: Vec<String>,
    pub dest: String,
    pub sync: SyncMode,
    /// Higher runs first.
    pub priority: i64,
    /// Unix seconds after which the job is no longer started (it fails instead).
    pub deadline: Option<i64>,
    pub label: String,
    /// The name of the token that submitted it.
    pub owner: String,
    /// The server whose per-server limit the job counts against (the destination's, or the
    /// source's for a get).
    pub server: String,
}

impl NewJob {
    /// Refuses what the store would not hold: no source, too many, paths or label too long.
    pub fn check(&self) -> Result<(), ServiceError> {
        let bad = |m: String| Err(ServiceError::Invalid(m));
        if self.sources.is_empty() {
            return bad("a job needs at least one source".into());
        }
        if self.sources.len() > MAX_SOURCES {
            return bad(format!(
                "{} sources; at most {MAX_SOURCES} a job",
                self.sources.len()
            ));
        }
        for p in self.sources.iter().chain([&self.dest]) {
            if p.is_empty() || p.len() > MAX_PATH || p.contains('\0') {
                return bad(format!(
                    "path {:?}: must be 1 to {MAX_PATH} bytes without NUL",
                    truncate(p)
                ));
            }
        }
        if self.label.len() > MAX_LABEL {
            return bad(format!(
                "label is {} bytes; at most {MAX_LABEL}",
                self.label.len()
            ));
        }
        Ok(())
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A job as the store holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub kind: Kind,
    pub sources: Vec<String>,
    pub dest: String,
    pub sync: SyncMode,
    pub priority: i64,
    pub deadline: Option<i64>,
    pub label: String,
    pub owner: String,
    pub server: String,
    pub state: State,
    /// Runs started so far (a retry or a restart after a crash adds one).
    pub attempts: u32,
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Bytes per second over the last progress interval.
    pub rate: f64,
    pub last_error: Option<String>,
    /// Unix milliseconds.
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// Not started before this (a retry's backoff), unix milliseconds.
    pub not_before_ms: i64,
    /// The service that runs it, or ran it last (several may share a PostgreSQL queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
}

/// A running job's counters, as the reporter last saw them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    pub files_done: u64,
    pub files_total: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub rate: f64,
}

/// Now as unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
