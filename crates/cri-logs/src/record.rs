//! One line of a CRI log file, and how a client sees it.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::options::{LogOptions, LogStream};

/// The output stream a record was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Stdout,
    Stderr,
}

/// One record: `<RFC3339Nano timestamp> <stdout|stderr> <P|F>[:<more tags>] <content>`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Record<'a> {
    /// The timestamp as written in the file.
    pub(super) timestamp: &'a [u8],
    pub(super) time: OffsetDateTime,
    pub(super) source: Source,
    /// `P`: the content continues in the next record; `F`: a newline followed it.
    pub(super) partial: bool,
    pub(super) content: &'a [u8],
}

impl<'a> Record<'a> {
    /// Parses one line, without or with its `\n`; `None` when it is not in the CRI format.
    pub(super) fn parse(line: &'a [u8]) -> Option<Self> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let (timestamp, rest) = split_field(line)?;
        let (source, rest) = split_field(rest)?;
        // Content may be empty, and some writers then leave out the separating space.
        let (tags, content) = split_field(rest).unwrap_or((rest, &[]));
        let source = match source {
            b"stdout" => Source::Stdout,
            b"stderr" => Source::Stderr,
            _ => return None,
        };
        let partial = match tags.split(|&byte| byte == b':').next() {
            Some(b"P") => true,
            Some(b"F") => false,
            _ => return None,
        };
        let time = OffsetDateTime::parse(std::str::from_utf8(timestamp).ok()?, &Rfc3339).ok()?;
        Some(Self { timestamp, time, source, partial, content })
    }
}

fn split_field(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = bytes.iter().position(|&byte| byte == b' ')?;
    Some((&bytes[..space], &bytes[space + 1..]))
}

/// The part of [`LogOptions`] that applies to each record: which are shown, and how.
#[derive(Debug, Clone)]
pub(super) struct Render {
    stream: LogStream,
    since: Option<OffsetDateTime>,
    timestamps: bool,
}

impl Render {
    pub(super) fn new(options: &LogOptions) -> Self {
        Self { stream: options.stream, since: options.since, timestamps: options.timestamps }
    }

    /// Whether the record belongs to the chosen stream (what `tailLines` counts).
    pub(super) fn in_stream(&self, record: &Record<'_>) -> bool {
        match self.stream {
            LogStream::All => true,
            LogStream::Stdout => record.source == Source::Stdout,
            LogStream::Stderr => record.source == Source::Stderr,
        }
    }

    /// Whether the record is shown: its stream, and not older than `since`.
    pub(super) fn wants(&self, record: &Record<'_>) -> bool {
        self.in_stream(record) && self.since.is_none_or(|since| record.time >= since)
    }

    /// Appends the record as the client sees it.
    pub(super) fn write(&self, record: &Record<'_>, out: &mut Vec<u8>) {
        if self.timestamps {
            out.extend_from_slice(record.timestamp);
            out.push(b' ');
        }
        out.extend_from_slice(record.content);
        if !record.partial {
            out.push(b'\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_partial_records() {
        let record = Record::parse(b"2026-11-30T06:01:25.123456789Z stdout F hello world\n").unwrap();
        assert_eq!(record.timestamp, b"2026-11-30T06:01:25.123456789Z");
        assert_eq!(record.time, OffsetDateTime::parse("2026-11-30T06:01:25.123456789Z", &Rfc3339).unwrap());
        assert_eq!(
            (record.source, record.partial, record.content),
            (Source::Stdout, false, &b"hello world"[..])
        );

        let record = Record::parse(b"2026-11-30T06:01:25Z stderr P:more  two spaces").unwrap();
        assert_eq!(
            (record.source, record.partial, record.content),
            (Source::Stderr, true, &b" two spaces"[..])
        );
    }

    #[test]
    fn empty_content_with_or_without_the_space() {
        assert_eq!(Record::parse(b"2026-11-30T06:01:25Z stdout F \n").unwrap().content, b"");
        assert_eq!(Record::parse(b"2026-11-30T06:01:25Z stdout F").unwrap().content, b"");
    }

    #[test]
    fn lines_not_in_the_cri_format() {
        for line in [
            &b""[..],
            b"\n",
            b"hello world",
            b"2026-11-30T06:01:25Z stdout",
            b"2026-11-30T06:01:25Z stdin F x",
            b"2026-11-30T06:01:25Z stdout X x",
            b"yesterday stdout F x",
            b"2026-11-30 06:01:25 stdout F x",
        ] {
            assert_eq!(Record::parse(line), None, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn render_filters_and_formats() {
        let since = OffsetDateTime::parse("2026-11-30T06:01:25Z", &Rfc3339).unwrap();
        let options = LogOptions {
            stream: LogStream::Stderr,
            since: Some(since),
            timestamps: true,
            ..LogOptions::default()
        };
        let render = Render::new(&options);
        let old = Record::parse(b"2026-11-30T06:01:24.9Z stderr F old").unwrap();
        let out = Record::parse(b"2026-11-30T06:01:26Z stdout F out").unwrap();
        let err = Record::parse(b"2026-11-30T06:01:25Z stderr P err").unwrap();
        assert_eq!((render.wants(&old), render.wants(&out), render.wants(&err)), (false, false, true));
        assert_eq!((render.in_stream(&old), render.in_stream(&out)), (true, false));
        let mut bytes = Vec::new();
        render.write(&err, &mut bytes);
        render.write(&old, &mut bytes);
        assert_eq!(bytes, b"2026-11-30T06:01:25Z err2026-11-30T06:01:24.9Z old\n");
    }
}
