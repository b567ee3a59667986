//! What goes on the error stream when a session ends: a `metav1.Status` as JSON (protocol v4
//! and later) or a plain message (earlier protocols, failures only).

use serde_json::json;

/// How an exec/attach session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Exit code 0.
    Success,
    /// A non-zero exit code (1..=255).
    ExitCode(u8),
    /// The session failed; the message says why.
    Error(String),
}

impl Outcome {
    /// Maps a backend result; `verb` prefixes error messages as the kubelet does.
    pub fn from_backend(result: Result<i32, String>, verb: &str) -> Self {
        match result {
            Ok(0) => Outcome::Success,
            Ok(code) => match u8::try_from(code) {
                Ok(c) => Outcome::ExitCode(c),
                Err(_) => Outcome::Error(format!("{verb}: exit code {code} is outside 0..=255")),
            },
            Err(msg) => Outcome::Error(format!("{verb}: {msg}")),
        }
    }

    fn message(&self) -> Option<String> {
        match self {
            Outcome::Success => None,
            Outcome::ExitCode(c) => {
                Some(format!("command terminated with non-zero exit code: exit status {c}"))
            }
            Outcome::Error(msg) => Some(format!("Internal error occurred: {msg}")),
        }
    }

    /// The v4+ error-stream payload: a `metav1.Status`.
    pub fn status_json(&self) -> Vec<u8> {
        let status = match self {
            Outcome::Success => json!({"metadata": {}, "status": "Success"}),
            Outcome::ExitCode(c) => json!({
                "metadata": {},
                "status": "Failure",
                "message": self.message(),
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": c.to_string()}]},
            }),
            Outcome::Error(msg) => json!({
                "metadata": {},
                "status": "Failure",
                "message": self.message(),
                "reason": "InternalError",
                "details": {"causes": [{"message": msg}]},
                "code": 500,
            }),
        };
        status.to_string().into_bytes()
    }

    /// The payload for `protocol` (`None`: write nothing).
    pub fn payload(&self, json_status: bool) -> Option<Vec<u8>> {
        if json_status { Some(self.status_json()) } else { self.message().map(String::into_bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_zero_exit_carries_the_code_as_an_exit_code_cause() {
        let o = Outcome::from_backend(Ok(3), "error executing command in container");
        let v: serde_json::Value = serde_json::from_slice(&o.status_json()).expect("json");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "3");
    }

    #[test]
    fn success_and_errors() {
        assert_eq!(Outcome::from_backend(Ok(0), "x"), Outcome::Success);
        assert_eq!(Outcome::Success.payload(false), None);
        assert!(matches!(Outcome::from_backend(Ok(300), "x"), Outcome::Error(_)));
        let e = Outcome::from_backend(Err("boom".into()), "error attaching to container");
        let v: serde_json::Value = serde_json::from_slice(&e.status_json()).expect("json");
        assert_eq!(v["message"], "Internal error occurred: error attaching to container: boom");
    }
}
