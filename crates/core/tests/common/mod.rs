//! Shared by the property tests.

use proptest::test_runner::Config;

/// A proptest configuration of `default` cases; `PROPTEST_CASES` raises
/// (or lowers) the count for a long run.
pub fn config(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    Config { cases, ..Config::default() }
}
