//! GridFTP beside ferry in multipath mode: the Debian `globus-gridftp-server` striped over the
//! same K links. For K > 1, one data node (`-dn`) per link, each listening and moving data on
//! the server's address on its link, and a front end that drives them (`-r`); the client is
//! `globus-url-copy -stripe`, which opens a data connection to each stripe, each over its own
//! link. K = 1: one plain server, as in the bed mode. Anonymous clear-text mode, as the bed
//! mode's peer (`-aa`: no GSI, which also turns off the front end's IPC security).

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ferry_netem::{find_in_path, End, Topology};

use crate::peers::PEER_USER;
use crate::plan::Dataset;
use crate::runner::{self, Server};

/// Parallel TCP streams per stripe (`-p`), and files in flight for a tree (`-cc`).
pub const STREAMS: u32 = 4;
/// Bytes each stripe takes in turn (`-sbs`, blocked layout).
pub const STRIPE_BLOCK: u64 = 1 << 20;
/// The K-path front end (or plain server) listens on `BASE_PORT + K`; data node `i` of it on
/// `DN_PORT + 10 K + i`.
const BASE_PORT: u16 = 2800;
const DN_PORT: u16 = 6000;

/// The GridFTP servers of one K, stopped on drop.
pub struct GridServers {
    pub k: usize,
    /// The front end (or the plain server) first, then the data nodes.
    servers: Vec<Server>,
    /// Where the servers write (as `nobody`), emptied around each transfer.
    pub root: PathBuf,
}

impl GridServers {
    /// Which server exited, if one did (a dead one fails the transfers after it).
    pub fn exited(&mut self) -> Option<String> {
        self.servers.iter_mut().find_map(|s| {
            s.child
                .try_wait()
                .ok()
                .flatten()
                .map(|st| format!("{} exited during the run ({st})", s.name))
        })
    }
}

/// Whether both programs are installed.
pub fn installed() -> bool {
    find_in_path("globus-gridftp-server").is_some() && find_in_path("globus-url-copy").is_some()
}

fn front_addr(t: &Topology, k: usize) -> SocketAddr {
    SocketAddr::from((t.addr(0, End::B), BASE_PORT + k as u16))
}

fn node_addr(t: &Topology, k: usize, i: usize) -> SocketAddr {
    SocketAddr::from((t.addr(i, End::B), DN_PORT + 10 * k as u16 + i as u16))
}

/// One `globus-gridftp-server` in `host` with these arguments, logging under `logs`.
fn spawn(t: &Topology, host: usize, name: String, args: &[String], logs: &Path) -> Result<Server> {
    let bin = find_in_path("globus-gridftp-server").context("no globus-gridftp-server")?;
    let file = name.replace(' ', "-");
    let log = logs.join(format!("{file}.out"));
    let own = logs.join(format!("{file}.log"));
    let f = fs::File::create(&log)?;
    let mut c = Command::new(bin);
    // Not GLOBUS_HOSTNAME, as the bed mode's peer: given an address, the server looks its name
    // up, which fails in a namespace without DNS. `-data-interface` names the address instead.
    c.args([
        "-aa",
        "-anonymous-user",
        PEER_USER,
        "-d",
        "error,warn",
        "-l",
    ])
    .arg(&own)
    .args(args)
    .stdin(Stdio::null())
    .stdout(f.try_clone()?)
    .stderr(f)
    .process_group(0);
    let child = t
        .spawn_in(host, c)
        .with_context(|| format!("starting {name}"))?;
    Ok(Server {
        name,
        child,
        log,
        own_log: Some(own),
    })
}

/// The servers of one K in `server`: the data nodes, then the front end (K = 1: one plain
/// server); ready once the client's host reaches each.
pub fn start(
    t: &Topology,
    server: usize,
    client: usize,
    k: usize,
    work: &Path,
    logs: &Path,
) -> Result<GridServers> {
    let root = work.join("mp-dest").join(format!("gridftp-k{k}"));
    fs::create_dir_all(&root)?;
    // The servers write as `nobody`.
    fs::set_permissions(&root, fs::Permissions::from_mode(0o777))?;
    clear_dir(&root)?;
    let mut servers = Vec::new();
    let front = front_addr(t, k);
    let mut remote = Vec::new();
    if k > 1 {
        for i in 0..k {
            let a = node_addr(t, k, i);
            let args = [
                "-dn".to_owned(),
                "-p".into(),
                a.port().to_string(),
                "-data-interface".into(),
                a.ip().to_string(),
            ];
            let name = format!("gridftp k{k} data node {i}");
            servers.push(spawn(t, server, name, &args, logs)?);
            remote.push(a.to_string());
        }
    }
    let mut args = vec!["-p".to_owned(), front.port().to_string()];
    if k > 1 {
        args.extend(["-r".to_owned(), remote.join(",")]);
    } else {
        args.extend(["-data-interface".to_owned(), front.ip().to_string()]);
    }
    let name = format!("gridftp k{k} front end");
    servers.insert(0, spawn(t, server, name, &args, logs)?);
    let mut addrs = vec![front];
    if k > 1 {
        addrs.extend((0..k).map(|i| node_addr(t, k, i)));
    }
    for (s, a) in servers.iter_mut().zip(addrs) {
        wait_listening(t, client, s, a, Duration::from_secs(20))?;
    }
    Ok(GridServers { k, servers, root })
}

/// Waits until `addr` accepts from `from`.
fn wait_listening(
    t: &Topology,
    from: usize,
    s: &mut Server,
    addr: SocketAddr,
    limit: Duration,
) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let up = t
            .run_in(from, || {
                TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
            })
            .unwrap_or(false);
        if up {
            return Ok(());
        }
        if let Ok(Some(st)) = s.child.try_wait() {
            bail!("{} exited ({st}): {}", s.name, runner::short(&s.logs()));
        }
        if t0.elapsed() > limit {
            bail!("{} not listening at {addr} after {limit:?}", s.name);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `globus-url-copy` in `client`: `-stripe` over K > 1 links, `-p` streams per stripe; a tree
/// recursively (`-r -cd`) with `-cc` files in flight.
pub fn client_cmd(
    t: &Topology,
    client: usize,
    g: &GridServers,
    src: &Path,
    ds: &Dataset,
) -> Result<Command> {
    let bin = find_in_path("globus-url-copy").context("no globus-url-copy")?;
    let mut c = Command::new(bin);
    // Passive data connections (the server names its addresses): no GLOBUS_HOSTNAME needed.
    c.args(["-fast", "-p", &STREAMS.to_string()]);
    if g.k > 1 {
        // Blocked layout, the server's default block: without `-sbs` this client sent every
        // byte to one data node.
        c.args(["-stripe", "-sbs", &STRIPE_BLOCK.to_string()]);
    }
    let tree = !ds.is_file();
    if tree {
        c.args(["-r", "-cd", "-cc", &STREAMS.to_string()]);
    }
    let slash = if tree { "/" } else { "" };
    c.arg(format!("file://{}{slash}", src.display()))
        .arg(format!(
            "ftp://{}{}{slash}",
            front_addr(t, g.k),
            g.root.join(ds.label()).display()
        ));
    t.enter(client, &mut c)?;
    Ok(c)
}

/// Removes everything in `dir`.
pub fn clear_dir(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        crate::data::remove_path(&e?.path())?;
    }
    Ok(())
}
