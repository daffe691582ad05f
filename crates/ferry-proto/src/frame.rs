//! The frames that travel on ferry's connections.
//!
//! Every frame on the wire is `type: u8 | len: u32 (big endian) | payload[len]`. The payload layout
//! of each type is written down in `docs/PROTOCOL.md`; `Frame::decode` is its only reader.

use bytes::Bytes;

use crate::catalog::{CatalogAnswer, CatalogRequest};

/// Bytes every ferry connection starts its `Hello` with, so that a stray client (an HTTP probe, a
/// port scanner) is recognised and dropped at its first frame instead of being parsed further.
pub const MAGIC: [u8; 8] = *b"FERRY\r\n\x1a";

/// The protocol version this build speaks. Bumped on any incompatible change to a frame layout.
pub const PROTOCOL_VERSION: u16 = 7;

/// Size of the fixed frame header: type (1) and payload length (4).
pub const HEADER_LEN: usize = 5;

/// Largest payload of any frame but `Block`. Control frames are small; a bound this low means a
/// peer cannot make us allocate much before it has authenticated.
pub const MAX_CONTROL_PAYLOAD: u32 = 1 << 20;

/// Largest block of file data one frame may carry (64 MiB, the largest `--block-size`).
pub const MAX_BLOCK_DATA: u32 = 64 << 20;

/// Largest `Block` payload: the data plus its header fields (path, digests).
pub const MAX_BLOCK_PAYLOAD: u32 = MAX_BLOCK_DATA + (64 << 10);

/// Longest relative path, in bytes, that a frame may name (Linux PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// Longest free-text message (errors) in bytes.
pub const MAX_MESSAGE: usize = 4096;

/// Longest file digest in bytes (SHA-256 and BLAKE3 are 32; room for 64-byte digests).
pub const MAX_DIGEST: usize = 64;

/// Most entries one `ListEntries` frame may hold; longer listings are split over several frames.
pub const MAX_LIST_ENTRIES: usize = 1024;

/// Most files one `Offer` or `Decisions` frame may name; longer runs use several frames.
pub const MAX_OFFER_ENTRIES: usize = 256;

/// Most byte ranges one `Decision::Resume` may list. A receiver whose partial file is more
/// fragmented lists the first ones; the sender sends the rest again, which is safe.
pub const MAX_RESUME_RANGES: usize = 1024;

/// Longest token, in bytes.
pub const MAX_TOKEN: usize = 256;

/// Most data connections one transfer may open. Beyond this, more streams only add contention.
pub const MAX_STREAMS: u16 = 256;

/// Smallest block size: below a page, per-frame overhead and syscalls dominate.
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;

/// The smallest block size a receiver may grant when it lowers the one asked for (for its
/// memory), unless the sender asked for less. Blocks sent before the grant is known (early
/// blocks) are at most this long, so that no grant can make them too large.
pub const MIN_GRANTED_BLOCK: u32 = 1 << 20;

/// Most tuner steps one `Tuned` frame may carry (the tuner keeps 64).
pub const MAX_TUNE_STEPS: usize = 64;
/// Most per-interval byte counts one `ProbeResult` may carry (a 30 s probe in 100 ms buckets,
/// plus its drain, needs about 350).
pub const MAX_PROBE_INTERVALS: usize = 1024;

/// Most data addresses one `Paths` frame may list.
pub const MAX_PATHS: usize = 64;

/// Longest server address (`host:port`) a `CopyRequest` or `Paths` may name.
pub const MAX_ADDR: usize = 1024;

/// Longest transfer report (JSON) a `CopyDone` may carry; a source server leaves out what
/// does not fit (the per-file manifest first).
pub const MAX_REPORT: usize = 512 << 10;

/// Most paths one `RemoveRequest` may name (and so most failures one `Removed` lists): at
/// the longest paths, 128 of them still fit a control frame.
pub const MAX_REMOVE_PATHS: usize = 128;

/// Most paths one `CopyPaths` frame may name; a sender also keeps each frame within
/// [`MAX_CONTROL_PAYLOAD`].
pub const MAX_COPY_PATHS: usize = 1024;

/// Most bytes of paths all the `CopyPaths` of one copy may name together: what a source server
/// holds in memory for a sync's set of changed files (about a million paths of 64 bytes).
pub const MAX_COPY_SET: usize = 64 << 20;

/// Most BLAKE3 chaining values one `Landed` carries: a block cut on 1 KiB chunk edges splits
/// into at most two subtrees per power of two of its length, 33 for the largest block.
pub const MAX_LANDED_CVS: usize = 64;

/// Frame type byte. Values are part of the protocol and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameType(pub u8);

