//! Whether Envoy accepts a regex: RE2 itself, called as Envoy's `CompiledGoogleReMatcher` calls it
//! (source/common/common/regex.cc), so that validation accepts a pattern exactly when a proxy will.
//!
//! Envoy compiles each `safe_regex` with RE2 (`log_errors` off, `max_mem` scaled from the program
//! size limit), then rejects a program larger than the runtime key
//! `re2.max_program_size.error_level` (Envoy's default 100; pilot-agent's bootstrap sets 32768, as
//! Istio's). Syntax errors are RE2's own: repetition counts above 1000, lookaround,
//! backreferences, bad escapes; `\Q...\E` is accepted.
//!
//! Patterns are parsed as Latin-1, as Envoy 1.40 measured here does (`\x{FF}` accepted,
//! `\x{100}` refused). The RE2 linked here is the system's (Debian's libre2). Named groups written `(?<name>...)`,
//! which RE2 accepts since 2023 and Envoy's RE2 therefore accepts, are handed to an older RE2 as
//! `(?P<name>...)`.
#![warn(unreachable_pub)]

use std::ffi::{c_char, c_int};
use std::fmt;

/// The program size limit pilot-agent's bootstrap sets (`re2.max_program_size.error_level`).
pub const ISTIO_MAX_PROGRAM_SIZE: u32 = 32768;

/// Envoy's default `re2.max_program_size.error_level`, for a bootstrap that sets none.
pub const ENVOY_DEFAULT_MAX_PROGRAM_SIZE: u32 = 100;

/// Why RE2 (or Envoy's size check) refuses a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// RE2 does not compile it; the text is RE2's.
    Syntax(String),
    /// It compiles to more RE2 instructions than the limit.
    ProgramSize { size: u32, max: u32 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Syntax(e) => f.write_str(e),
            Error::ProgramSize { size, max } => {
                write!(f, "RE2 program size of {size} > max program size of {max}")
            }
        }
    }
}

impl std::error::Error for Error {}

#[allow(unsafe_code)]
unsafe extern "C" {
    fn pilot_re2_compile(
        pattern: *const c_char,
        len: usize,
        max_mem: i64,
        program_size: *mut c_int,
        error: *mut c_char,
        error_cap: usize,
    ) -> c_int;
}

/// Compiles `pattern` as Envoy does with `re2.max_program_size.error_level` = `max_program_size`
/// and returns its RE2 program size.
pub fn check(pattern: &str, max_program_size: u32) -> Result<u32, Error> {
    let pattern = modern_named_groups(pattern);
    let mut size: c_int = 0;
    let mut error = [0u8; 512];
    // SAFETY: the pattern pointer and length describe a live buffer (RE2 copies it); `size` and
    // `error` are live, writable and `error`'s capacity is passed; the shim NUL-terminates
    // within it and keeps no pointer after returning.
    #[allow(unsafe_code)]
    let code = unsafe {
        pilot_re2_compile(
            pattern.as_ptr().cast(),
            pattern.len(),
            max_mem(max_program_size),
            &mut size,
            error.as_mut_ptr().cast(),
            error.len(),
        )
    };
    if code != 0 {
        let end = error.iter().position(|&b| b == 0).unwrap_or(error.len());
        return Err(Error::Syntax(String::from_utf8_lossy(&error[..end]).into_owned()));
    }
    let size = u32::try_from(size).unwrap_or(u32::MAX);
    if size > max_program_size {
        return Err(Error::ProgramSize {
            size,
            max: max_program_size,
        });
    }
    Ok(size)
}

/// Envoy's `clampCompilationMaxMemFromProgramSize`: 1 KiB per allowed instruction, at least RE2's
/// default 8 MiB, at most 256 MiB.
fn max_mem(max_program_size: u32) -> i64 {
    const DEFAULT: i64 = 8 << 20;
    const HARD_MAX: i64 = 256 << 20;
    if max_program_size == u32::MAX {
        return HARD_MAX;
    }
    (i64::from(max_program_size) * 1024).clamp(DEFAULT, HARD_MAX)
}

