//! Container logs in the CRI format: `<RFC 3339 nano time> <stream> <P|F> <content>` per line,
//! long lines split into partial (`P`) records.

use std::io::Write;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Longest record; longer lines are split into partial records, as the kubelet expects.
const MAX_RECORD: usize = 16 * 1024;

/// Which stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl LogStream {
    fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        }
    }
}

/// Writes `content` (without its newline) as one or more CRI log records.
pub fn write_cri_line(
    out: &mut impl Write,
    stream: LogStream,
    content: &[u8],
    complete: bool,
) -> std::io::Result<()> {
    let now = time::OffsetDateTime::now_utc();
    let stamp = now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    let chunks: Vec<&[u8]> =
        if content.is_empty() { vec![content] } else { content.chunks(MAX_RECORD).collect() };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let tag = if i == last && complete { "F" } else { "P" };
        let mut record = Vec::with_capacity(chunk.len() + 48);
        write!(record, "{stamp} {} {tag} ", stream.as_str())?;
        record.extend_from_slice(chunk);
        record.push(b'\n');
        out.write_all(&record)?;
    }
    out.flush()
}

/// Copies `input` line by line into `out` as CRI records until end of input.
pub async fn copy_lines(
    input: impl AsyncRead + Unpin,
    stream: LogStream,
    out: std::sync::Arc<std::sync::Mutex<std::fs::File>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(input);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Ok(());
        }
        let complete = line.last() == Some(&b'\n');
        if complete {
            line.pop();
        }
        let mut file = out.lock().map_err(|_| std::io::Error::other("log writer poisoned"))?;
        write_cri_line(&mut *file, stream, &line, complete)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_time_stream_tag_and_split_long_lines() {
        let mut out = Vec::new();
        write_cri_line(&mut out, LogStream::Stdout, b"hello", true).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        let fields: Vec<&str> = text.trim_end().splitn(4, ' ').collect();
        assert!(fields[0].ends_with('Z') && fields[0].contains('T'), "{text}");
        assert_eq!(&fields[1..], ["stdout", "F", "hello"]);

        let mut out = Vec::new();
        write_cri_line(&mut out, LogStream::Stderr, &vec![b'x'; MAX_RECORD + 1], true).expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        let tags: Vec<&str> = text.lines().map(|l| l.split(' ').nth(2).expect("tag")).collect();
        assert_eq!(tags, ["P", "F"]);
    }
}