impl FrameType {
    pub const HELLO: Self = Self(0x01);
    pub const WELCOME: Self = Self(0x02);
    pub const ERROR: Self = Self(0x03);
    pub const PUT_REQUEST: Self = Self(0x10);
    pub const GET_REQUEST: Self = Self(0x11);
    pub const LIST_REQUEST: Self = Self(0x12);
    pub const READY: Self = Self(0x13);
    pub const LIST_ENTRIES: Self = Self(0x14);
    pub const LIST_END: Self = Self(0x15);
    pub const BLOCK: Self = Self(0x20);
    pub const DIR: Self = Self(0x21);
    pub const SYMLINK: Self = Self(0x22);
    pub const SENT: Self = Self(0x30);
    pub const RESEND: Self = Self(0x31);
    pub const SKIPPED: Self = Self(0x32);
    pub const FILE_FAILED: Self = Self(0x33);
    pub const COMPLETE: Self = Self(0x34);
    pub const OFFER: Self = Self(0x35);
    pub const DECISIONS: Self = Self(0x36);
    pub const ENTRY_FAILED: Self = Self(0x37);
    pub const TUNED: Self = Self(0x38);
    pub const PROBE_REQUEST: Self = Self(0x16);
    pub const PROBE_RESULT: Self = Self(0x17);
    pub const PROBE_DATA: Self = Self(0x23);
    pub const GRANT_REQUEST: Self = Self(0x18);
    pub const GRANTED: Self = Self(0x19);
    pub const COPY_REQUEST: Self = Self(0x1A);
    pub const PATHS: Self = Self(0x1B);
    pub const COPY_PROGRESS: Self = Self(0x39);
    pub const COPY_DONE: Self = Self(0x3A);
    pub const STRIPE_REQUEST: Self = Self(0x1C);
    pub const LANDED: Self = Self(0x3B);
    pub const REMOVE_REQUEST: Self = Self(0x1D);
    pub const REMOVED: Self = Self(0x3C);
    pub const COPY_PATHS: Self = Self(0x24);
    pub const CATALOG_REQUEST: Self = Self(0x1E);
    pub const CATALOG_ANSWER: Self = Self(0x3D);
    pub const TAR_DATA: Self = Self(0x3E);
    pub const FILE_DIGEST: Self = Self(0x3F);
    pub const STRIPE_READ: Self = Self(0x1F);
    pub const FETCH: Self = Self(0x25);
    pub const STRIPE_GRANT_REQUEST: Self = Self(0x26);
    pub const READ_GRANT_REQUEST: Self = Self(0x27);

    /// The largest payload a frame of this type may declare, or `None` for an unknown type.
    /// Checked on the header alone, before any payload is read or allocated.
    pub fn max_payload(self) -> Option<u32> {
        match self {
            Self::BLOCK => Some(MAX_BLOCK_PAYLOAD),
            Self::HELLO
            | Self::WELCOME
            | Self::ERROR
            | Self::PUT_REQUEST
            | Self::GET_REQUEST
            | Self::LIST_REQUEST
            | Self::READY
            | Self::LIST_ENTRIES
            | Self::LIST_END
            | Self::DIR
            | Self::SYMLINK
            | Self::SENT
            | Self::RESEND
            | Self::SKIPPED
            | Self::FILE_FAILED
            | Self::COMPLETE
            | Self::OFFER
            | Self::DECISIONS
            | Self::ENTRY_FAILED
            | Self::TUNED
            | Self::PROBE_REQUEST
            | Self::PROBE_RESULT
            | Self::PROBE_DATA
            | Self::GRANT_REQUEST
            | Self::GRANTED
            | Self::COPY_REQUEST
            | Self::PATHS
            | Self::COPY_PROGRESS
            | Self::COPY_DONE
            | Self::STRIPE_REQUEST
            | Self::LANDED
            | Self::REMOVE_REQUEST
            | Self::REMOVED
            | Self::COPY_PATHS
            | Self::CATALOG_REQUEST
            | Self::CATALOG_ANSWER
            | Self::TAR_DATA
            | Self::FILE_DIGEST
            | Self::STRIPE_READ
            | Self::FETCH
            | Self::STRIPE_GRANT_REQUEST
            | Self::READ_GRANT_REQUEST => Some(MAX_CONTROL_PAYLOAD),
            _ => None,
        }
    }

