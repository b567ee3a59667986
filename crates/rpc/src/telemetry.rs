//! Tracing set-up for HPK binaries: a `RUST_LOG`-style filter, plain or JSON lines, to stderr.

use tracing_subscriber::EnvFilter;

/// Output format of log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. The filter comes from `RUST_LOG`, `info` if unset.
pub fn init(format: LogFormat) {
    init_with_default(format, "info");
}

/// Like [`init`], with lines going to `writer` instead of stderr.
pub fn init_with_writer<W>(format: LogFormat, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(writer);
    let _ = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Like [`init`], with `default_filter` when `RUST_LOG` is unset.
pub fn init_with_default(format: LogFormat, default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    // A second init (tests calling it twice) is harmless; ignore the "already set" error.
    let _ = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
