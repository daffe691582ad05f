//! `ferry demo`: the whole job on one machine — a server on loopback, a generated data set
//! (one large file and many small ones), transfers verified independently of ferry's own
//! digests, and the throughput of each.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ferry_net::{Server, ServerConfig};
use ferry_units::units::{format_bytes_2dp as human_bytes, parse_size};
use serde::Serialize;

use super::transfer::summary_line;
use crate::args::{AuthArgs, ConnArgs, DemoArgs, FilterArgs, OutputArgs, TransferArgs, WaitArgs};
use crate::config::client_config;
use crate::error::usage;
use crate::progress::Progress;
use crate::remote::Remote;

#[derive(Serialize)]
struct Case {
    name: String,
    files: u64,
    bytes: u64,
    seconds: f64,
    mib_per_s: f64,
    files_per_s: f64,
    verified: bool,
}

/// Fills `len` bytes with a fast xorshift stream: incompressible enough, cheap to make.
fn fill(path: &Path, len: u64, seed: u64) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for chunk in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    w.flush()?;
    Ok(())
}

/// iperf3's memory-to-memory throughput on loopback with `streams` parallel streams, in MiB/s,
/// when iperf3 is installed: the ceiling that ferry's disk-to-disk numbers are judged against.
fn iperf3_loopback(streams: u16) -> Option<f64> {
    use std::process::{Command, Stdio};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut out = None;
    // The server needs a moment to listen; a few bounded attempts.
    for _ in 0..20 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let o = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                "3",
                "-O",
                "1",
                "-J",
            ])
            .args(["-P", &streams.max(1).to_string()])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if o.status.success() {
            out = Some(o.stdout);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out?).ok()?;
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64()?;
    Some(bps / 8.0 / (1 << 20) as f64)
}

/// BLAKE3 of a file read with plain std I/O: a check that shares no code with ferry's path.
fn digest_of(path: &Path) -> Result<blake3::Hash> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finalize());
        }
        h.update(&buf[..n]);
    }
}

fn same_tree(a: &Path, b: &Path) -> Result<bool> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(a.join(&rel))? {
            let e = e?;
            let r = rel.join(e.file_name());
            if e.file_type()?.is_dir() {
                stack.push(r);
            } else if digest_of(&a.join(&r))?
                != digest_of(&b.join(&r)).unwrap_or(blake3::hash(b"missing"))
            {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

pub async fn run(args: DemoArgs, quiet: bool) -> Result<ExitCode> {
    let big = parse_size(&args.file_size).map_err(|e| usage(e.into()))?;
    let small = parse_size(&args.small_size).map_err(|e| usage(e.into()))?;
    let _tmp;
    let work = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            _tmp = tempfile::Builder::new().prefix("ferry-demo-").tempdir()?;
            _tmp.path().to_path_buf()
        }
    };
    let say = |s: String| {
        if !quiet {
            eprintln!("{s}");
        }
    };
    let (src, dest) = (work.join("src"), work.join("dest"));
    std::fs::create_dir_all(src.join("small"))?;
    std::fs::create_dir_all(&dest)?;
    say(format!(
        "ferry demo in {}: generating 1 file of {} and {} files of {}",
        work.display(),
        human_bytes(big),
        args.small_files,
        human_bytes(small)
    ));
    generate(&src, big, small, args.small_files)?;
    let server = DemoServer::start(&dest).await?;
    let addr = server.addr;
    let cfg = client_config(&server.transfer_args(args.streams), &server.remote())?;
    say(format!(
        "server on {addr}, {} streams, {} blocks, TLS 1.3, blake3 end to end",
        args.streams,
        human_bytes(u64::from(cfg.opts.block_size))
    ));

    let mut cases = Vec::new();
    for (name, path, files) in [
        ("1 large file", src.join("large.bin"), 1u64),
        ("small files", src.join("small"), args.small_files as u64),
        ("same bytes as one file", src.join("same-bytes.bin"), 1),
    ] {
        let case = measure(&cfg, name, &path, files, &dest, quiet || args.output.json).await?;
        say(format!(
            "  {:<24} {:>6} files {:>11} {:>7.2} s {:>9.1} MiB/s {:>10.0} files/s  verified",
            case.name,
            case.files,
            human_bytes(case.bytes),
            case.seconds,
            case.mib_per_s,
            case.files_per_s
        ));
        cases.push(case);
    }
    if let Some(ceiling) = iperf3_loopback(args.streams) {
        say(format!(
            "  {:<24} memory to memory, {} streams: {:>9.1} MiB/s (the network ceiling on loopback)",
            "iperf3", args.streams, ceiling
        ));
    }
    if let [_, small_case, one] = cases.as_slice() {
        say(format!(
            "  small files took {:.2}× the time of one file with the same bytes",
            small_case.seconds / one.seconds.max(1e-9)
        ));
    }
    server.stop().await;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&cases)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// The data set in `src`: one file of `big` bytes, `n` files of `small` bytes in directories of