    /// Lower-case name for error messages and logs, `"unknown"` for a type this build lacks.
    pub fn name(self) -> &'static str {
        match self {
            Self::HELLO => "hello",
            Self::WELCOME => "welcome",
            Self::ERROR => "error",
            Self::PUT_REQUEST => "put_request",
            Self::GET_REQUEST => "get_request",
            Self::LIST_REQUEST => "list_request",
            Self::READY => "ready",
            Self::LIST_ENTRIES => "list_entries",
            Self::LIST_END => "list_end",
            Self::BLOCK => "block",
            Self::DIR => "dir",
            Self::SYMLINK => "symlink",
            Self::SENT => "sent",
            Self::RESEND => "resend",
            Self::SKIPPED => "skipped",
            Self::FILE_FAILED => "file_failed",
            Self::COMPLETE => "complete",
            Self::OFFER => "offer",
            Self::DECISIONS => "decisions",
            Self::ENTRY_FAILED => "entry_failed",
            Self::TUNED => "tuned",
            Self::PROBE_REQUEST => "probe_request",
            Self::PROBE_RESULT => "probe_result",
            Self::PROBE_DATA => "probe_data",
            Self::GRANT_REQUEST => "grant_request",
            Self::GRANTED => "granted",
            Self::COPY_REQUEST => "copy_request",
            Self::PATHS => "paths",
            Self::COPY_PROGRESS => "copy_progress",
            Self::COPY_DONE => "copy_done",
            Self::STRIPE_REQUEST => "stripe_request",
            Self::LANDED => "landed",
            Self::REMOVE_REQUEST => "remove_request",
            Self::REMOVED => "removed",
            Self::COPY_PATHS => "copy_paths",
            Self::CATALOG_REQUEST => "catalog_request",
            Self::CATALOG_ANSWER => "catalog_answer",
            Self::TAR_DATA => "tar_data",
            Self::FILE_DIGEST => "file_digest",
            Self::STRIPE_READ => "stripe_read",
            Self::FETCH => "fetch",
            Self::STRIPE_GRANT_REQUEST => "stripe_grant_request",
            Self::READ_GRANT_REQUEST => "read_grant_request",
            _ => "unknown",
        }
    }
}

/// Session identifier, chosen by the client in its control `Hello` (with the session's secret)
/// and echoed in `Welcome`; data connections quote both to join.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

/// Identifies one file within a transfer; chosen by the sender, unique per transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u64);

/// With [`Capabilities::RAMP_HELPERS`], the data connections of an auto-tuned session from
/// this index on are ramp helpers (the most an auto-tuned client tunes).
pub const RAMP_HELPERS_FROM: u16 = 16;

/// Capability bits exchanged in `Hello`/`Welcome`; the session uses the intersection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// Receiver can ask for a block again (`Resend`).
    pub const RESEND: u64 = 1 << 0;
    /// Receiver takes `Tuned` before `Complete` (and a later one in its place). A sender
    /// whose peer has it reports its tuner as soon as every block is on a connection, so that
    /// a receiving client can leave once it has sent `Complete` instead of waiting a round
    /// trip for the report: a `get` over 100 ms ended 0.1 s after its files were stored.
    pub const EARLY_TUNED: u64 = 1 << 1;
    /// In an auto-tuned session the client's data connections beyond the first 16
    /// ([`RAMP_HELPERS_FROM`]) are ramp helpers: a sending server lets each carry two blocks at
    /// the start and then parks it, and never counts it among the streams it tunes (the
    /// client opens them only for a path it has measured as long and fast; docs/DESIGN.md).
    pub const RAMP_HELPERS: u64 = 1 << 2;
    /// The client dials its data connections over several network paths (`--multipath`):
    /// the server answers its control `Welcome` with `Paths`, the addresses it takes data
    /// connections on. Not in [`Capabilities::ours`]: a client offers it only when it will
    /// read the frame.
    pub const MULTIPATH: u64 = 1 << 3;
    /// The server takes `StripeRequest`: it writes blocks into partial files another server
    /// of the same shared file system opened (a striped put). A server offers it only when
    /// its operator allowed striping (`serve --stripe`).
    pub const STRIPE: u64 = 1 << 4;
    /// A striped put that stripes every block sent after its file's decision, small files'
    /// and files' last blocks too. Offered by the client of a striped put to its coordinator,
    /// which then gives every file a shared partial copy at its decision (one a stripe host
    /// can open) and takes `FileDigest`, and says so in its `Welcome`; without it in the
    /// `Welcome` those blocks stay on the coordinator's connections.
    pub const STRIPE_WHOLE: u64 = 1 << 5;
    /// The client reads a `stat` answer's trailing policy (`CatalogStat::policy`); a server
    /// sends it only to a client that offered this, so older clients see the old layout.
    pub const CATALOG_POLICY: u64 = 1 << 6;
    /// The server takes `StripeRead`: it reads blocks a striped get's client asks for
    /// (`Fetch`) from the shared file system. Set in a `Welcome` with [`Self::STRIPE`]
    /// (`serve --stripe`); a client checks it before it sends a frame an older host lacks.
    pub const STRIPE_READ: u64 = 1 << 7;
    /// The server takes part in a striped third-party copy: as its source it takes a
    /// `CopyRequest` that names stripe hosts and runs a striped put to them; as a stripe host
    /// (with [`Self::STRIPE`]) it mints stripe grants (`StripeGrantRequest`). A client checks
    /// it on every server of the copy before it asks anything an older server lacks.
    pub const STRIPE_COPY: u64 = 1 << 8;
    /// The server takes part in a pulled copy: as its source (or a source's stripe host, with
    /// [`Self::STRIPE_READ`]) it mints read grants (`ReadGrantRequest`); as its destination
    /// it takes a `CopyRequest` with `pull` and runs a get from the source. A client checks
    /// it on every server of the copy before it asks anything an older server lacks.
    pub const PULL_COPY: u64 = 1 << 9;
    /// After a catalog request's answer the control connection may carry the next catalog
    /// request (a catalog session), until the client closes or the server's bounds end it
    /// (`Error{session_ended}`). Both sides set it; without it in the `Welcome` a client opens
    /// a connection per request, as before.
    pub const CATALOG_SESSION: u64 = 1 << 10;
    /// A striped get stripes one-block files too. Offered by the client of a striped get to
    /// its coordinator, which then sends a file's digest apart (`FileDigest` on control) in
    /// place of its last block when the client's `Resume` has every block of the file (the
    /// stripe hosts bring them), and says so in its `Welcome`; without it in the `Welcome`
    /// one-block files come from the coordinator.
    pub const STRIPE_DIGEST: u64 = 1 << 11;
    /// The client reads each replica's own path in a `stat` answer (tag 7: a `repl` made the
    /// copy at another path than the object's) and the server takes `Replicated` with one (op
    /// 14). A server sends tag 7 only to a client that offered it; a client sends op 14 only
    /// to a server that set it in its `Welcome`. Without it every replica is at the object's
    /// path.
    pub const REPLICA_PATH: u64 = 1 << 12;

    /// Everything this build supports.
    pub const fn ours() -> Self {
        Self(
            Self::RESEND
                | Self::EARLY_TUNED
                | Self::RAMP_HELPERS
                | Self::CATALOG_POLICY
                | Self::STRIPE_COPY
                | Self::PULL_COPY
                | Self::CATALOG_SESSION
                | Self::REPLICA_PATH,
        )
    }

    /// Everything this build understands: what it offers by default and what it offers on
    /// request ([`Capabilities::MULTIPATH`]). A server keeps these bits of a client's `Hello`.
    pub const fn known() -> Self {
        Self(Self::ours().0 | Self::MULTIPATH | Self::STRIPE_WHOLE | Self::STRIPE_DIGEST)
    }

    pub fn intersect(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    pub fn has(self, bit: u64) -> bool {
        self.0 & bit == bit
    }
}

