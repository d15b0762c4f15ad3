//! The `homing` command's exit codes: one table for every subcommand, so a
//! script can tell ok, refused, not found, unavailable and bad input apart.
//! `hold` uses the same codes for the same outcomes and adds its own (the
//! lease lost, COMMAND's status). The codes past 2 follow sysexits(3):
//! 69 EX_UNAVAILABLE, 75 EX_TEMPFAIL, 77 EX_NOPERM.
//!
//! A failure gets its code from what it is: an error marked with
//! [`fail`] or [`BadInput::bad_input`] carries it, and the errors of
//! homing-client, homing-net, the stores and a DC's error reply are
//! classified by kind ([`classify`]). Anything else is 1.

use std::fmt;

use homing_client::ResolveError;
use homing_core::{ErrorKind, ErrorReply};
use homing_daemon::stores::OpenError;
use homing_net::NetError;
use homing_store::StoreError;

/// How a `homing` command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Ok,
    /// 1: a check found a problem (migrate conflicts or mismatches, a failed
    /// devnet check), an inconsistent chain, an internal error.
    Failed,
    /// 2: bad flags, key, reservation ID or certificates; nothing was sent.
    BadInput,
    /// 3: the key was never reserved, or has no live actor; the reservation
    /// does not exist.
    NotFound,
    /// 69: a DC or store needed for the answer did not answer, or is
    /// overloaded: retry later.
    Unavailable,
    /// 75: `reserve`: a live actor holds the key (printed); nothing reserved.
    HeldElsewhere,
    /// 77: the DC refused: a stale token, a tag mismatch, a certificate that
    /// may not ask this, a new key past the DC's key quota.
    Refused,
}

/// The table, for `--help` and OPERATIONS.md.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   done
  1   a check failed (migrate conflicts or mismatches, a devnet check), an
      inconsistent chain, an internal error
  2   bad input: flags, key, reservation ID, certificates; nothing was sent
  3   not found: the key was never reserved or has no live actor, the
      reservation does not exist
  69  unavailable: a DC or store needed did not answer, or is overloaded; retry
  75  reserve: a live actor holds the key (printed); nothing was reserved
  77  refused: a stale token, a tag mismatch, a certificate that may not ask
      this, a new key past the DC's key quota (keys_per_namespace_max)
With --json, resolve, reserve and release print one JSON object on stdout,
also on failure: {\"outcome\":\"not_found\",\"error\":\"...\"}.";

impl Exit {
    /// The process exit code.
    pub fn code(self) -> i32 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::BadInput => 2,
            Exit::NotFound => 3,
            Exit::Unavailable => 69,
            Exit::HeldElsewhere => 75,
            Exit::Refused => 77,
        }
    }

    /// One word for `--json` output's `outcome`.
    pub fn word(self) -> &'static str {
        match self {
            Exit::Ok => "ok",
            Exit::Failed => "failed",
            Exit::BadInput => "bad_input",
            Exit::NotFound => "not_found",
            Exit::Unavailable => "unavailable",
            Exit::HeldElsewhere => "held_elsewhere",
            Exit::Refused => "refused",
        }
    }
}

/// An error that says which exit it calls for.
#[derive(Debug)]
pub struct Classified {
    exit: Exit,
    message: String,
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Classified {}

/// An error, in words, that exits with `exit`.
pub fn fail(exit: Exit, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Classified {
        exit,
        message: message.into(),
    })
}

/// Marks a failed parse or lookup of command-line input as bad input (exit 2).
pub trait BadInput<T> {
    /// `Err(e)` becomes "`what`: `e`", exiting 2.
    fn bad_input(self, what: impl fmt::Display) -> anyhow::Result<T>;
}

impl<T, E: Into<anyhow::Error>> BadInput<T> for Result<T, E> {
    fn bad_input(self, what: impl fmt::Display) -> anyhow::Result<T> {
        self.map_err(|e| fail(Exit::BadInput, format!("{what}: {:#}", e.into())))
    }
}

