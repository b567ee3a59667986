//! Running a command with a bound: a client that hangs (a `kubectl exec` whose stream never
//! opens, a watch that never sees its event) fails its test with what it printed so far,
//! instead of holding the test, and CI's run, until something outside kills it.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How often a running command is checked.
const POLL: Duration = Duration::from_millis(20);

/// Runs `cmd` to its end as [`Command::output`] does (stdin from `/dev/null`, stdout and
/// stderr captured), and returns its output. Panics when it cannot be
/// started, or when it has not ended within `within`: it is killed first, and the message
/// names the command and shows what it printed.
pub fn output_within(cmd: &mut Command, within: Duration) -> Output {
    let shown = format!("{cmd:?}");
    match run(cmd, within) {
        Ok(Finished::Exited(output)) => output,
        Ok(Finished::TimedOut(output)) => panic!(
            "{shown} did not finish within {within:?}; killed. It printed:\n--- stdout:\n{}\n--- stderr:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => panic!("{shown} could not be run: {error}"),
    }
}

enum Finished {
    Exited(Output),
    TimedOut(Output),
}

fn run(cmd: &mut Command, within: Duration) -> std::io::Result<Finished> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + within;
    let (status, timed_out) = loop {
        if let Some(status) = child.try_wait()? {
            break (status, false);
        }
        if Instant::now() >= deadline {
            // Already gone is fine: wait reaps it either way.
            let _ = child.kill();
            break (child.wait()?, true);
        }
        std::thread::sleep(POLL);
    };
    // A grandchild that kept the pipes open would hold these: the command is what is bounded,
    // so its output is what was read by the time it ended.
    let output = Output {
        status,
        stdout: join_within(stdout, Duration::from_secs(5)),
        stderr: join_within(stderr, Duration::from_secs(5)),
    };
    Ok(if timed_out { Finished::TimedOut(output) } else { Finished::Exited(output) })
}

/// The reader's bytes, or none if it has not finished within `within`.
fn join_within(reader: std::thread::JoinHandle<Vec<u8>>, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    while !reader.is_finished() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    if reader.is_finished() { reader.join().unwrap_or_default() } else { Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_output_of_a_command_that_ends() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn kills_a_command_past_its_bound_and_shows_what_it_printed() {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(|| {
            output_within(
                Command::new("sh").args(["-c", "echo partial; exec sleep 30"]),
                Duration::from_millis(300),
            )
        });
        let message =
            *outcome.expect_err("a command past its bound fails").downcast::<String>().expect("message");
        assert!(message.contains("did not finish within 300ms"), "{message}");
        assert!(message.contains("partial"), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "it waited for the command: {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_missing_program_is_named() {
        let outcome = std::panic::catch_unwind(|| {
            output_within(&mut Command::new("/nonexistent/hpk-test-program"), Duration::from_secs(1))
        });
        let message = *outcome.expect_err("fails").downcast::<String>().expect("message");
        assert!(message.contains("could not be run"), "{message}");
    }
}