/// What a new connection is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The first connection of a session, authenticated by a token. The client chooses the
    /// session's identity and the secret its data connections prove they belong to it with, so
    /// that they can join (and carry data) without waiting a round trip for the `Welcome`.
    Control {
        token: String,
        session: SessionId,
        secret: [u8; 32],
    },
    /// A data connection joining a session, possibly before the server has registered it.
    Data {
        session: SessionId,
        secret: [u8; 32],
        stream: u16,
    },
}

/// End-to-end file digest algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChecksumAlgo {
    Blake3 = 1,
    Xxh3 = 2,
    Sha256 = 3,
    Md5 = 4,
}

/// What to do when the destination already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExistingPolicy {
    /// Report the file as failed and leave the existing one alone.
    Fail = 0,
    /// Replace it (atomically, by rename).
    Overwrite = 1,
    /// Leave it and count it as skipped.
    Skip = 2,
}

/// Parameters of one transfer, proposed by the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferOpts {
    pub streams: u16,
    pub block_size: u32,
    pub checksum: ChecksumAlgo,
    pub existing: ExistingPolicy,
    /// SO_SNDBUF/SO_RCVBUF for data sockets; 0 leaves the kernel's autotuning alone.
    pub tcp_window: u32,
    /// 0: `streams` is fixed, every data connection carries data. n >= 1: the stream count is
    /// tuned during the transfer: `streams` is the most data connections (all are opened at
    /// the start) and the sending side starts with n of them carrying data, n clamped to
    /// `streams`. With [`Capabilities::RAMP_HELPERS`] the connections from
    /// [`RAMP_HELPERS_FROM`] on are ramp helpers, outside the tuning; the receiver treats every
    /// connection alike.
    pub auto_start: u16,
    /// Storage threads the client asks of the server for this transfer: its writers on a put,
    /// its readers on a get (`--writers`/`--readers` given to the client). 0: the server
    /// chooses and tunes them. The server caps the number at its own maximum. (Protocol v6.)
    pub storage_threads: u16,
}

/// The most storage threads a request may ask for ([`TransferOpts::storage_threads`]).
pub const MAX_STORAGE_THREADS: u16 = 256;

impl TransferOpts {
    /// Whether the sending side tunes the number of streams that carry data.
    pub fn is_auto(&self) -> bool {
        self.auto_start > 0
    }
}

