//! The container shim: one small process per container that owns its standard streams — it
//! writes the output into the CRI log, feeds the container's stdin, holds its terminal, and
//! serves attach sessions — and outlives the runtime.
//!
//! Without a terminal the container writes into two FIFOs in its directory (and reads a third
//! when it has stdin); with one, crun sends the terminal's master to the shim's console socket.
//! The shim appends CRI records (see [`crate::engine::write_cri_line`]) to the log path the
//! kubelet gave. Because the shim is its own process (its own process group, not a child the
//! runtime must keep), a runtime that is killed and restarted leaves every container's streams
//! working: nothing the container holds points into the runtime. SIGUSR1 makes the shim reopen
//! the log path (ReopenContainerLog); the runtime finds the shim again after a restart by the
//! PID in the container's record, checked against `/proc/<pid>/cmdline`.
//!
//! Attach sessions connect to the shim's attach socket and speak [`frame`]s: output as it is
//! produced (not what came before), stdin data, end of stdin, terminal sizes. A client that
//! does not keep up is disconnected rather than ever blocking the container.
//!
//! The shim reads with `poll`: a FIFO opened for reading before any writer reports nothing
//! until a writer has come and gone, so the shim can start first and still see end-of-file
//! exactly when the container and everything it forked have closed their output. It exits then.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::engine::{LogStream, write_cri_line};

/// The first argument that runs `hpk-pod-runtime` as a container shim.
pub const SUBCOMMAND: &str = "log-shim";

/// Bytes read per wake-up.
const CHUNK: usize = 64 * 1024;

/// A line longer than this is written out as partial records before its end arrives, so a
/// container printing without newlines cannot grow the shim.
const MAX_PENDING_LINE: usize = 16 * 1024;

/// Output queued for one attach client before it is disconnected as too slow; also the most
/// stdin queued for the container, and the largest frame accepted.
const MAX_BUFFER: usize = 1024 * 1024;

/// What a shim connects where.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "hpk-pod-runtime log-shim", about = "Owns a container's standard streams")]
pub struct Args {
    /// The container (for `ps` and for the runtime to recognise its shim).
    #[arg(long)]
    pub id: String,
    /// The FIFO the container's stdout goes into (no terminal).
    #[arg(long, requires = "stderr", conflicts_with = "console_socket")]
    pub stdout: Option<PathBuf>,
    /// The FIFO the container's stderr goes into (no terminal).
    #[arg(long, requires = "stdout")]
    pub stderr: Option<PathBuf>,
    /// Where crun sends the master of the container's terminal.
    #[arg(long, required_unless_present = "stdout")]
    pub console_socket: Option<PathBuf>,
    /// The FIFO the container reads as stdin (no terminal).
    #[arg(long, conflicts_with = "console_socket")]
    pub stdin: Option<PathBuf>,
    /// Close the container's stdin when the first attached client closes its stdin.
    #[arg(long)]
    pub stdin_once: bool,
    /// The socket attach sessions connect to.
    #[arg(long)]
    pub attach: PathBuf,
    /// The CRI log file, reopened on SIGUSR1; without one, output only goes to attach sessions.
    #[arg(long)]
    pub log: Option<PathBuf>,
}

/// The attach protocol: `[kind: u8][length: u32, big endian][payload]`.
pub mod frame {
    /// Client to shim: bytes for the container's stdin.
    pub const STDIN: u8 = 0;
    /// Client to shim: the client's stdin ended.
    pub const STDIN_EOF: u8 = 1;
    /// Client to shim: the terminal's size, `[width: u16][height: u16]` big endian.
    pub const RESIZE: u8 = 2;
    /// Shim to client: the container's stdout (or terminal) output.
    pub const STDOUT: u8 = 3;
    /// Shim to client: the container's stderr output.
    pub const STDERR: u8 = 4;

