//! Where the bench's data sets and destinations live: the file system type of a directory
//! (statfs f_type, so a summary says whether it measured a disk or tmpfs) and whether it has
//! room for a sweep.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Name of a statfs `f_type` magic number (linux/magic.h), else its hex value.
pub fn fs_type_name(magic: u64) -> String {
    match magic {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0x6573_5546 => "fuse".into(),
        0xFF53_4D42 => "cifs".into(),
        0x0BD0_0BD0 => "lustre".into(),
        0x4750_4653 => "gpfs".into(),
        0x5346_544E => "ntfs".into(),
        0x858458F6 => "ramfs".into(),
        o => format!("0x{o:x}"),
    }
}

fn statfs(p: &Path) -> Result<libc::statfs> {
    let c = CString::new(p.as_os_str().as_bytes()).context("path with a NUL byte")?;
    // SAFETY: an all-zero statfs is a valid value for the call to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path and st a live local.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", p.display()));
    }
    Ok(st)
}

/// The file system type holding `p` ("ext4", "tmpfs", …).
pub fn fs_type(p: &Path) -> Result<String> {
    Ok(fs_type_name(statfs(p)?.f_type as u64))
}

/// Bytes an unprivileged writer may still use on the file system holding `p`.
pub fn free_bytes(p: &Path) -> Result<u64> {
    let st = statfs(p)?;
    Ok((st.f_bavail as u64).saturating_mul(st.f_bsize as u64))
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// Fails with a clear message when `free` bytes cannot hold `need` (with 5% and 256 MiB to
/// spare for logs and metadata); else says how much room there is.
pub fn check_room(dir: &Path, fs: &str, free: u64, need: u64) -> Result<String> {
    let want = need + need / 20 + (256 << 20);
    if free < want {
        bail!(
            "not enough room in {} ({fs}): {} free, this sweep needs about {} (data sets and \
             their copies); free some space, pass --work on a larger file system, or choose \
             smaller data sets",
            dir.display(),
            gib(free),
            gib(want)
        );
    }
    Ok(format!(
        "{} ({fs}): {} free, about {} needed",
        dir.display(),
        gib(free),
        gib(want)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_room() {
        assert_eq!(fs_type_name(0xEF53), "ext4");
        assert_eq!(fs_type_name(0x0102_1994), "tmpfs");
        assert_eq!(fs_type_name(0x1234), "0x1234");
        let d = Path::new("/work");
        let ok = check_room(d, "ext4", 10 << 30, 1 << 30).unwrap();
        assert!(ok.contains("10.0 GiB free, about 1.3 GiB needed"), "{ok}");
        let e = check_room(d, "ext4", 1 << 30, 2 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not enough room in /work (ext4)"), "{e}");
        assert!(
            e.contains("1.0 GiB free, this sweep needs about 2.3 GiB"),
            "{e}"
        );
    }

    #[test]
    fn this_machine() {
        let t = tempfile::tempdir().unwrap();
        let ty = fs_type(t.path()).unwrap();
        assert!(!ty.is_empty());
        assert!(free_bytes(t.path()).unwrap() > 0);
        assert!(fs_type(Path::new("/no/such/dir")).is_err());
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(fs_type(Path::new("/dev/shm")).unwrap(), "tmpfs");
        }
    }
}