/// What one end measured about its own side of a transfer, so the client can say what limited
/// it. Fractions are in thousandths, 0..=1000 (larger values are clamped by the reader).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Process CPU time (user + system) over wall time times the cores it may use.
    pub cpu_permille: u16,
    /// Share of time this end's queue towards the network was empty: on the sender, the frame
    /// queue the data connections pull from (reading could not keep up); on the receiver, the
    /// queue to its writers (the network could not keep up).
    pub starved_permille: u16,
    /// Share of time that queue was full: on the sender, the connections could not send as
    /// fast as the files were read; on the receiver, the writers could not store as fast as
    /// the data arrived.
    pub blocked_permille: u16,
    /// Storage threads working at the end: readers on the sender, writers on the receiver
    /// (each end tunes its own). 0: not said.
    pub threads: u16,
}

/// What became of one tuner measurement (`TuneStep::verdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TuneVerdict {
    Baseline = 0,
    Kept = 1,
    Rejected = 2,
    Drift = 3,
}

impl TuneVerdict {
    /// The name reports use (`--json`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::Kept => "kept",
            Self::Rejected => "rejected",
            Self::Drift => "drift",
        }
    }
}

/// One measurement of the stream tuner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TuneStep {
    /// Milliseconds since the sender started the transfer.
    pub at_ms: u32,
    pub streams: u16,
    /// Median rate measured (the mean of two medians for a step measured twice), bytes per
    /// second.
    pub rate: u64,
    /// The measurement's noise per mille of its rate: half the range of its samples, or the
    /// pooled noise of a step measured twice.
    pub noise_permille: u16,
    pub verdict: TuneVerdict,
}

/// What the sending side's stream tuner did, and the sender's load: sent after `Complete` so
/// the client (the receiver of a get) can report and remember it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TuneReport {
    /// Streams carrying data at the end.
    pub streams: u16,
    /// Streams carrying data at the start.
    pub start: u16,
    /// `TUNE_*` bits.
    pub flags: u8,
    pub sender: Load,
    /// At most [`MAX_TUNE_STEPS`], oldest first.
    pub steps: Vec<TuneStep>,
}

impl TuneReport {
    /// The transfer was auto-tuned.
    pub const AUTO: u8 = 1 << 0;
    /// The tuner finished a search.
    pub const SETTLED: u8 = 1 << 1;
    /// The files were small (below a block on average), so the sender started low.
    pub const SMALL_FILES: u8 = 1 << 2;
    /// Every flag this build knows; others are refused.
    pub const ALL: u8 = Self::AUTO | Self::SETTLED | Self::SMALL_FILES;

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag == flag
    }
}

/// Kind of a listed directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    File = 0,
    Dir = 1,
    Symlink = 2,
    Other = 3,
}

/// One line of a remote listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    pub mode: u32,
    /// Modification time in nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// Metadata of a file, repeated in each of its blocks so that blocks can arrive in any order on
/// any stream and the receiver can open the file from whichever comes first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    pub id: FileId,
    /// Path relative to the transfer's destination, `/`-separated, already validated by the sender.
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
}

/// A piece of a file: at most the session's block size, anywhere in it. A small file usually
/// travels as a single block (offset 0, all data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub file: FileMeta,
    pub offset: u64,
    /// XXH3-128 of `data`, big endian.
    pub digest: u128,
    /// End-to-end digest of the whole file, present only on the block that ends the file
    /// (`offset + data.len() == file.size`), because the sender knows it only then.
    pub file_digest: Option<Bytes>,
    /// Sent before the sender had the receiver's decision for the file: the receiver uses it
    /// only for a file it decided to receive and drops it otherwise, where a block sent after
    /// the decision would mean more (the same size and mtime, but different content).
    pub early: bool,
    pub data: Bytes,
}

/// A file the sender is about to send, announced before any of its data so the receiver can
/// say what it already has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferEntry {
    pub file: FileId,
    pub path: String,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
}

/// What the receiver wants of an offered file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send all of it.
    Send,
    /// A partial copy holds these verified byte ranges `[start, end)`: send the rest, and
    /// always the block that ends the file (it carries the file digest).
    Resume { have: Vec<(u64, u64)> },
    /// A file with this size and mtime is already there with this digest: if the sender's
    /// digest is the same it sends `Skipped`, otherwise the whole file.
    Complete { digest: Bytes },
    /// It exists and the transfer skips existing files: send nothing.
    Skip,
    /// It cannot be stored: send nothing.
    Fail { code: ErrorCode, message: String },
}

/// The receiver's answer for one offered file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileDecision {
    pub file: FileId,
    pub decision: Decision,
}

/// Summary the receiver returns once every file is final.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompleteSummary {
    pub files: u64,
    pub bytes: u64,
    pub skipped: u64,
    pub failed: u64,
    pub bad_blocks: u64,
    /// The receiver's own load, for attributing the bottleneck.
    pub receiver: Load,
}