/// `(?<name>` outside escapes, `\Q...\E` and character classes, rewritten to `(?P<name>`, which
/// every RE2 accepts; lookbehind (`(?<=`, `(?<!`) is left for RE2 to refuse.
fn modern_named_groups(pattern: &str) -> std::borrow::Cow<'_, str> {
    if !pattern.contains("(?<") {
        return pattern.into();
    }
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() + 4);
    let (mut i, mut copied) = (0, 0);
    let mut class = false;
    while i < b.len() {
        match b[i] {
            b'\\' if b.get(i + 1) == Some(&b'Q') => {
                // A literal run up to \E (or the end).
                i = pattern[i + 2..].find("\\E").map_or(b.len(), |e| i + 2 + e + 2);
                continue;
            }
            b'\\' => i += 1,
            b'[' if !class => {
                class = true;
                // A ']' first in the class (after an optional '^') is a literal.
                if b.get(i + 1) == Some(&b'^') {
                    i += 1;
                }
                if b.get(i + 1) == Some(&b']') {
                    i += 1;
                }
            }
            b'[' if b.get(i + 1) == Some(&b':') => {
                // [:alpha:] inside a class.
                if let Some(e) = pattern[i + 2..].find(":]") {
                    i += 2 + e + 1;
                }
            }
            b']' if class => class = false,
            b'(' if !class && b[i..].starts_with(b"(?<") && !matches!(b.get(i + 3), Some(b'=' | b'!')) => {
                out.push_str(&pattern[copied..i]);
                out.push_str("(?P<");
                copied = i + 3;
                i += 2;
            }
            _ => {}
        }
        i += 1;
    }
    if copied == 0 {
        return pattern.into();
    }
    out.push_str(&pattern[copied..]);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn istio(p: &str) -> Result<u32, Error> {
        check(p, ISTIO_MAX_PROGRAM_SIZE)
    }

    #[test]
    fn repetition_counts_above_1000_are_refused_by_re2() {
        assert!(istio("/a{1000}").is_ok());
        let e = istio("/a{1001}").unwrap_err();
        assert!(
            matches!(&e, Error::Syntax(s) if s.contains("invalid repetition size")),
            "{e}"
        );
    }

    #[test]
    fn quoted_literals_are_re2() {
        assert!(istio(r"\Q.*+?\E").is_ok());
        assert!(istio(r"/api/\Q(v1)\E/.*").is_ok());
    }

    #[test]
    fn lookaround_and_backreferences_are_not_re2() {
        for p in ["foo(?=bar)", "(?<=a)b", "(?<!a)b", r"(a)\1", "a++"] {
            assert!(matches!(istio(p), Err(Error::Syntax(_))), "{p}");
        }
    }

    #[test]
    fn program_size_is_checked_against_the_limit() {
        let size = istio("a{1000}").expect("compiles");
        assert!(size > ENVOY_DEFAULT_MAX_PROGRAM_SIZE);
        assert_eq!(
            check("a{1000}", ENVOY_DEFAULT_MAX_PROGRAM_SIZE),
            Err(Error::ProgramSize {
                size,
                max: ENVOY_DEFAULT_MAX_PROGRAM_SIZE
            })
        );
        assert_eq!(
            istio("(abcdefghijklmnopqrstuvwxyz0123456789){1000}"),
            Err(Error::ProgramSize {
                size: 38004,
                max: ISTIO_MAX_PROGRAM_SIZE
            })
        );
    }

    #[test]
    fn named_groups_in_both_spellings() {
        assert!(istio("(?P<v>[0-9]+)").is_ok());
        assert!(istio("(?<v>[0-9]+)").is_ok());
        assert_eq!(modern_named_groups(r"\(?<x>"), r"\(?<x>");
        assert_eq!(modern_named_groups(r"[(?<x>]"), r"[(?<x>]");
        assert_eq!(modern_named_groups(r"\Q(?<x>\E(?<y>z)"), r"\Q(?<x>\E(?P<y>z)");
        assert_eq!(modern_named_groups(r"[]](?<y>z)"), r"[]](?P<y>z)");
        assert_eq!(modern_named_groups(r"[[:alpha:]](?<y>z)"), r"[[:alpha:]](?P<y>z)");
        assert_eq!(modern_named_groups("(?<=a)"), "(?<=a)");
    }

    #[test]
    fn nul_bytes_and_non_ascii_are_passed_whole() {
        assert!(istio("a\0b").is_ok());
        assert!(istio("ü+|\\p{Greek}").is_ok());
        // Latin-1, as Envoy.
        assert!(istio(r"\x{FF}").is_ok());
        assert!(matches!(istio(r"\x{100}"), Err(Error::Syntax(e)) if e.contains("invalid escape")));
    }
}
