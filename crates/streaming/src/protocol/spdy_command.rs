//! exec/attach over SPDY/3.1 (`v2`–`v4.channel.k8s.io`): the client opens one stream per
//! `streamType` (error, stdin, stdout, stderr, resize); the status goes on the error stream.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{STREAM_CREATION_TIMEOUT, StreamOpts};
use crate::backend::{BoxReader, BoxWriter, Io};
use crate::error::{Error, Result};
use crate::pipe::forward_resizes;
use crate::spdy::{Session, SpdyStream, StreamWriter};
use crate::status::Outcome;

#[derive(Default)]
struct Streams {
    error: Option<SpdyStream>,
    stdin: Option<SpdyStream>,
    stdout: Option<SpdyStream>,
    stderr: Option<SpdyStream>,
    resize: Option<SpdyStream>,
}

pub(crate) async fn serve<IO, F, Fut>(
    io: IO,
    version: u8,
    opts: StreamOpts,
    verb: &'static str,
    run: F,
) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: FnOnce(Io) -> Fut + Send,
    Fut: Future<Output = std::result::Result<i32, String>> + Send,
{
    let (session, mut incoming) = Session::start(io);
    let resizable = version >= 3 && opts.tty;
    let expected = 1
        + usize::from(opts.stdin)
        + usize::from(opts.stdout)
        + usize::from(opts.stderr)
        + usize::from(resizable);
    let mut streams = Streams::default();
    let collect = async {
        let mut received = 0;
        while received < expected {
            let Some(new) = incoming.recv().await else {
                return Err(Error::Protocol("connection closed before the streams were created".into()));
            };
            let stream = new.accept()?;
            let slot = match stream.headers.get("streamtype").unwrap_or_default() {
                "error" => &mut streams.error,
                "stdin" => &mut streams.stdin,
                "stdout" => &mut streams.stdout,
                "stderr" => &mut streams.stderr,
                "resize" if version >= 3 => &mut streams.resize,
                other => {
                    tracing::debug!(stream_type = other, "unexpected stream type; ignored");
                    continue;
                }
            };
            *slot = Some(stream);
            received += 1;
        }
        Ok(())
    };
    match tokio::time::timeout(STREAM_CREATION_TIMEOUT, collect).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            session.close().await;
            return Err(e);
        }
        Err(_) => {
            session.close().await;
            return Err(Error::StreamCreationTimeout(STREAM_CREATION_TIMEOUT));
        }
    }
    // Further streams are refused from here on (nobody accepts them).
    drop(incoming);

    let mut keep: Vec<StreamWriter> = Vec::new();
    let stdin = streams.stdin.take().filter(|_| opts.stdin).map(|s| {
        keep.push(s.writer);
        Box::new(s.reader) as BoxReader
    });
    let writer =
        |s: Option<SpdyStream>, wanted: bool| s.filter(|_| wanted).map(|s| Box::new(s.writer) as BoxWriter);
    let stdout = writer(streams.stdout.take(), opts.stdout);
    let stderr = writer(streams.stderr.take(), opts.stderr);
    let resize = streams.resize.take().filter(|_| opts.tty).map(|s| {
        keep.push(s.writer);
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(forward_resizes(s.reader, tx));
        rx
    });

    // A client that goes away (EOF, reset, a broken frame) ends the session: the backend's
    // future is dropped, which ends what it started (an exec'd command is killed).
    let result = tokio::select! {
        result = run(Io { stdin, stdout, stderr, resize }) => result,
        () = session.closed() => {
            tracing::debug!(verb, "client gone before the session ended; session cancelled");
            drop(keep);
            session.close().await;
            return Ok(());
        }
    };
    let outcome = Outcome::from_backend(result, verb);
    if let Some(error) = streams.error.take() {
        let mut w = error.writer;
        if let Some(payload) = outcome.payload(version >= 4) {
            let _ = w.write_all(&payload).await;
        }
        let _ = w.shutdown().await;
    }
    drop(keep);
    session.close().await;
    Ok(())
}