/// Which way the filler of a network probe flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeDirection {
    /// The client sends, the server counts (like `put`).
    ClientToServer = 0,
    /// The server sends, the client counts (like `get`).
    ServerToClient = 1,
}

/// How one data connection of a probe fared, as the server saw it: the bytes it counted and,
/// when it was the sender, its socket's `TCP_INFO` near the end of the sending period (zeros
/// when the server received, or `TCP_INFO` was unavailable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeStream {
    pub bytes: u64,
    pub rtt_us: u32,
    pub min_rtt_us: u32,
    /// Congestion window in segments.
    pub snd_cwnd: u32,
    pub snd_mss: u32,
    pub total_retrans: u32,
}

/// Every frame of the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello {
        version: u16,
        capabilities: Capabilities,
        role: Role,
    },
    Welcome {
        version: u16,
        capabilities: Capabilities,
        session: SessionId,
        secret: [u8; 32],
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    PutRequest {
        dest: String,
        sources: u32,
        opts: TransferOpts,
    },
    GetRequest {
        src: String,
        opts: TransferOpts,
    },
    ListRequest {
        path: String,
    },
    /// Server accepted a put/get, possibly lowering the proposed streams and block size;
    /// data connections may join now.
    Ready {
        streams: u16,
        block_size: u32,
    },
    ListEntries {
        entries: Vec<ListEntry>,
    },
    ListEnd,
    Block(Block),
    Dir {
        path: String,
        mode: u32,
        mtime_ns: i64,
    },
    Symlink {
        path: String,
        target: String,
        mtime_ns: i64,
    },
    /// Sender has queued everything: the receiver knows how many entries to expect.
    Sent {
        files: u64,
        dirs: u64,
        symlinks: u64,
        bytes: u64,
    },
    /// Receiver found a bad block and asks for it again.
    Resend {
        file: FileId,
        offset: u64,
        len: u32,
    },
    /// Sender to receiver, on a data connection: the file the receiver reported `Complete` is
    /// identical on both ends, so nothing more comes for it.
    Skipped {
        file: FileId,
    },
    FileFailed {
        file: FileId,
        code: ErrorCode,
        message: String,
    },
    Complete(CompleteSummary),
    /// Sender announces files (control), ahead of their data; pipelined, never awaited per file.
    Offer {
        entries: Vec<OfferEntry>,
    },
    /// Receiver answers offers (control).
    Decisions {
        entries: Vec<FileDecision>,
    },
    /// Receiver could not create a directory or symlink (control): the sender reports why.
    EntryFailed {
        path: String,
        code: ErrorCode,
        message: String,
    },
    /// Sender tells the receiver (control, after `Complete`, before closing) what its stream
    /// tuner did and how loaded it was.
    Tuned(TuneReport),
    /// Client asks for a memory-to-memory throughput probe (control): filler flows one way
    /// over `streams` data connections for `duration_ms`; nothing touches a disk.
    ProbeRequest {
        direction: ProbeDirection,
        streams: u16,
        duration_ms: u32,
        /// SO_SNDBUF/SO_RCVBUF for the data connections; 0 leaves autotuning alone.
        window: u32,
    },
    /// Server's account of a probe (control): bytes it counted per `interval_ms` bucket from
    /// the moment all data connections had joined, and per data connection.
    ProbeResult {
        interval_ms: u16,
        intervals: Vec<u64>,
        streams: Vec<ProbeStream>,
    },
    /// Filler on a probe's data connections (a length, then that many bytes); the receiver
    /// discards it.
    ProbeData {
        data: Bytes,
    },
    /// Client to the destination of a third-party copy (control): mint a grant that lets
    /// another server put into `dest`, within this token's write scope, for one transfer.
    GrantRequest {
        dest: String,
        /// What the granted put may do with files that exist: the client's `--overwrite` or
        /// `--skip-existing`, never more than the client asked.
        existing: ExistingPolicy,
    },
    /// The destination's answer: the grant, a bearer credential the source presents as its
    /// token, good for `ttl_ms` before its first use (and between retries).
    Granted {
        grant: String,
        ttl_ms: u32,
    },
    /// Server to client (control), right after `Welcome` when the client offered
    /// `multipath`: the `host:port` addresses it takes data connections on, one per network
    /// path.
    Paths {
        addrs: Vec<String>,
    },
    /// Client to the source of a third-party copy (control): put `src` into `dest` on the
    /// server at `peer`, pinned by `fingerprint`, logging in with `grant`.
    CopyRequest(Box<CopyRequest>),
    /// Client to a stripe host of a striped copy's destination (control): mint a stripe grant,
    /// which lets another server (the copy's source) open one stripe session (`StripeRequest`)
    /// into exactly `dest`, within this token's write scope, and nothing else. Answered with
    /// `Granted`.
    StripeGrantRequest {
        dest: String,
    },
    /// Client to the source of a pulled copy (control): mint a read grant, which lets another
    /// server (the copy's destination) read exactly `src`, within this token's read scope,
    /// with one get at a time (`stripe`: one stripe read session, `StripeRead`, on a source's
    /// other host) and nothing else. Answered with `Granted`.
    ReadGrantRequest {
        src: String,
        stripe: bool,
    },
    /// Source to client (control), while a copy runs: what the walk found and what is sent.
    CopyProgress(CopyProgress),
    /// Source to client (control): the copy ended; the destination's `Complete` as the source
    /// received it, and the source's transfer report as JSON.
    CopyDone {
        summary: CompleteSummary,
        report: String,
    },
    /// Client to a stripe host of a striped put (control): join as a writer of the blocks of
    /// `dest`'s partial files, which the put's coordinator (another server on the same file
    /// system) opens. Answered with `Ready`; data connections join as for a put.
    StripeRequest {
        dest: String,
        opts: TransferOpts,
    },
    /// Client to a stripe host of a striped get (control): join as a reader of `src` (checked
    /// against the token's read scopes as a get's is) on the file system the get's
    /// coordinator reads. Answered with `Ready`; data connections join as for a get, and
    /// carry the blocks the client asks for with `Fetch`.
    StripeRead {
        src: String,
        opts: TransferOpts,
    },
    /// Client to a stripe host of a striped get (control): read `len` bytes at `offset` of
    /// the file the coordinator offered as `file` at `path` (beneath `src`, named as in the
    /// offer), if it still has `size` and `mtime_ns`, and send them as a `Block` on a data
    /// connection; `Resend` on control when it cannot.
    Fetch {
        file: FileId,
        path: String,
        size: u64,
        mtime_ns: i64,
        offset: u64,
        len: u32,
    },
    /// A block is durable in its file's partial copy: a stripe host to the client (control),
    /// once it has written and synced it, and the client to the coordinator (control), which
    /// merges `cvs` into the file's BLAKE3 tree, or else reads the block back and checks
    /// `digest`, and counts it as written.
    Landed {
        file: FileId,
        offset: u64,
        len: u32,
        /// XXH3-128 of the block's bytes.
        digest: u128,
        /// The BLAKE3 chaining values of the whole subtrees inside the block, in offset order,
        /// as the stripe host hashed the bytes it wrote; empty when the session's file digest
        /// is not BLAKE3 or the file has no tree (64 KiB or less).
        cvs: Vec<[u8; 32]>,
    },
    /// The client to a striped put's coordinator (control), with `STRIPE_WHOLE`: the file
    /// digest that the block a stripe host wrote (and the client reports `Landed`) carried,
    /// sent before that `Landed`. The coordinator verifies the file against it as against a
    /// block's.
    FileDigest {
        file: FileId,
        digest: Bytes,
    },
    /// Client to server (control), a request of its own: remove these files, symlinks and
    /// empty directories (a sync's `--delete`), each under the token's write scope; a path
    /// already gone counts as removed. `more`: another `RemoveRequest` follows on this
    /// connection once this one is answered.
    RemoveRequest {
        paths: Vec<String>,
        more: bool,
    },
    /// The server's answer to one `RemoveRequest`: how many of its paths are gone, and why
    /// each of the others is not.
    Removed {
        removed: u16,
        failures: Vec<RemoveFailure>,
    },
    /// Client to the source of a third-party copy (control), right after a `CopyRequest` with
    /// `only`: paths below `src` to send, and no others (a sync's changed files and the
    /// directories leading to them). `more`: another `CopyPaths` follows.
    CopyPaths {
        paths: Vec<String>,
        more: bool,
    },
    /// Client to server (control), a request of its own: a catalog operation (`ferry stat`,
    /// `rm`, `mv`, `mkdir`, `meta`, `find`) under the token's scopes.
    CatalogRequest(CatalogRequest),
    /// The server's answer to a `CatalogRequest` (a find's may take several frames).
    CatalogAnswer(CatalogAnswer),
    /// Server to client (control), the answer to a `CatalogRequest::Tar`: the next bytes of
    /// the tar stream (at most [`MAX_TAR_DATA`]). `last`: the stream is whole (its
    /// end-of-archive blocks sent); a failure is an `Error` instead.
    TarData {
        data: Bytes,
        last: bool,
    },
}

