//! `tailLines`: where the N-th last record starts, found by reading the file backwards in chunks.

use std::io::{self, SeekFrom};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeek, AsyncSeekExt};

/// How much of the file is read at a time, going backwards.
pub(super) const CHUNK: usize = 64 * 1024;

/// The offset of the `n`-th last line of the first `len` bytes for which `counts` is true
/// (`counts` sees a line with its `\n`). Fewer such lines than `n`: 0. With `n == 0`: the end,
/// or with `skip_incomplete`, the end of the last complete line. `skip_incomplete` leaves out
/// the bytes after the last `\n` (a line still being written) without counting them.
/// Memory holds one chunk plus the longest line.
pub(super) async fn tail_start<F>(
    file: &mut F,
    len: u64,
    n: u64,
    skip_incomplete: bool,
    counts: impl Fn(&[u8]) -> bool,
) -> io::Result<u64>
where
    F: AsyncRead + AsyncSeek + Unpin,
{
    tail_start_in_chunks(file, len, n, skip_incomplete, counts, CHUNK).await
}

async fn tail_start_in_chunks<F>(
    file: &mut F,
    len: u64,
    n: u64,
    skip_incomplete: bool,
    counts: impl Fn(&[u8]) -> bool,
    chunk: usize,
) -> io::Result<u64>
where
    F: AsyncRead + AsyncSeek + Unpin,
{
    if n == 0 && !skip_incomplete {
        return Ok(len);
    }
    let mut tally = Tally { n, found: 0, skip_next: skip_incomplete, counts };
    // `lines` holds file[pos..pos + lines.len()]: the lines not yet looked at, the first of
    // which may begin before `pos`.
    let mut lines: Vec<u8> = Vec::new();
    let mut pos = len;
    while pos > 0 {
        let from = pos.saturating_sub(u64::try_from(chunk).unwrap_or(u64::MAX));
        let fresh = read_at(file, from, pos).await?;
        let fresh_len = fresh.len();
        lines = [fresh, lines].concat();
        pos = from;
        for index in (0..fresh_len).rev() {
            if lines[index] != b'\n' {
                continue;
            }
            if tally.line(&lines[index + 1..]) {
                return Ok(pos + index as u64 + 1);
            }
            lines.truncate(index + 1);
        }
    }
    tally.line(&lines);
    Ok(0)
}

async fn read_at<F>(file: &mut F, from: u64, to: u64) -> io::Result<Vec<u8>>
where
    F: AsyncRead + AsyncSeek + Unpin,
{
    let len = usize::try_from(to - from).map_err(io::Error::other)?;
    let mut bytes = vec![0; len];
    file.seek(SeekFrom::Start(from)).await?;
    file.read_exact(&mut bytes).await?;
    Ok(bytes)
}

/// Counts lines from the end until `n` are found.
struct Tally<C> {
    n: u64,
    found: u64,
    skip_next: bool,
    counts: C,
}

impl<C: Fn(&[u8]) -> bool> Tally<C> {
    /// Looks at the line before the previous one; true when the start is found there.
    fn line(&mut self, line: &[u8]) -> bool {
        if std::mem::take(&mut self.skip_next) {
            return self.n == 0;
        }
        let content = line.strip_suffix(b"\n").unwrap_or(line);
        if !content.is_empty() && (self.counts)(line) {
            self.found += 1;
        }
        self.found == self.n
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A line counts when it does not start with `#`.
    fn not_comment(line: &[u8]) -> bool {
        !line.starts_with(b"#")
    }

    async fn start(text: &str, n: u64, skip_incomplete: bool, chunk: usize) -> usize {
        let mut file = Cursor::new(text.as_bytes().to_vec());
        let len = text.len() as u64;
        let offset =
            tail_start_in_chunks(&mut file, len, n, skip_incomplete, not_comment, chunk).await.unwrap();
        usize::try_from(offset).unwrap()
    }

    async fn tail(text: &str, n: u64, skip_incomplete: bool) -> Vec<&str> {
        let mut starts = Vec::new();
        for chunk in [1, 2, 3, 7, 1024] {
            starts.push(start(text, n, skip_incomplete, chunk).await);
        }
        starts.dedup();
        starts.iter().map(|&offset| &text[offset..]).collect()
    }

    #[tokio::test]
    async fn last_lines_whatever_the_chunk_size() {
        let text = "one\ntwo\n#note\nthree\nfour\n";
        assert_eq!(tail(text, 1, false).await, ["four\n"]);
        assert_eq!(tail(text, 2, false).await, ["three\nfour\n"]);
        assert_eq!(tail(text, 3, false).await, ["two\n#note\nthree\nfour\n"]);
        assert_eq!(tail(text, 4, false).await, [text]);
        assert_eq!(tail(text, 99, false).await, [text]);
        assert_eq!(tail(text, 0, false).await, [""]);
        assert_eq!(tail(text, 0, true).await, [""]);
        assert_eq!(tail(text, 2, true).await, ["three\nfour\n"]);
    }

    #[tokio::test]
    async fn an_incomplete_last_line_counts_only_when_not_skipped() {
        let text = "one\ntwo\nthr";
        assert_eq!(tail(text, 1, false).await, ["thr"]);
        assert_eq!(tail(text, 2, false).await, ["two\nthr"]);
        assert_eq!(tail(text, 1, true).await, ["two\nthr"]);
        assert_eq!(tail(text, 0, true).await, ["thr"]);
        assert_eq!(tail("thr", 0, true).await, ["thr"]);
        assert_eq!(tail("thr", 1, true).await, ["thr"]);
        assert_eq!(tail("thr", 1, false).await, ["thr"]);
    }

    #[tokio::test]
    async fn empty_lines_and_files_never_count() {
        assert_eq!(tail("one\n\n\ntwo\n\n", 2, false).await, ["one\n\n\ntwo\n\n"]);
        assert_eq!(tail("", 3, false).await, [""]);
        assert_eq!(tail("", 0, true).await, [""]);
    }
}
