//! Starting a container's process inside its Pod: the Pod's network namespace, a
//! mount namespace of its own with the volumes at their `mountPath`, the Pod's name
//! as hostname, the securityContext's user and group, and a session of its own so a
//! signal reaches every process it started.
//!
//! The work between fork and exec is raw system calls, hence the `unsafe` this crate
//! alone in the workspace allows: everything it needs (paths, descriptors) is
//! prepared by the parent so the child allocates nothing.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One bind mount: a host path (file or directory) shown at `target` in the container.
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

pub struct ContainerProcess {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub netns: PathBuf,
    pub hostname: String,
    pub mounts: Vec<Mount>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub supplemental_groups: Vec<u32>,
    pub working_dir: Option<PathBuf>,
    pub log: PathBuf,
}

/// Descriptors numbered above anything the child inherits otherwise: dup2 onto them
/// clears close-on-exec, so `/proc/self/fd/N` still names them after the mounts (an
/// emptyDir on /tmp may hide the paths they were opened by).
const FD_BASE: i32 = 300;

pub fn spawn(p: &ContainerProcess) -> Result<tokio::process::Child> {
    let netns = File::open(&p.netns).with_context(|| format!("open {}", p.netns.display()))?;
    let program = File::open(&p.program).with_context(|| format!("open {}", p.program.display()))?;
    let mut sources: Vec<CString> = Vec::new();
    let mut targets: Vec<CString> = Vec::new();
    let mut read_only: Vec<bool> = Vec::new();
    for m in &p.mounts {
        prepare_target(&m.source, &m.target)?;
        sources.push(cstring(m.source.as_os_str().as_bytes())?);
        targets.push(cstring(m.target.as_os_str().as_bytes())?);
        read_only.push(m.read_only);
    }
    let source_links: Vec<CString> = (0..sources.len())
        .map(|i| cstring(format!("/proc/self/fd/{}", FD_BASE + 1 + i as i32).as_bytes()))
        .collect::<Result<_>>()?;
    let hostname = p.hostname.clone().into_bytes();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&p.log)?;
    let log_err = log.try_clone()?;

    let mut cmd = tokio::process::Command::new(format!("/proc/self/fd/{FD_BASE}"));
    cmd.arg0(&p.program);
    cmd.args(&p.args);
    cmd.env_clear();
    for (k, v) in &p.env {
        cmd.env(k, v);
    }
    cmd.stdin(std::process::Stdio::null());
    cmd.stdout(log);
    cmd.stderr(log_err);
    cmd.current_dir("/");
    cmd.kill_on_drop(false);

    let netns_fd = netns.as_raw_fd();
    let program_fd = program.as_raw_fd();
    let uid = p.uid;
    let gid = p.gid;
    let groups: Vec<libc::gid_t> = p.supplemental_groups.clone();
    let workdir = p.working_dir.as_ref().map(|w| cstring(w.as_os_str().as_bytes())).transpose()?;
    let root = cstring(b"/")?;

    // SAFETY: the closure runs in the forked child before exec and only makes
    // system calls on data prepared above; it neither allocates nor takes locks.
    unsafe {
        cmd.pre_exec(move || {
            // A failing step names itself in the container's log (stderr is set up
            // by now); the error returned carries only errno.
            let check = |step: &[u8], r: libc::c_int| {
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    libc::write(2, b"test node: container setup failed at ".as_ptr().cast(), 37);
                    libc::write(2, step.as_ptr().cast(), step.len());
                    libc::write(2, b"\n".as_ptr().cast(), 1);
                    Err(e)
                } else {
                    Ok(())
                }
            };
            check(b"dup2 program", libc::dup2(program_fd, FD_BASE))?;
            check(b"setns", libc::setns(netns_fd, libc::CLONE_NEWNET))?;
            check(b"unshare", libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            // Every source is opened before the first mount (an emptyDir on /tmp
            // would hide sources under /tmp) and after unshare: a bind mount takes
            // its source only from the caller's own mount namespace.
            for (i, src) in sources.iter().enumerate() {
                let fd = libc::open(src.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                check(b"open volume", fd)?;
                check(b"dup2 volume", libc::dup2(fd, FD_BASE + 1 + i as i32))?;
                libc::close(fd);
            }
            // Mounts made here stay in this namespace.
            check(
                b"mount private",
                libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ),
            )?;
            check(b"sethostname", libc::sethostname(hostname.as_ptr().cast(), hostname.len()))?;
            for i in 0..targets.len() {
                check(
                    b"bind mount",
                    libc::mount(
                        source_links[i].as_ptr(),
                        targets[i].as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ),
                )?;
                if read_only[i] {
                    check(
                        b"read-only remount",
                        libc::mount(
                            std::ptr::null(),
                            targets[i].as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                            std::ptr::null(),
                        ),
                    )?;
                }
            }
            for i in 0..targets.len() {
                libc::close(FD_BASE + 1 + i as i32);
            }
            check(b"setsid", libc::setsid())?;
            if let Some(g) = gid {
                check(b"setgroups", libc::setgroups(groups.len(), groups.as_ptr()))?;
                check(b"setgid", libc::setgid(g))?;
            }
            if let Some(u) = uid {
                if gid.is_none() {
                    check(b"setgroups", libc::setgroups(0, std::ptr::null()))?;
                }
                check(b"setuid", libc::setuid(u))?;
                // A process that changed its uid is not dumpable, which makes its
                // /proc/self/fd unreadable to itself: exec through it needs it back.
                check(b"dumpable", libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
            }
            if let Some(w) = &workdir {
                check(b"chdir", libc::chdir(w.as_ptr()))?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("start {}", p.program.display()))?;
    drop((netns, program));
    Ok(child)
}

fn cstring(b: &[u8]) -> Result<CString> {
    CString::new(b).context("path with a NUL byte")
}

/// A bind mount needs its target to exist and be of the source's kind. The empty
/// directory or file made on the host is what every mount namespace sees
/// underneath; the content stays in the Pod's namespace.
fn prepare_target(source: &Path, target: &Path) -> Result<()> {
    if target.exists() {
        return Ok(());
    }
    if source.is_dir() {
        std::fs::create_dir_all(target).with_context(|| format!("mkdir {}", target.display()))?;
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        File::create(target).with_context(|| format!("create {}", target.display()))?;
    }
    Ok(())
}

/// Signals a container's whole session (it leads its own, see `setsid` above).
pub fn signal_group(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a negative pid addresses a process group; no memory involved.
    unsafe {
        libc::kill(-(pid as i32), signal);
    }
}