/// Most tar bytes one `TarData` frame carries: well within a control frame.
pub const MAX_TAR_DATA: usize = 512 << 10;

/// One path of a `RemoveRequest` that was not removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveFailure {
    /// Its place in the request's `paths`.
    pub index: u16,
    pub code: ErrorCode,
    pub message: String,
}

/// What a client asks a source server to copy, and to where (`Frame::CopyRequest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyRequest {
    /// Path on the source server, under the client's read scope there.
    pub src: String,
    /// Path on the destination server, exactly the one the grant was minted for.
    pub dest: String,
    /// The destination's `host:port` as the source reaches it.
    pub peer: String,
    /// SHA-256 of the destination's certificate: the key the client trusts it by.
    pub fingerprint: [u8; 32],
    /// The grant the destination minted (`Granted.grant`).
    pub grant: String,
    pub opts: TransferOpts,
    /// Send only the paths below `src` that `CopyPaths` frames list next, into `dest` as a
    /// directory (a sync between two servers). On the wire only when set, so a plain copy's
    /// request is the one older servers know.
    pub only: bool,
    /// A striped copy: the destination's other hosts, which share its file system, each with
    /// the stripe grant it minted. The source runs a striped put with `peer` coordinating.
    /// On the wire only when not empty (a flag bit beside `only`, then the hosts).
    pub stripes: Vec<CopyStripe>,
    /// A pulled copy, sent to the destination instead of the source: the destination gets
    /// `src` from the server at `peer` (pinned by `fingerprint`, logged in to with the read
    /// grant it minted, `grant`) into `dest`, under this client's write scope; `stripes` are
    /// then the source's other hosts, each with its stripe read grant. A flag bit beside
    /// `only`.
    pub pull: bool,
}