/// a hundred, and one file of the small files' bytes together.
fn generate(src: &Path, big: u64, small: u64, n: usize) -> Result<()> {
    fill(&src.join("large.bin"), big, 1)?;
    for i in 0..n {
        let d = src.join("small").join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        fill(&d.join(format!("f{i:05}.bin")), small, i as u64 + 2)?;
    }
    // The same bytes as the small files in one file: the baseline small files are judged by.
    let small_total = small * n as u64;
    fill(&src.join("same-bytes.bin"), small_total, 3)?;

    // Flush the generated data first: writeback of it would otherwise compete with the
    // transfer's own writes and fsyncs and make the numbers say little about ferry.
    let f = std::fs::File::open(src.join("large.bin"))?;
    ferry_core::root::syncfs(&f).context("syncing the generated data")?;
    Ok(())
}

/// The demo's own server on loopback, with a one-time token.
struct DemoServer {
    addr: std::net::SocketAddr,
    token: String,
    fingerprint: Option<String>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl DemoServer {
    async fn start(dest: &Path) -> Result<Self> {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).map_err(|e| anyhow::anyhow!("no OS randomness: {e}"))?;
        let token = ferry_core::digest::hex(&token);
        // TLS as in real use: the demo's throughput includes the encryption.
        let config = ServerConfig::new(dest, token.clone());
        let fingerprint = config.tls.as_ref().map(|id| id.fingerprint().to_string());
        let server = Server::bind("127.0.0.1:0".parse()?, config).await?;
        let addr = server.local_addr()?;
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stop_rx.await;
        }));
        Ok(Self {
            addr,
            token,
            fingerprint,
            stop,
            task,
        })
    }

    /// A put's arguments for this server: its token, its pinned key, no retries.
    fn transfer_args(&self, streams: u16) -> TransferArgs {
        TransferArgs {
            streams: streams.to_string(),
            block_size: None,
            tcp_window: None,
            checksum: None,
            overwrite: false,
            skip_existing: false,
            readers: None,
            writers: None,
            output: OutputArgs::default(),
            manifest: None,
            multipath: false,
            bind: Vec::new(),
            stripe: Vec::new(),
            filter: FilterArgs::default(),
            auth: AuthArgs {
                token: Some(self.token.clone()),
                config: None,
            },
            wait: WaitArgs {
                connect_timeout: "15s".into(),
                retry_for: "0".into(),
            },
            conn: ConnArgs {
                server_fingerprint: self.fingerprint.clone(),
                ..ConnArgs::default()
            },
        }
    }

    fn remote(&self) -> Remote {
        Remote {
            host: "127.0.0.1".into(),
            port: self.addr.port(),
            path: "/".into(),
            ssh_user: None,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Puts `path` (`files` files) to the server and checks what arrived in `dest` with a digest of
/// its own.
async fn measure(
    cfg: &ferry_net::ClientConfig,
    name: &str,
    path: &Path,
    files: u64,
    dest: &Path,
    quiet: bool,
) -> Result<Case> {
    let progress = Arc::new(Progress::new(quiet));
    let t0 = Instant::now();
    let report = ferry_net::client::put(
        cfg,
        std::slice::from_ref(&path.to_path_buf()),
        "/",
        progress.clone(),
    )
    .await;
    progress.finish();
    let report = report.with_context(|| format!("demo transfer of {name} failed"))?;
    let seconds = t0.elapsed().as_secs_f64();
    if !report.is_success() || report.files != files {
        bail!(
            "demo transfer of {name} incomplete: {}",
            summary_line(&report)
        );
    }
    let target = dest.join(path.file_name().context("source has a name")?);
    let verified = if path.is_dir() {
        same_tree(path, &target)?
    } else {
        digest_of(path)? == digest_of(&target)?
    };
    if !verified {
        bail!("demo: {name} arrived but differs from the source");
    }
    Ok(Case {
        name: name.into(),
        files: report.files,
        bytes: report.bytes,
        seconds,
        mib_per_s: report.bytes as f64 / (1 << 20) as f64 / seconds,
        files_per_s: report.files as f64 / seconds,
        verified,
    })
}
