//! Processes the benchmark starts, each killed by its PID when dropped, and the network
//! namespaces they hold.

use std::io::{Read, Seek, SeekFrom};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Something with a network namespace the benchmark can run commands in.
pub trait Netns {
    /// `/proc/PID/ns/net` of a process in it.
    fn netns_path(&self) -> String;

    /// `nsenter --net=… -- PROG`: PROG in this network namespace (as the benchmark's user).
    fn command(&self, prog: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns_path())).arg("--").arg(prog);
        cmd
    }

    /// `ip ARGS` in this namespace; fails with ip's message.
    fn ip(&self, args: &[&str]) -> Result<()> {
        checked(self.command("ip").args(args))
    }
}

/// Runs `cmd` to completion; an error carrying its stderr when it fails.
pub fn checked(cmd: &mut Command) -> Result<()> {
    output(cmd).map(drop)
}

/// Runs `cmd` to completion and returns its stdout; an error carrying its stderr when it fails.
pub fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A child process, SIGKILLed and reaped on drop. It is started under `setpriv --pdeathsig KILL`
/// so that it also dies if the benchmark itself is killed; every program in the chain execs
/// (nsenter without --pid, unshare without --fork), so the PID is that of the last program.
pub struct Guard {
    child: Child,
    what: String,
    /// Its stderr, read back when it exits early.
    stderr: std::fs::File,
}

impl Guard {
    /// Starts `prog args…`, stdin and stdout on /dev/null, stderr to an unnamed temp file.
    pub fn spawn(prog: &str, args: &[String]) -> Result<Self> {
        let stderr = tempfile::tempfile()?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--", prog]).args(args);
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr.try_clone()?);
        let what = format!("{prog} {}", args.join(" "));
        let child = cmd.spawn().with_context(|| format!("start {what}"))?;
        Ok(Guard { child, what, stderr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            Some(status) => {
                let mut stderr = String::new();
                self.stderr.seek(SeekFrom::Start(0))?;
                self.stderr.read_to_string(&mut stderr)?;
                bail!("`{}` exited ({status}): {}", self.what, stderr.trim())
            }
            None => Ok(()),
        }
    }

    /// Waits (bounded) until the process runs `comm` in a network namespace other than
    /// `outer`, i.e. until the exec chain that creates or enters it is done.
    pub fn wait_in_new_netns(&mut self, comm: &str, outer: &str) -> Result<()> {
        let outer = std::fs::read_link(outer).with_context(|| format!("read {outer}"))?;
        let pid = self.pid();
        wait_until(&format!("process {pid} to run {comm} in its own namespace"), || {
            self.check_running()?;
            let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            let now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            Ok(ns.is_some_and(|ns| ns != outer) && now.trim() == comm)
        })
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// Polls `ready` every 20 ms for at most 10 s.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The benchmark's own network namespace.
pub struct Own;

impl Netns for Own {
    fn netns_path(&self) -> String {
        "/proc/self/ns/net".into()
    }
}

/// A fresh network namespace held by a sleeping process, created from inside `parent`; it goes
/// when the process is killed.
pub struct Namespace {
    holder: Guard,
}

impl Namespace {
    pub fn new(parent: &dyn Netns) -> Result<Self> {
        let outer = parent.netns_path();
        let args = [format!("--net={outer}"), "--".into(), "unshare".into(), "--net".into()];
        let args: Vec<String> =
            args.into_iter().chain(["--", "sleep", "infinity"].map(String::from)).collect();
        let mut holder = Guard::spawn("nsenter", &args)?;
        holder.wait_in_new_netns("sleep", &outer)?;
        let ns = Namespace { holder };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Netns for Namespace {
    fn netns_path(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.pid())
    }
}

/// One end of a veth pair: its namespace, interface name and address (with prefix).
pub struct End<'a> {
    pub ns: &'a dyn Netns,
    pub name: &'a str,
    pub address: &'a str,
}

/// A veth pair between `a` and `b`, created from inside `a` (nothing appears in the benchmark's
/// own namespace), both ends up with `mtu` and their addresses.
pub fn veth(a: &End<'_>, b: &End<'_>, mtu: u32) -> Result<()> {
    let mtu = mtu.to_string();
    let b_ns = b.ns.netns_path();
    a.ns.ip(&["link", "add", a.name, "mtu", &mtu, "type", "veth", "peer", "name", b.name, "mtu", &mtu])?;
    a.ns.ip(&["link", "set", b.name, "netns", &b_ns])?;
    for end in [a, b] {
        end.ns.ip(&["addr", "add", end.address, "dev", end.name])?;
        end.ns.ip(&["link", "set", end.name, "up"])?;
    }
    Ok(())
}
