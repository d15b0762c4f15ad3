//! Golden fixtures: one file of hex per case, one directory per format
//! version, checked both ways against values built in code. Shared by
//! homing-core's wire fixtures and homing-store's store fixtures (which
//! include this file by path); the rules are in each fixtures README.md.
//!
//! A case holds what a format writes (`written`) and what it reads back
//! (`reads`); a case of a format that is read but no longer written has no
//! `written`, and its file is never blessed.

#![allow(dead_code)] // each including test target uses part of it

pub mod samples;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::Path;

/// The variable that makes a run write missing fixture files.
pub const BLESS_VAR: &str = "HOMING_BLESS_FIXTURES";
/// The extension of a fixture file.
const EXTENSION: &str = "hex";
/// Bytes per line of a fixture file: short lines keep diffs local.
const LINE_BYTES: usize = 16;

/// A check of bytes read from a fixture: `Err` says what differed.
type Reads = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// One fixture: its file stem, the bytes the code writes today (if the
/// format is still written), and how the code reads the file.
pub struct Case {
    name: String,
    written: Option<Vec<u8>>,
    reads: Option<Reads>,
}

impl Case {
    /// A value written with `encode` and read back with `decode`.
    pub fn round_trip<T, E>(
        name: &str,
        value: T,
        encode: impl Fn(&T) -> Vec<u8>,
        decode: impl Fn(&[u8]) -> Result<T, E> + 'static,
    ) -> Case
    where
        T: PartialEq + Debug + 'static,
        E: Debug,
    {
        Case {
            name: name.to_string(),
            written: Some(encode(&value)),
            reads: Some(reads(value, decode)),
        }
    }

    /// Bytes the code writes but never parses back (an index key).
    pub fn written_only(name: &str, bytes: Vec<u8>) -> Case {
        Case {
            name: name.to_string(),
            written: Some(bytes),
            reads: None,
        }
    }

    /// A format the code still reads but no longer writes: the file is
    /// the only copy of its bytes.
    pub fn read_only<T, E>(
        name: &str,
        value: T,
        decode: impl Fn(&[u8]) -> Result<T, E> + 'static,
    ) -> Case
    where
        T: PartialEq + Debug + 'static,
        E: Debug,
    {
        Case {
            name: name.to_string(),
            written: None,
            reads: Some(reads(value, decode)),
        }
    }
}

fn reads<T, E>(value: T, decode: impl Fn(&[u8]) -> Result<T, E> + 'static) -> Reads
where
    T: PartialEq + Debug + 'static,
    E: Debug,
{
    Box::new(move |bytes| match decode(bytes) {
        Ok(read) if read == value => Ok(()),
        Ok(read) => Err(format!(
            "decodes to\n    {read:?}\n  expected\n    {value:?}"
        )),
        Err(e) => Err(format!("does not decode: {e:?}")),
    })
}

/// One version's cases, in the directory named after the version.
pub struct Version {
    /// The directory's name, `v<N>`.
    pub dir: String,
    /// Every case of that version.
    pub cases: Vec<Case>,
}

/// Checks every version under `root` (or, with [`BLESS_VAR`] set, first
/// writes the files that are missing) and panics listing every failure by
/// version and case. A directory under `root` that no version claims fails.
pub fn check(root: &Path, versions: Vec<Version>) {
    let bless = std::env::var_os(BLESS_VAR).is_some_and(|v| v == "1");
    let mut failures = Vec::new();
    let claimed: BTreeSet<String> = versions.iter().map(|v| v.dir.clone()).collect();
    for dir in entries(root) {
        if root.join(&dir).is_dir() && !claimed.contains(&dir) {
            failures.push(format!("{dir}: a fixtures directory no version claims"));
        }
    }
    for version in versions {
        let dir = root.join(&version.dir);
        if bless {
            write_missing(&dir, &version.cases);
        }
        for failure in check_version(&dir, &version.cases) {
            failures.push(format!("{}/{failure}", version.dir));
        }
    }
    assert!(
        failures.is_empty(),
        "{} fixture failure(s) under {}:\n{}\n(a format change needs a new version directory, \
         never a re-blessed file: see README.md there)",
        failures.len(),
        root.display(),
        failures.join("\n")
    );
}

fn check_version(dir: &Path, cases: &[Case]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut names = BTreeSet::new();
    for case in cases {
        if !names.insert(case.name.clone()) {
            failures.push(format!("{}: two cases have this name", case.name));
        }
    }
    let files: BTreeSet<String> = entries(dir)
        .into_iter()
        .filter(|f| f != "README.md")
        .collect();
    for file in &files {
        let stem = file.strip_suffix(&format!(".{EXTENSION}"));
        if !stem.is_some_and(|s| names.contains(s)) {
            failures.push(format!("{file}: a fixture file no case names"));
        }
    }
    for case in cases {
        let file = format!("{}.{EXTENSION}", case.name);
        if !files.contains(&file) {
            failures.push(format!("{}: no fixture file {file}", case.name));
            continue;
        }
        let text = std::fs::read_to_string(dir.join(&file)).expect("fixture file reads");
        let stored = match parse_hex(&text) {
            Ok(bytes) => bytes,
            Err(e) => {
                failures.push(format!("{}: {file} is not hex: {e}", case.name));
                continue;
            }
        };
        if let Some(reads) = &case.reads
            && let Err(e) = reads(&stored)
        {
            failures.push(format!("{}: the fixture {e}", case.name));
        }
        if let Some(written) = &case.written
            && written != &stored
        {
            failures.push(format!(
                "{}: encodes differently from its fixture\n  fixture  {}\n  encoded  {}",
                case.name,
                to_hex(&stored).replace('\n', " ").trim_end(),
                to_hex(written).replace('\n', " ").trim_end(),
            ));
        }
    }
    failures
}

/// Writes the file of every written case that has none; never rewrites
/// an existing file, whatever it holds.
fn write_missing(dir: &Path, cases: &[Case]) {
    std::fs::create_dir_all(dir).expect("fixtures directory can be created");
    for case in cases {
        let path = dir.join(format!("{}.{EXTENSION}", case.name));
        if let (Some(written), false) = (&case.written, path.exists()) {
            std::fs::write(&path, to_hex(written)).expect("fixture file can be written");
        }
    }
}

/// The names in `dir` (none if it does not exist), sorted.
fn entries(dir: &Path) -> Vec<String> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = read
        .map(|e| {
            let e = e.expect("fixtures directory lists");
            e.file_name().to_string_lossy().into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Lowercase hex, [`LINE_BYTES`] bytes a line, each line ending in `\n`.
fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    for line in bytes.chunks(LINE_BYTES) {
        let pairs: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&pairs.join(" "));
        out.push('\n');
    }
    out
}

/// The bytes of a fixture file: hex pairs separated by whitespace; a line
/// starting with `#` is a comment.
fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    text.lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(|pair| match pair.len() {
            2 => u8::from_str_radix(pair, 16).map_err(|e| format!("{pair:?}: {e}")),
            _ => Err(format!("{pair:?} is not one byte")),
        })
        .collect()
}