    /// Encodes one frame.
    pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(payload.len() + 5);
        out.push(kind);
        out.extend_from_slice(&u32::try_from(payload.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// Takes one whole frame off the front of `buf`: `Ok(None)` when more bytes are needed,
    /// an error for a frame longer than `max`.
    pub fn decode(buf: &mut Vec<u8>, max: usize) -> Result<Option<(u8, Vec<u8>)>, String> {
        if buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > max {
            return Err(format!("frame of {len} bytes exceeds {max}"));
        }
        if buf.len() < 5 + len {
            return Ok(None);
        }
        let kind = buf[0];
        let payload = buf[5..5 + len].to_vec();
        buf.drain(..5 + len);
        Ok(Some((kind, payload)))
    }
}

/// Whether `pid` is the shim of container `id` (PIDs are reused; the record may be stale).
pub fn is_shim_of(pid: u32, id: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.contains(&SUBCOMMAND.as_bytes()) && args.contains(&id.as_bytes())
}

/// Runs the shim: opens its FIFOs and sockets, says `ready` on stdout, and serves until the
/// container's output has ended.
pub fn run(args: &Args) -> io::Result<()> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGUSR1);
    signals.thread_block().map_err(io::Error::from)?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut shim = Shim {
        id: args.id.clone(),
        log_path: args.log.clone(),
        log: args.log.as_deref().map(open_log).transpose()?,
        sources: Vec::new(),
        console: None,
        terminal: None,
        stdin: None,
        stdin_pending: Vec::new(),
        stdin_once: args.stdin_once,
        stdin_closing: false,
        attach: bind(&args.attach)?,
        clients: Vec::new(),
    };
    if let (Some(out), Some(err)) = (&args.stdout, &args.stderr) {
        shim.sources.push(Source::open(out, LogStream::Stdout)?);
        shim.sources.push(Source::open(err, LogStream::Stderr)?);
    }
    if let Some(path) = &args.console_socket {
        shim.console = Some(bind(path)?);
    }
    if let Some(path) = &args.stdin {
        // Read-write: opening never waits for the container, and the container sees end of
        // input only when the shim closes it.
        shim.stdin = Some(
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?,
        );
    }
    {
        let mut stdout = io::stdout().lock();
        stdout.write_all(b"ready\n")?;
        stdout.flush()?;
    }
    while !shim.output_ended() {
        shim.turn(&signal_fd)?;
    }
    shim.finish();
    Ok(())
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .map_err(|e| io::Error::new(e.kind(), format!("listening on {}: {e}", path.display())))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

/// Which descriptor a poll slot watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Signal,
    Source(usize),
    Console,
    Attach,
    Client(usize),
    Stdin,
}

struct Shim {
    id: String,
    log_path: Option<PathBuf>,
    log: Option<File>,
    /// Output the container writes: two FIFOs, or the terminal's master.
    sources: Vec<Source>,
    /// Where crun sends the terminal, until it has.
    console: Option<UnixListener>,
    /// The terminal's master, for input and sizes.
    terminal: Option<File>,
    /// The container's stdin FIFO (no terminal).
    stdin: Option<File>,
    stdin_pending: Vec<u8>,
    stdin_once: bool,
    /// Close stdin once what is pending is written.
    stdin_closing: bool,
    attach: UnixListener,
    clients: Vec<Client>,
}

impl Shim {
    /// Output has ended: every source reached its end (a terminal not yet received has not).
    fn output_ended(&self) -> bool {
        self.console.is_none() && self.sources.iter().all(|s| s.done)
    }

    /// One wait for something to do, and doing it.
    fn turn(&mut self, signal_fd: &SignalFd) -> io::Result<()> {
        let mut slots = vec![Slot::Signal];
        let mut fds = vec![PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN)];
        for (i, s) in self.sources.iter().enumerate().filter(|(_, s)| !s.done) {
            slots.push(Slot::Source(i));
            fds.push(PollFd::new(s.file.as_fd(), PollFlags::POLLIN));
        }
        if let Some(console) = &self.console {
            slots.push(Slot::Console);
            fds.push(PollFd::new(console.as_fd(), PollFlags::POLLIN));
        }
        slots.push(Slot::Attach);
        fds.push(PollFd::new(self.attach.as_fd(), PollFlags::POLLIN));
        for (i, c) in self.clients.iter().enumerate() {
            let mut flags = if c.read_closed { PollFlags::empty() } else { PollFlags::POLLIN };
            if !c.out.is_empty() {
                flags |= PollFlags::POLLOUT;
            }
            slots.push(Slot::Client(i));
            fds.push(PollFd::new(c.stream.as_fd(), flags));
        }
        let stdin_fd = if self.stdin_pending.is_empty() { None } else { self.stdin_target() };
        if let Some(fd) = stdin_fd {
            slots.push(Slot::Stdin);
            fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let woke: Vec<(Slot, PollFlags)> = slots
            .iter()
            .zip(fds.iter())
            .filter_map(|(slot, fd)| fd.revents().filter(|r| !r.is_empty()).map(|r| (*slot, r)))
            .collect();
        drop(fds);
        let mut gone = Vec::new();
        for (slot, events) in woke {
            match slot {
                Slot::Signal => {
                    while let Ok(Some(_)) = signal_fd.read_signal() {}
                    self.reopen_log();
                }
                Slot::Source(i) => self.pump(i),
                Slot::Console => self.receive_terminal(),
                Slot::Attach => self.accept_clients(),
                Slot::Client(i) => {
                    let hung_up = events.intersects(PollFlags::POLLHUP | PollFlags::POLLERR);
                    if !self.serve_client(i) || (hung_up && self.clients[i].read_closed) {
                        gone.push(i);
                    }
                }
                Slot::Stdin => self.write_stdin(),
            }
        }
        for i in gone.into_iter().rev() {
            self.clients.swap_remove(i);
        }
        Ok(())
    }

