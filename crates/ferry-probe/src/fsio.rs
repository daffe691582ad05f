//! File-system helpers for the disk probe: aligned buffers, O_DIRECT, dropping and checking
//! page-cache residency, free space, syncfs, and what file system and device a path is on.

use std::alloc::Layout;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

use serde::Serialize;

/// Alignment of direct-I/O buffers, offsets and lengths: 4 KiB covers 512-byte and 4Kn devices.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// A heap buffer aligned for O_DIRECT.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` bytes (rounded up to the alignment) filled with pseudo-random data.
    pub(crate) fn new(len: usize, seed: u64) -> Self {
        let len = len.max(1).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).expect("valid layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        let mut b = AlignedBuf { ptr, layout };
        crate::speed::fill_pseudo_random(&mut b, seed);
        b
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() initialised bytes for the buffer's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Opens for reading or writing, with O_DIRECT when `direct`.
pub(crate) fn open(path: &Path, write: bool, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    if write {
        o.write(true);
    } else {
        o.read(true);
    }
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Whether the file system under `dir` accepts O_DIRECT: creates a file with it and writes one
/// aligned block. `Err` says why not (tmpfs answers EINVAL).
pub(crate) fn check_direct(dir: &Path) -> Result<(), String> {
    let p = dir.join("direct-check");
    let r = (|| {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)?;
        let buf = AlignedBuf::new(DIRECT_ALIGN, 1);
        std::os::unix::fs::FileExt::write_all_at(&f, &buf, 0)
    })();
    let _ = std::fs::remove_file(&p);
    r.map_err(|e| e.to_string())
}

/// Asks the kernel to drop the file's clean pages from the page cache.
pub(crate) fn drop_cache(f: &File) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// The fraction of the file's first `len` bytes that sits in the page cache (mmap + mincore).
pub(crate) fn resident_fraction(f: &File, len: u64) -> io::Result<f64> {
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let len = len as usize;
    // SAFETY: a fresh shared read-only mapping of a file we hold open; unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: addr..addr+len is our mapping and vec has one byte per page.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
    Ok(resident as f64 / pages as f64)
}

/// Bytes available to unprivileged users on the file system of `path`.
pub(crate) fn free_bytes(path: &Path) -> io::Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: statvfs writes into the zeroed struct; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// `syncfs(2)` on the file system holding `f`.
pub(crate) fn syncfs(f: &File) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::syncfs(f.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The mount a path lives on.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FsInfo {
    /// `ext4`, `xfs`, `tmpfs`, …
    pub fs_type: String,
    /// What is mounted, e.g. `/dev/nvme0n1p2`.
    pub source: String,
    pub mount_point: String,
    pub options: String,
}

/// The block device under a file system, from /sys/dev/block.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name of the whole device, e.g. `nvme0n1` (the partition's parent).
    pub name: String,
    pub model: Option<String>,
    pub rotational: Option<bool>,
    /// The I/O scheduler in use.
    pub scheduler: Option<String>,
    pub nr_requests: Option<u64>,
    pub logical_block_size: Option<u64>,
    pub max_sectors_kb: Option<u64>,
}

pub(crate) fn dev_major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

fn unescape_mount(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or(""), 8)
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Finds the mount of `path` (canonical) in mountinfo text: the last mount with the path's
/// device number whose mount point is the longest prefix of the path.
pub(crate) fn find_mount(mountinfo: &str, path: &Path, dev: u64) -> Option<FsInfo> {
    let (maj, min) = dev_major_minor(dev);
    let want = format!("{maj}:{min}");
    let mut best: Option<(usize, FsInfo)> = None;
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = pre.split_whitespace().collect();
        let g: Vec<&str> = post.split_whitespace().collect();
        if f.len() < 6 || g.len() < 2 || f[2] != want {
            continue;
        }
        let mp = unescape_mount(f[4]);
        if !path.starts_with(&mp) {
            continue;
        }
        let len = mp.len();
        if best.as_ref().is_none_or(|(l, _)| len >= *l) {
            best = Some((
                len,
                FsInfo {
                    fs_type: g[0].to_string(),
                    source: unescape_mount(g[1]),
                    mount_point: mp,
                    options: f[5].to_string(),
                },
            ));
        }
    }
    best.map(|(_, i)| i)
}

/// The file system and block device of `path`.
pub(crate) fn describe(path: &Path) -> (Option<FsInfo>, Option<BlockDevice>) {
    let Ok(meta) = std::fs::metadata(path) else {
        return (None, None);
    };
    let fs = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| find_mount(&m, path, meta.dev()));
    let (maj, min) = dev_major_minor(meta.dev());
    let mut sysdir = if maj != 0 {
        std::fs::canonicalize(format!("/sys/dev/block/{maj}:{min}")).ok()
    } else {
        None
    };
    // Anonymous device numbers (btrfs, overlay): try the mount source.
    if sysdir.is_none() {
        if let Some(name) = fs
            .as_ref()
            .and_then(|f| f.source.strip_prefix("/dev/"))
            .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
        {
            sysdir = std::fs::canonicalize(format!("/sys/class/block/{name}")).ok();
        }
    }
    let dev = sysdir.and_then(|mut d| {
        if d.join("partition").exists() {
            d = d.parent()?.to_path_buf();
        }
        let read = |p: &str| {
            std::fs::read_to_string(d.join(p))
                .ok()
                .map(|s| s.trim().to_string())
        };
        let num = |p: &str| read(p).and_then(|s| s.parse::<u64>().ok());
        Some(BlockDevice {
            name: d.file_name()?.to_string_lossy().into_owned(),
            model: read("device/model").filter(|s| !s.is_empty()),
            rotational: num("queue/rotational").map(|v| v != 0),
            scheduler: read("queue/scheduler").map(|s| {
                s.split_whitespace()
                    .find(|t| t.starts_with('['))
                    .map(|t| t.trim_matches(|c| c == '[' || c == ']').to_string())
                    .unwrap_or(s)
            }),
            nr_requests: num("queue/nr_requests"),
            logical_block_size: num("queue/logical_block_size"),
            max_sectors_kb: num("queue/max_sectors_kb"),
        })
    });
    (fs, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lookup() {
        let mi = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                  25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw\n\
                  30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=1k\n\
                  31 27 254:0 / /data\\040x rw - ext4 /dev/vda rw\n";
        let dev = |maj: u64, min: u64| (maj << 8) | min;
        let m = find_mount(mi, Path::new("/tmp/x"), dev(254, 0)).unwrap();
        assert_eq!((m.fs_type.as_str(), m.mount_point.as_str()), ("ext4", "/"));
        let m = find_mount(mi, Path::new("/dev/shm/a"), dev(0, 27)).unwrap();
        assert_eq!(m.options, "rw,relatime");
        assert_eq!(m.fs_type, "tmpfs");
        let m = find_mount(mi, Path::new("/data x/y"), dev(254, 0)).unwrap();
        assert_eq!(m.mount_point, "/data x");
        assert!(find_mount(mi, Path::new("/x"), dev(8, 1)).is_none());
        assert_eq!(dev_major_minor(65024), (254, 0));
    }

    #[test]
    fn aligned_buffers() {
        let b = AlignedBuf::new(5000, 3);
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(b.iter().any(|&x| x != 0));
    }
}
