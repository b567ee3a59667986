//! The query string of a `containerLogs` request, parsed as the API server sends it to a kubelet.

use std::time::{SystemTime, UNIX_EPOCH};

use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, PrimitiveDateTime};

/// Which of a container's output streams to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogStream {
    /// Both stdout and stderr, interleaved as they were written.
    #[default]
    All,
    /// Only stdout.
    Stdout,
    /// Only stderr.
    Stderr,
}

impl LogStream {
    /// The name Kubernetes uses for this value in `PodLogOptions.stream`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "All",
            Self::Stdout => "Stdout",
            Self::Stderr => "Stderr",
        }
    }

    /// The value Kubernetes names `name` (`All`, `Stdout` or `Stderr`, exactly), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "All" => Some(Self::All),
            "Stdout" => Some(Self::Stdout),
            "Stderr" => Some(Self::Stderr),
            _ => None,
        }
    }
}

/// What a client asked of a container's log (Kubernetes' `PodLogOptions`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogOptions {
    /// Keep the stream open and send records as they are written, until the container stops.
    pub follow: bool,
    /// Start at the N-th last record of the chosen stream; `Some(0)` shows no past record.
    pub tail_lines: Option<u64>,
    /// Only records whose timestamp is at or after this instant.
    pub since: Option<OffsetDateTime>,
    /// Prefix each record with its timestamp, as written in the file, and a space.
    pub timestamps: bool,
    /// End the stream after this many bytes of output, even while following.
    pub limit_bytes: Option<u64>,
    /// The previous instance of the container was asked for; the caller picks that file.
    pub previous: bool,
    /// Which output streams to show.
    pub stream: LogStream,
}

