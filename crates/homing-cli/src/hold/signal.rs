//! Signal names: what `--soft-signal` accepts and how a child's end is told.

use rustix::process::Signal;

/// The signals `homing hold` names, by their usual names without `SIG`.
const NAMED: [(&str, Signal); 12] = [
    ("HUP", Signal::HUP),
    ("INT", Signal::INT),
    ("QUIT", Signal::QUIT),
    ("ABRT", Signal::ABORT),
    ("KILL", Signal::KILL),
    ("USR1", Signal::USR1),
    ("SEGV", Signal::SEGV),
    ("USR2", Signal::USR2),
    ("PIPE", Signal::PIPE),
    ("ALRM", Signal::ALARM),
    ("TERM", Signal::TERM),
    ("BUS", Signal::BUS),
];

/// Parses `TERM`, `SIGTERM`, `term` or a number of one of the named signals.
pub fn parse(text: &str) -> Result<Signal, String> {
    let upper = text.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Ok(number) = bare.parse::<i32>() {
        return NAMED
            .iter()
            .map(|(_, s)| *s)
            .find(|s| s.as_raw() == number)
            .ok_or_else(|| format!("signal {number} is not one of {}", names()));
    }
    NAMED
        .iter()
        .find(|(name, _)| *name == bare)
        .map(|(_, s)| *s)
        .ok_or_else(|| format!("unknown signal {text:?}: expected one of {}", names()))
}

/// `SIGTERM` for 15; `signal 34` for one without a name here.
pub fn name(number: i32) -> String {
    NAMED
        .iter()
        .find(|(_, s)| s.as_raw() == number)
        .map_or_else(
            || format!("signal {number}"),
            |(name, _)| format!("SIG{name}"),
        )
}

fn names() -> String {
    NAMED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_parse_by_name_with_or_without_sig_and_by_number() {
        assert_eq!(parse("TERM"), Ok(Signal::TERM));
        assert_eq!(parse("sigint"), Ok(Signal::INT));
        assert_eq!(parse("9"), Ok(Signal::KILL));
        assert!(parse("SIGNOPE").unwrap_err().contains("TERM"));
        assert!(parse("0").is_err());
    }

    #[test]
    fn signal_names_read_like_kill_l() {
        assert_eq!(name(Signal::TERM.as_raw()), "SIGTERM");
        assert_eq!(name(64), "signal 64");
    }
}