    fn stdin_target(&self) -> Option<&File> {
        self.terminal.as_ref().or(self.stdin.as_ref())
    }

    fn reopen_log(&mut self) {
        let Some(path) = &self.log_path else { return };
        match open_log(path) {
            Ok(file) => self.log = Some(file),
            Err(e) => eprintln!("log-shim {}: reopening {}: {e}", self.id, path.display()),
        }
    }

    /// Reads what a source has: raw to the attached clients, lines to the log.
    fn pump(&mut self, i: usize) {
        let mut buf = vec![0u8; CHUNK];
        let source = &mut self.sources[i];
        let n = match source.file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                return;
            }
            // A terminal whose every slave is closed reads EIO: its end.
            Err(_) => 0,
        };
        if n == 0 {
            source.done = true;
            if !source.pending.is_empty() {
                source.write(self.log.as_mut(), &self.id, false);
            }
            return;
        }
        let kind = if source.kind == LogStream::Stderr { frame::STDERR } else { frame::STDOUT };
        let encoded = frame::encode(kind, &buf[..n]);
        self.clients.retain_mut(|c| c.queue(&encoded));
        let source = &mut self.sources[i];
        source.pending.extend_from_slice(&buf[..n]);
        while let Some(end) = source.pending.iter().position(|b| *b == b'\n') {
            let rest = source.pending.split_off(end + 1);
            source.pending.pop();
            // A terminal ends lines with CR LF.
            if source.pending.last() == Some(&b'\r') {
                source.pending.pop();
            }
            source.write(self.log.as_mut(), &self.id, true);
            source.pending = rest;
        }
        if source.pending.len() >= MAX_PENDING_LINE {
            source.write(self.log.as_mut(), &self.id, false);
        }
    }

    fn receive_terminal(&mut self) {
        let Some(console) = &self.console else { return };
        let master = match console.accept() {
            Ok((conn, _)) => receive_fd(&conn),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => Err(e),
        };
        match master.and_then(|fd| {
            let file = File::from(fd);
            let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)?;
            let mut flags = nix::fcntl::OFlag::from_bits_truncate(flags);
            flags.insert(nix::fcntl::OFlag::O_NONBLOCK);
            nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags))?;
            Ok(file)
        }) {
            Ok(file) => {
                match file.try_clone() {
                    Ok(reader) => self.sources.push(Source {
                        file: reader,
                        kind: LogStream::Stdout,
                        pending: Vec::new(),
                        done: false,
                    }),
                    Err(e) => eprintln!("log-shim {}: duplicating the terminal: {e}", self.id),
                }
                self.terminal = Some(file);
                self.console = None;
            }
            Err(e) => eprintln!("log-shim {}: receiving the terminal: {e}", self.id),
        }
    }

    fn accept_clients(&mut self) {
        loop {
            match self.attach.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_ok() {
                        self.clients.push(Client {
                            stream,
                            inbound: Vec::new(),
                            out: Vec::new(),
                            read_closed: false,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    /// Reads a client's frames and writes what is queued for it; `false` when it is gone.
    fn serve_client(&mut self, i: usize) -> bool {
        let client = &mut self.clients[i];
        if !client.flush() {
            return false;
        }
        let mut buf = [0u8; CHUNK];
        while !client.read_closed {
            match client.stream.read(&mut buf) {
                // It sends nothing more (no stdin, or its end was sent): it still gets output.
                Ok(0) => client.read_closed = true,
                Ok(n) => client.inbound.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        let mut frames = Vec::new();
        let mut detach = false;
        loop {
            match frame::decode(&mut self.clients[i].inbound, MAX_BUFFER) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => {
                    eprintln!("log-shim {}: attach client: {e}", self.id);
                    return false;
                }
            }
        }
        for (kind, payload) in frames {
            match kind {
                frame::STDIN if self.stdin_target().is_some() && !self.stdin_closing => {
                    if self.stdin_pending.len() + payload.len() > MAX_BUFFER {
                        eprintln!("log-shim {}: stdin backlog full; input dropped", self.id);
                    } else {
                        self.stdin_pending.extend_from_slice(&payload);
                        self.write_stdin();
                    }
                }
                frame::STDIN_EOF if self.stdin_once && self.stdin.is_some() => {
                    self.stdin_closing = true;
                    self.write_stdin();
                }
                // The end of a client's input where the container's stdin stays open (not
                // `stdinOnce`, or a terminal): the client is done and detached, as containerd
                // and Docker do. Its session ends, so `kubectl attach -i` (or `run -i
                // --leave-stdin-open`) returns once its input has ended, and the container goes
                // on with its stdin open. What the client sent is still written.
                frame::STDIN_EOF if self.stdin_target().is_some() => detach = true,
                frame::RESIZE if payload.len() == 4 => {
                    if let Some(terminal) = &self.terminal {
                        let size = rustix::termios::Winsize {
                            ws_col: u16::from_be_bytes([payload[0], payload[1]]),
                            ws_row: u16::from_be_bytes([payload[2], payload[3]]),
                            ws_xpixel: 0,
                            ws_ypixel: 0,
                        };
                        let _ = rustix::termios::tcsetwinsize(terminal, size);
                    }
                }
                _ => {}
            }
        }
        !detach
    }

    /// Writes pending stdin without blocking; closes the stdin FIFO when asked to and done.
    fn write_stdin(&mut self) {
        let Self { terminal, stdin, stdin_pending, .. } = self;
        if let Some(mut target) = terminal.as_ref().or(stdin.as_ref()) {
            while !stdin_pending.is_empty() {
                match target.write(stdin_pending) {
                    Ok(n) => {
                        stdin_pending.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => {
                        stdin_pending.clear();
                        break;
                    }
                }
            }
        }
        if self.stdin_closing && self.stdin_pending.is_empty() {
            self.stdin = None;
        }
    }

    /// The container's output ended: hand the clients what is queued, then close them.
    fn finish(&mut self) {
        for client in &mut self.clients {
            let _ = client.stream.set_nonblocking(false);
            let _ = client.stream.set_write_timeout(Some(std::time::Duration::from_secs(1)));
            let _ = client.stream.write_all(&client.out);
        }
    }
}

/// One output stream of the container and the part of a line read from it so far.
struct Source {
    file: File,
    kind: LogStream,
    pending: Vec<u8>,
    done: bool,
}

impl Source {
    fn open(path: &Path, kind: LogStream) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
        Ok(Self { file, kind, pending: Vec::new(), done: false })
    }

    /// Writes `pending` as one record; a full disk loses the line, never blocks the container.
    fn write(&mut self, log: Option<&mut File>, id: &str, complete: bool) {
        if let Some(log) = log
            && let Err(e) = write_cri_line(log, self.kind, &self.pending, complete)
        {
            eprintln!("log-shim {id}: writing the log: {e}");
        }
        self.pending.clear();
    }
}

/// An attach session.
struct Client {
    stream: UnixStream,
    inbound: Vec<u8>,
    out: Vec<u8>,
    /// It shut down its sending side.
    read_closed: bool,
}

impl Client {
    /// Queues a frame; `false` (drop the client) when it has fallen too far behind.
    fn queue(&mut self, encoded: &[u8]) -> bool {
        if self.out.len() + encoded.len() > MAX_BUFFER {
            return false;
        }
        self.out.extend_from_slice(encoded);
        self.flush()
    }

    /// Writes what it can; `false` when the client is gone.
    fn flush(&mut self) -> bool {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => return false,
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }
}

/// Takes the descriptor crun sends with SCM_RIGHTS.
pub(crate) fn receive_fd(conn: &UnixStream) -> io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut buf = [0u8; 4096];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    recvmsg(conn, &mut [io::IoSliceMut::new(&mut buf)], &mut ancillary, RecvFlags::CMSG_CLOEXEC)?;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message
            && let Some(fd) = fds.next()
        {
            return Ok(fd);
        }
    }
    Err(io::Error::other("crun sent no terminal over the console socket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_pid_is_not_a_shim() {
        // This test process is no shim of anything.
        assert!(!is_shim_of(std::process::id(), "abc"));
        assert!(!is_shim_of(u32::MAX, "abc"));
    }

    #[test]
    fn frames_round_trip_and_refuse_oversize() {
        let mut buf = frame::encode(frame::STDIN, b"hello");
        buf.extend(frame::encode(frame::RESIZE, &[0, 80, 0, 24]));
        buf.extend_from_slice(&[frame::STDIN, 0, 0]);
        assert_eq!(frame::decode(&mut buf, 100), Ok(Some((frame::STDIN, b"hello".to_vec()))));
        assert_eq!(frame::decode(&mut buf, 100), Ok(Some((frame::RESIZE, vec![0, 80, 0, 24]))));
        assert_eq!(frame::decode(&mut buf, 100), Ok(None), "a partial header waits");
        let mut big = frame::encode(frame::STDIN, &[0u8; 200]);
        assert!(frame::decode(&mut big, 100).is_err());
    }
}