/// Most stripe hosts one `CopyRequest` may name.
pub const MAX_COPY_STRIPES: usize = 64;

/// One stripe host of a striped copy, as the source reaches and trusts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyStripe {
    /// `host:port` as the source reaches it.
    pub addr: String,
    /// SHA-256 of its certificate: the key the client trusts it by.
    pub fingerprint: [u8; 32],
    /// The stripe grant it minted (`Granted.grant` to a `StripeGrantRequest`).
    pub grant: String,
}

/// Progress of a third-party copy as its source sees it (`Frame::CopyProgress`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyProgress {
    /// Files and bytes the walk has found so far.
    pub found_files: u64,
    pub found_bytes: u64,
    /// The walk is over: the found totals are final.
    pub walk_done: bool,
    /// Files read completely and payload bytes handed to the data connections.
    pub files: u64,
    pub bytes: u64,
}

/// Error code carried on the wire in `Error` and `FileFailed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u16);

impl ErrorCode {
    pub const PROTOCOL: Self = Self(1);
    pub const VERSION: Self = Self(2);
    pub const AUTH: Self = Self(3);
    pub const BAD_REQUEST: Self = Self(4);
    pub const NOT_FOUND: Self = Self(5);
    pub const PERMISSION: Self = Self(6);
    pub const EXISTS: Self = Self(7);
    pub const IO: Self = Self(8);
    pub const CORRUPT: Self = Self(9);
    pub const BUSY: Self = Self(10);
    pub const TIMEOUT: Self = Self(11);
    pub const INTERNAL: Self = Self(12);
    pub const NO_SPACE: Self = Self(13);
    /// One end requires TLS and the other offered plain TCP, or the reverse.
    pub const ENCRYPTION: Self = Self(14);
    /// The token is valid but its scope does not cover the path or the operation.
    pub const DENIED: Self = Self(15);
    /// Too many failed logins from this address: wait before trying again.
    pub const SLOW_DOWN: Self = Self(16);
    /// A data connection beyond the count the session granted: refused on its own, the session
    /// goes on (the client may send every data connection's `Hello` before it knows the grant).
    pub const NOT_GRANTED: Self = Self(17);
    /// A catalog session's bound (its request count, or its idle time) ended it before this
    /// request: nothing of the request was done; ask again on a new connection.
    pub const SESSION_ENDED: Self = Self(18);
    /// A put under a policy that registers another digest algorithm than the request's, refused
    /// before any data moves. The message begins with that algorithm's name and `": "`, so a
    /// client whose user left the algorithm to ferry can put again with it
    /// ([`ErrorCode::policy_checksum`]).
    pub const CHECKSUM_POLICY: Self = Self(19);

    /// The algorithm a `checksum_policy` refusal names (its message's first word, the wire's
    /// name for it); `None` for any other error.
    pub fn policy_checksum(self, message: &str) -> Option<&str> {
        if self != Self::CHECKSUM_POLICY {
            return None;
        }
        message.split_once(": ").map(|(algo, _)| algo)
    }

    /// Whether an error answering a catalog request in a catalog session ends the session (the
    /// connection is no longer in step, or a bound ended it); any other is the request's own
    /// refusal and the next request may follow on the same connection. Both sides decide by it.
    pub fn ends_catalog_session(self) -> bool {
        matches!(
            self,
            Self::PROTOCOL | Self::TIMEOUT | Self::SESSION_ENDED | Self::INTERNAL
        )
    }
}