/// The exit `error` calls for: the first cause in its chain that says.
pub fn classify(error: &anyhow::Error) -> Exit {
    for cause in error.chain() {
        if let Some(c) = cause.downcast_ref::<Classified>() {
            return c.exit;
        }
        if let Some(e) = cause.downcast_ref::<ResolveError>() {
            return resolve_exit(e);
        }
        if let Some(e) = cause.downcast_ref::<ErrorReply>() {
            return reply_exit(&e.kind);
        }
        if let Some(e) = cause.downcast_ref::<NetError>() {
            return net_exit(e);
        }
        if let Some(e) = cause.downcast_ref::<homing_client::AgentError>() {
            return agent_exit(e);
        }
        if let Some(e) = cause.downcast_ref::<OpenError>() {
            match e {
                OpenError::Missing { .. } | OpenError::NotBuilt { .. } => return Exit::BadInput,
                OpenError::Store { .. } | OpenError::Io { .. } => {}
            }
        }
        if let Some(StoreError::Unavailable { .. }) = cause.downcast_ref::<StoreError>() {
            return Exit::Unavailable;
        }
    }
    Exit::Failed
}

fn agent_exit(e: &homing_client::AgentError) -> Exit {
    use homing_client::AgentError;
    match e {
        AgentError::Unavailable { .. } => Exit::Unavailable,
        AgentError::Refused { error, .. } => reply_exit(&error.kind),
        AgentError::StaleToken { .. } | AgentError::NotHolder => Exit::Refused,
        AgentError::Unexpected { .. } => Exit::Failed,
        AgentError::Config(_) => Exit::BadInput,
    }
}

fn resolve_exit(e: &ResolveError) -> Exit {
    match e {
        ResolveError::NotFound(_) | ResolveError::Vacant { .. } => Exit::NotFound,
        ResolveError::Unavailable { .. } => Exit::Unavailable,
        ResolveError::ChainTooLong(_) | ResolveError::Inconsistent(_) => Exit::Failed,
    }
}

/// The exit for a DC's error reply.
pub fn reply_exit(kind: &ErrorKind) -> Exit {
    match kind {
        ErrorKind::Unauthorized | ErrorKind::QuotaExceeded { .. } => Exit::Refused,
        ErrorKind::BadRequest => Exit::BadInput,
        ErrorKind::UnknownReservation | ErrorKind::SessionEnded => Exit::NotFound,
        ErrorKind::Unavailable { .. } | ErrorKind::Overloaded => Exit::Unavailable,
        ErrorKind::Inconsistent | ErrorKind::Trimmed { .. } | ErrorKind::Internal => Exit::Failed,
    }
}

fn net_exit(e: &NetError) -> Exit {
    match e {
        NetError::Pem { .. } | NetError::Tls(_) | NetError::Identity(_) | NetError::Limits(_) => {
            Exit::BadInput
        }
        // The peer runs an older release: asking again will not help.
        NetError::Refused { .. } | NetError::NotSpoken { .. } => Exit::Refused,
        NetError::Connect { .. }
        | NetError::Backoff { .. }
        | NetError::PoolFull { .. }
        | NetError::Timeout { .. }
        | NetError::Closed { .. } => Exit::Unavailable,
        NetError::Io(_) | NetError::FrameTooLarge { .. } | NetError::Malformed(_) => Exit::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_its_own_code_and_word() {
        let all = [
            Exit::Ok,
            Exit::Failed,
            Exit::BadInput,
            Exit::NotFound,
            Exit::Unavailable,
            Exit::HeldElsewhere,
            Exit::Refused,
        ];
        let codes: std::collections::HashSet<i32> = all.iter().map(|e| e.code()).collect();
        let words: std::collections::HashSet<&str> = all.iter().map(|e| e.word()).collect();
        assert_eq!((codes.len(), words.len()), (all.len(), all.len()));
        for exit in all {
            assert!(
                EXIT_CODES_HELP.contains(&format!("\n  {:<3} ", exit.code())),
                "{exit:?} is not in the help table"
            );
        }
    }

    #[test]
    fn errors_are_classified_through_their_context() {
        let not_found = anyhow::Error::new(ResolveError::NotFound(homing_core::Key::new(
            homing_core::KeyName::new("k").unwrap(),
        )))
        .context("resolving k");
        assert_eq!(classify(&not_found), Exit::NotFound);
        let stale = fail(Exit::Refused, "stale token");
        assert_eq!(classify(&stale.context("release")), Exit::Refused);
        let bad: Result<(), _> = Err(anyhow::anyhow!("not NAME=ADDR"));
        assert_eq!(
            classify(&bad.bad_input("--dc").unwrap_err()),
            Exit::BadInput
        );
        let reply = ErrorReply::new(ErrorKind::UnknownReservation, "iad.9");
        assert_eq!(classify(&anyhow::Error::new(reply)), Exit::NotFound);
        assert_eq!(classify(&anyhow::anyhow!("anything else")), Exit::Failed);
    }
}
