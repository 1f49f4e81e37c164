//! The skips a whole run of the suite may have, and the least number of
//! tests it must count: tests/expected_skips.toml, read after the run. A
//! skip that no entry allows fails the run, so that a check that quietly
//! stops running (nodes that cannot be made, a GPU test on a GPU machine, a
//! test file that no longer builds) can never leave the summary green.

use std::path::Path;

use toml::{Table, Value};

/// Where a skip is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    Always,
    NoGpu,
    OutsideCi,
}

/// One entry of the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    pub target: String,
    /// A full test name, or a prefix ending in `*`.
    pub name: String,
    pub when: When,
    pub reason: String,
}

/// The whole file: the least number of tests and the allowed skips.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedSkips {
    pub tests: usize,
    pub allowed: Vec<Allowed>,
}

/// A skip the run saw: a test of executable `target`, or a check
/// (`target` = "check"), with the reason it printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub target: String,
    pub name: String,
    pub reason: String,
}

/// Where the run happened, for the `when` of each entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    pub gpu: bool,
    pub ci: bool,
}

pub const FILE: &str = "tests/expected_skips.toml";

pub fn load(root: &Path) -> Result<ExpectedSkips, String> {
    let path = root.join(FILE);
    let text = std::fs::read_to_string(&path).map_err(|error| format!("cannot read {FILE}: {error}"))?;
    parse(&text)
}

/// Reads the file's text; every mistake is named with the entry it is in.
pub fn parse(text: &str) -> Result<ExpectedSkips, String> {
    let table: Table = toml::from_str(text).map_err(|error| format!("{FILE} is not valid TOML: {error}"))?;
    let tests = match table.get("tests") {
        Some(Value::Integer(count)) if *count >= 0 => *count as usize,
        _ => return Err(format!("{FILE} needs `tests = N`, the count of the last whole run")),
    };
    let entries = match table.get("skip") {
        None => Vec::new(),
        Some(Value::Array(entries)) => entries.clone(),
        Some(_) => return Err(format!("{FILE}: `skip` must be a list of [[skip]] tables")),
    };
    let mut allowed = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let field = |key: &str| {
            entry
                .get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("{FILE}: [[skip]] number {} has no `{key} = \"...\"`", index + 1))
        };
        let when = match field("when")?.as_str() {
            "always" => When::Always,
            "no GPU" => When::NoGpu,
            "outside CI" => When::OutsideCi,
            other => {
                return Err(format!(
                    "{FILE}: [[skip]] number {}: when = \"{other}\"; use \"always\", \"no GPU\" or \"outside CI\"",
                    index + 1
                ))
            }
        };
        let reason = field("reason")?;
        if reason.trim().is_empty() {
            return Err(format!("{FILE}: [[skip]] number {} gives no reason", index + 1));
        }
        allowed.push(Allowed { target: field("target")?, name: field("name")?, when, reason });
    }
    Ok(ExpectedSkips { tests, allowed })
}

impl Allowed {
    fn allows(&self, skipped: &Skipped, machine: Machine) -> bool {
        let here = match self.when {
            When::Always => true,
            When::NoGpu => !machine.gpu,
            When::OutsideCi => !machine.ci,
        };
        let name = match self.name.strip_suffix('*') {
            Some(prefix) => skipped.name.starts_with(prefix),
            None => skipped.name == self.name,
        };
        here && name && self.target == skipped.target
    }
}

/// What is wrong with a whole run that counted `counted` tests and checks,
/// `skipped_count` of them skipped, `skips` of those by name: one line per
/// problem, empty when the run is as expected.
pub fn judge(
    expected: &ExpectedSkips,
    counted: usize,
    skipped_count: usize,
    skips: &[Skipped],
    machine: Machine,
) -> Vec<String> {
    let mut problems = Vec::new();
    for skipped in skips {
        if !expected.allowed.iter().any(|allowed| allowed.allows(skipped, machine)) {
            problems.push(format!(
                "{} {} was skipped ({}), and {FILE} does not allow it here: make it run, or add it with its reason",
                skipped.target, skipped.name, skipped.reason
            ));
        }
    }
    if skipped_count > skips.len() {
        problems.push(format!(
            "{} skipped without a name (an ignored doc test?): each skip must be named to be judged",
            skipped_count - skips.len()
        ));
    }
    if counted < expected.tests {
        problems.push(format!(
            "the run counted {counted} tests and checks, {} fewer than the {} of {FILE}: a test file stopped building or running, or tests were removed (then lower `tests` and say why)",
            expected.tests - counted,
            expected.tests
        ));
    }
    problems
}
