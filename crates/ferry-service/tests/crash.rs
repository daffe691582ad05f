//! kill -9 of the service while a job runs, then a restart on the same state directory: the
//! job is queued again at start and completes, resuming rather than starting over: it sends
//! what the server's journal does not vouch for, and again only the head a session sends
//! early on each connection before the resume answer. The
//! service runs in a process of its own: this test binary, started again on
//! `service_process`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferry_service::State;

use crate::util::*;

const CHILD_STATE: &str = "FERRY_SERVICE_TEST_STATE";
const CHILD_LOCAL: &str = "FERRY_SERVICE_TEST_LOCAL";
const CHILD_PACE_MS: &str = "FERRY_SERVICE_TEST_PACE_MS";
/// The streams every transfer of the service process runs: fixed, so that what a kill costs
/// can be bounded per connection.
const STREAMS: u16 = 2;

/// A service in a process of its own; killed (SIGKILL) when dropped.
struct ServiceProcess {
    child: Child,
    port: u16,
    fingerprint: ferry_net::Fingerprint,
}

impl ServiceProcess {
    fn start(state: &Path, local: &Path, pace_ms: u64) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash::service_process",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_STATE, state)
            .env(CHILD_LOCAL, local)
            .env(CHILD_PACE_MS, pace_ms.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut port, mut fingerprint) = (None, None);
        // The child prints two lines of its own among the test harness's few.
        for _ in 0..50 {
            let line = lines
                .next()
                .expect("the service process says where it listens")
                .unwrap();
            if let Some(p) = line.strip_prefix("PORT ") {
                port = Some(p.trim().parse().unwrap());
            }
            if let Some(f) = line.strip_prefix("FINGERPRINT ") {
                fingerprint = Some(f.trim().parse().unwrap());
            }
            if port.is_some() && fingerprint.is_some() {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            port: port.expect("PORT line"),
            fingerprint: fingerprint.expect("FINGERPRINT line"),
        }
    }

    fn client(&self, token: &str) -> ferry_service::client::Client {
        ferry_service::client::Client {
            addr: format!("127.0.0.1:{}", self.port),
            token: token.into(),
            trust: ferry_service::tls::Trust::Pinned(self.fingerprint),
            timeout: Duration::from_secs(10),
            kept: None,
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service process: runs until its stdin closes. Skipped unless started by the test.
#[test]
#[ignore = "the service process of kill_9_mid_job_then_restart_completes_the_job"]
fn service_process() {
    let (Some(state), Some(local)) = (std::env::var_os(CHILD_STATE), std::env::var_os(CHILD_LOCAL))
    else {
        return;
    };
    let pace: u64 = std::env::var(CHILD_PACE_MS).unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut cfg =
            ferry_service::ServiceConfig::new("127.0.0.1:0".parse().unwrap(), Path::new(&state));
        cfg.local_root = Some(local.into());
        cfg.limits = limits();
        cfg.block_size = BLOCK;
        cfg.pace = (pace > 0).then(|| Duration::from_millis(pace));
        cfg.fixed_streams = Some(STREAMS);
        let service = ferry_service::Service::bind(cfg).await.unwrap();
        println!("PORT {}", service.local_addr().unwrap().port());
        println!("FINGERPRINT {}", service.fingerprint());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_line(&mut String::new());
            let _ = tx.send(());
        });
        service
            .run(async {
                let _ = rx.await;
            })
            .await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_job_then_restart_completes_the_job() {
    const SIZE: usize = 8 << 20;
    let server = TestServer::start().await;
    let local = tempfile::tempdir().unwrap();
    make_file(&local.path().join("big"), SIZE);
    let state = tempfile::tempdir().unwrap();
    let tokens = make_tokens(state.path());
    write_endpoints(state.path(), &server);

    // Paced: 64 KiB blocks, 100 ms each per stream, so the job runs for seconds.
    let first = ServiceProcess::start(state.path(), local.path(), 100);
    let c = first.client(&tokens["alice"]);
    let j = c
        .submit(&request(&["/big"], &format!("{}:/", server.addr)))
        .await
        .unwrap();
    let before = wait_api(&c, j.id, Duration::from_secs(60), |j| {
        j.state == State::Running && j.bytes_done >= 2 << 20
    })
    .await;
    drop(first); // SIGKILL: no chance to record anything.
    assert!(
        !server.root.join("big").exists(),
        "killed before the file completed"
    );
    // The server lets go of the dead session's partial file before another may resume it.
    server.settle().await;
    let kept = journaled_bytes(&server.root);

    // Paced too, lightly: on loopback an unpaced sender has sent its early blocks (up to a
    // cut block per connection, before the receiver's resume answer) from the whole file.
    let second = ServiceProcess::start(state.path(), local.path(), 20);
    let c = second.client(&tokens["alice"]);
    let after = wait_api(&c, j.id, Duration::from_secs(60), |j| j.state.is_final()).await;
    assert_eq!(after.state, State::Done, "{after:?}");
    assert_eq!(after.attempts, 2, "the restart ran it once more: {after:?}");
    assert_eq!(
        std::fs::read(server.root.join("big")).unwrap(),
        std::fs::read(local.path().join("big")).unwrap()
    );
    // Resumed: the second attempt sent what the server's journal did not vouch for, and
    // again at most the head a session sends early on each connection before the receiver's
    // resume answer is back (one cut block, 256 KiB, each: within one of ferry's own blocks
    // at its default sizes; four of this test's small ones).
    let again = after.bytes_done.saturating_sub(SIZE as u64 - kept);
    let bound = u64::from(STREAMS) * ferry_core::send::EARLY_PER_STREAM;
    assert!(
        kept > 0,
        "the server kept nothing of the {} bytes the first attempt had sent",
        before.bytes_done
    );
    assert!(
        after.bytes_done >= SIZE as u64 - kept && again <= bound,
        "the second attempt sent {} with {kept} kept: {again} again, more than {bound}",
        after.bytes_done
    );
    server.stop().await;
}

/// Bytes of the partial file under `root` that its resume journal vouches for: what a rerun
/// need not send (the union of its records' ranges).
fn journaled_bytes(root: &Path) -> u64 {
    let mut ranges = Vec::new();
    for e in std::fs::read_dir(root).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "journal") {
            let j = ferry_proto::journal::decode_journal(&std::fs::read(&path).unwrap()).unwrap();
            ranges.extend(
                j.records
                    .iter()
                    .map(|r| (r.offset, r.offset + u64::from(r.len))),
            );
        }
    }
    ranges.sort_unstable();
    let (mut kept, mut reach) = (0, 0);
    for (start, end) in ranges {
        let start = start.max(reach);
        if end > start {
            kept += end - start;
            reach = end;
        }
    }
    kept
}