/// Why a query string was refused; its text is the body of the HTTP 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum QueryError {
    #[error("query parameter {name} must be true, false, 1 or 0, not {value:?}")]
    Bool { name: &'static str, value: String },
    #[error("query parameter {name} must be a whole number, not {value:?}")]
    Number { name: &'static str, value: String },
    #[error("query parameter {name} must not be negative, got {value}")]
    Negative { name: &'static str, value: String },
    #[error("query parameter {name} must be at least 1, got {value}")]
    Zero { name: &'static str, value: String },
    #[error("query parameters sinceSeconds and sinceTime cannot both be given")]
    BothSince,
    #[error("query parameter sinceTime must be an RFC 3339 time such as 2026-11-30T06:01:25Z, not {0:?}")]
    SinceTime(String),
    #[error("query parameter stream must be All, Stdout or Stderr, not {0:?}")]
    Stream(String),
    #[error("query parameter tailLines cannot be combined with stream={0}; only stream=All supports it")]
    TailWithStream(&'static str),
}

/// The raw values of the parameters we know; the first occurrence of each wins, as in Go's
/// conversion of `url.Values`.
#[derive(Default)]
struct RawQuery {
    follow: Option<String>,
    tail_lines: Option<String>,
    since_seconds: Option<String>,
    since_time: Option<String>,
    timestamps: Option<String>,
    limit_bytes: Option<String>,
    previous: Option<String>,
    stream: Option<String>,
}

impl RawQuery {
    fn parse(query: &str) -> Self {
        let mut raw = Self::default();
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match name.as_ref() {
                "follow" => &mut raw.follow,
                "tailLines" => &mut raw.tail_lines,
                "sinceSeconds" => &mut raw.since_seconds,
                "sinceTime" => &mut raw.since_time,
                "timestamps" => &mut raw.timestamps,
                "limitBytes" => &mut raw.limit_bytes,
                "previous" => &mut raw.previous,
                "stream" => &mut raw.stream,
                // the API server adds others (e.g. insecureSkipTLSVerifyBackend)
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.into_owned());
            }
        }
        raw
    }
}

impl LogOptions {
    /// Parses the query string of `/containerLogs/...` (without the `?`); `now` anchors
    /// `sinceSeconds`. Booleans are `true`/`false`/`1`/`0` (any case) and a bare name or
    /// empty value means true; unknown parameters are ignored. The error is a sentence for
    /// an HTTP 400 body.
    pub fn from_query(query: Option<&str>, now: SystemTime) -> Result<Self, String> {
        Self::parse(query.unwrap_or(""), now).map_err(|error| error.to_string())
    }

    fn parse(query: &str, now: SystemTime) -> Result<Self, QueryError> {
        let raw = RawQuery::parse(query);
        let stream = raw.stream.map(parse_stream).transpose()?.unwrap_or_default();
        let tail_lines = number("tailLines", raw.tail_lines)?;
        if tail_lines.is_some() && stream != LogStream::All {
            return Err(QueryError::TailWithStream(stream.as_str()));
        }
        let since_seconds = at_least_one("sinceSeconds", raw.since_seconds)?;
        let since = match (since_seconds, raw.since_time) {
            (Some(_), Some(_)) => return Err(QueryError::BothSince),
            (Some(seconds), None) => Some(seconds_before(now, seconds)),
            (None, Some(text)) => Some(parse_time(text)?),
            (None, None) => None,
        };
        Ok(Self {
            follow: flag("follow", raw.follow)?,
            tail_lines,
            since,
            timestamps: flag("timestamps", raw.timestamps)?,
            limit_bytes: at_least_one("limitBytes", raw.limit_bytes)?,
            previous: flag("previous", raw.previous)?,
            stream,
        })
    }
}

fn parse_stream(value: String) -> Result<LogStream, QueryError> {
    LogStream::from_name(&value).ok_or(QueryError::Stream(value))
}

fn flag(name: &'static str, value: Option<String>) -> Result<bool, QueryError> {
    let Some(value) = value else { return Ok(false) };
    match value.to_ascii_lowercase().as_str() {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(QueryError::Bool { name, value }),
    }
}

/// A non-negative number in Go's `int64` range, as the API server accepts it.
fn number(name: &'static str, value: Option<String>) -> Result<Option<u64>, QueryError> {
    let Some(value) = value else { return Ok(None) };
    match value.parse::<i64>().map(u64::try_from) {
        Ok(Ok(number)) => Ok(Some(number)),
        Ok(Err(_)) => Err(QueryError::Negative { name, value }),
        Err(_) => Err(QueryError::Number { name, value }),
    }
}

fn at_least_one(name: &'static str, value: Option<String>) -> Result<Option<u64>, QueryError> {
    match number(name, value)? {
        Some(0) => Err(QueryError::Zero { name, value: "0".to_owned() }),
        other => Ok(other),
    }
}

/// RFC 3339; a `+` offset sent without percent-encoding arrives as a space, so that is retried.
fn parse_time(text: String) -> Result<OffsetDateTime, QueryError> {
    OffsetDateTime::parse(&text, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(&text.replace(' ', "+"), &Rfc3339))
        .map_err(|_| QueryError::SinceTime(text))
}

/// `now - seconds`, clamped to the earliest representable time instead of failing.
fn seconds_before(now: SystemTime, seconds: u64) -> OffsetDateTime {
    let now_nanos = match now.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_nanos()).unwrap_or(i128::MAX),
        Err(before) => i128::try_from(before.duration().as_nanos()).map_or(i128::MIN, |n| -n),
    };
    let since = now_nanos.saturating_sub(i128::from(seconds) * 1_000_000_000);
    OffsetDateTime::from_unix_timestamp_nanos(since).unwrap_or(PrimitiveDateTime::MIN.assume_utc())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_796_018_485) // 2026-11-30T06:01:25Z
    }

    fn parse(query: &str) -> Result<LogOptions, String> {
        LogOptions::from_query(Some(query), now())
    }

    fn at(text: &str) -> OffsetDateTime {
        OffsetDateTime::parse(text, &Rfc3339).unwrap()
    }

    #[test]
    fn no_query_is_the_whole_log_once() {
        assert_eq!(LogOptions::from_query(None, now()), Ok(LogOptions::default()));
        assert_eq!(parse(""), Ok(LogOptions::default()));
        assert_eq!(LogOptions::default().stream, LogStream::All);
    }

    #[test]
    fn every_parameter_as_kubectl_sends_it() {
        let query = "follow=true&tailLines=10&sinceTime=2026-11-30T06%3A01%3A25Z&timestamps=true\
                     &limitBytes=500&previous=true&stream=All&insecureSkipTLSVerifyBackend=true";
        let expected = LogOptions {
            follow: true,
            tail_lines: Some(10),
            since: Some(at("2026-11-30T06:01:25Z")),
            timestamps: true,
            limit_bytes: Some(500),
            previous: true,
            stream: LogStream::All,
        };
        assert_eq!(parse(query), Ok(expected));
    }

    #[test]
    fn since_seconds_counts_back_from_now() {
        let options = parse("sinceSeconds=3600").unwrap();
        assert_eq!(options.since, Some(at("2026-11-30T05:01:25Z")));
        let options = parse(&format!("sinceSeconds={}", i64::MAX)).unwrap();
        assert_eq!(options.since, Some(PrimitiveDateTime::MIN.assume_utc()));
    }

    #[test]
    fn since_time_with_an_offset_encoded_or_not() {
        let expected = Some(at("2026-11-30T05:01:25Z"));
        assert_eq!(parse("sinceTime=2026-11-30T06%3A01%3A25%2B01%3A00").unwrap().since, expected);
        assert_eq!(parse("sinceTime=2026-11-30T06:01:25+01:00").unwrap().since, expected);
        let nanos = parse("sinceTime=2026-11-30T06:01:25.5Z").unwrap().since;
        assert_eq!(nanos, Some(at("2026-11-30T06:01:25.500Z")));
    }

    #[test]
    fn booleans() {
        for (text, value) in
            [("", true), ("true", true), ("TRUE", true), ("1", true), ("false", false), ("0", false)]
        {
            let options = parse(&format!("follow={text}&timestamps={text}&previous={text}")).unwrap();
            assert_eq!((options.follow, options.timestamps, options.previous), (value, value, value));
        }
        assert!(parse("follow").unwrap().follow);
        assert_eq!(
            parse("timestamps=yes"),
            Err("query parameter timestamps must be true, false, 1 or 0, not \"yes\"".to_owned())
        );
    }

    #[test]
    fn streams() {
        assert_eq!(parse("stream=Stdout").unwrap().stream, LogStream::Stdout);
        assert_eq!(parse("stream=Stderr").unwrap().stream, LogStream::Stderr);
        assert_eq!(parse("stream=All&tailLines=3").unwrap().tail_lines, Some(3));
        assert_eq!(
            parse("stream=stdout"),
            Err("query parameter stream must be All, Stdout or Stderr, not \"stdout\"".to_owned())
        );
    }

    #[test]
    fn stream_names_round_trip_exactly() {
        for stream in [LogStream::All, LogStream::Stdout, LogStream::Stderr] {
            assert_eq!(LogStream::from_name(stream.as_str()), Some(stream));
        }
        assert_eq!(LogStream::from_name("stdout"), None);
        assert_eq!(LogStream::from_name(""), None);
    }

    #[test]
    fn first_occurrence_wins_and_unknown_names_are_ignored() {
        let options = parse("tailLines=2&tailLines=x&pretty=1&container=c").unwrap();
        assert_eq!(options, LogOptions { tail_lines: Some(2), ..LogOptions::default() });
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        let cases = [
            ("tailLines=abc", "query parameter tailLines must be a whole number, not \"abc\""),
            ("tailLines=-1", "query parameter tailLines must not be negative, got -1"),
            ("tailLines=", "query parameter tailLines must be a whole number, not \"\""),
            (
                "limitBytes=99999999999999999999",
                "query parameter limitBytes must be a whole number, not \"99999999999999999999\"",
            ),
            ("limitBytes=0", "query parameter limitBytes must be at least 1, got 0"),
            ("limitBytes=-5", "query parameter limitBytes must not be negative, got -5"),
            ("sinceSeconds=0", "query parameter sinceSeconds must be at least 1, got 0"),
            ("sinceSeconds=1.5", "query parameter sinceSeconds must be a whole number, not \"1.5\""),
            (
                "sinceSeconds=10&sinceTime=2026-11-30T06%3A01%3A25Z",
                "query parameters sinceSeconds and sinceTime cannot both be given",
            ),
            (
                "sinceTime=yesterday",
                "query parameter sinceTime must be an RFC 3339 time such as 2026-11-30T06:01:25Z, not \"yesterday\"",
            ),
            (
                "tailLines=5&stream=Stderr",
                "query parameter tailLines cannot be combined with stream=Stderr; only stream=All supports it",
            ),
            ("previous=maybe", "query parameter previous must be true, false, 1 or 0, not \"maybe\""),
        ];
        for (query, message) in cases {
            assert_eq!(parse(query), Err(message.to_owned()), "{query}");
        }
    }
}
