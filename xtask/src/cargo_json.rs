//! Reads the lines of
//! `cargo test --no-run --message-format=json`, to learn which test
//! executables cargo built (so that the runner can start them itself, with
//! libtest's JSON output) and what the compiler said when the build failed.
//! Unit tests: xtask/tests/cargo_json.rs (`cargo test -p xtask`).

use std::path::PathBuf;

use serde_json::Value;

/// One test executable: a `#[test]` harness built from one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestExecutable {
    /// The target's name: `chapter_01`, or the library's `ddp_workbook`.
    pub target_name: String,
    /// The target's kind: `lib`, `test`, `bin`, `example`, `bench`.
    pub kind: String,
    pub path: PathBuf,
}

impl TestExecutable {
    /// The cargo flag that selects this target: `--test chapter_01`, `--lib`.
    pub fn cargo_selector(&self) -> String {
        match self.kind.as_str() {
            "lib" | "rlib" | "cdylib" | "dylib" | "staticlib" | "proc-macro" => "--lib".to_string(),
            kind => format!("--{kind} {}", self.target_name),
        }
    }

    /// Order in which `cargo test` runs them: the library's unit tests first,
    /// then the other targets by name.
    pub fn run_order(&self) -> (bool, String) {
        (self.kind != "lib", self.target_name.clone())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CargoMessage {
    /// A test harness was built (`profile.test` with an `executable`).
    TestExecutable(TestExecutable),
    /// A compiler diagnostic, already rendered as rustc prints it.
    Diagnostic { level: String, rendered: String },
    /// The last message: did the whole build succeed?
    BuildFinished { success: bool },
    /// Anything else: other artifacts, build-script output.
    Other,
}

/// Reads one line of cargo's JSON output; `None` for a line that is not
/// JSON (cargo prints nothing else on stdout, but a build script might).
pub fn parse_cargo_line(line: &str) -> Option<CargoMessage> {
    let value: Value = serde_json::from_str(line).ok()?;
    let message = match value.get("reason")?.as_str()? {
        "compiler-artifact" => {
            test_executable(&value).map_or(CargoMessage::Other, CargoMessage::TestExecutable)
        }
        "compiler-message" => {
            let message = value.get("message")?;
            CargoMessage::Diagnostic {
                level: message.get("level").and_then(Value::as_str).unwrap_or("").to_string(),
                rendered: message.get("rendered").and_then(Value::as_str).unwrap_or("").to_string(),
            }
        }
        "build-finished" => {
            CargoMessage::BuildFinished { success: value.get("success").and_then(Value::as_bool)? }
        }
        _ => CargoMessage::Other,
    };
    Some(message)
}

fn test_executable(artifact: &Value) -> Option<TestExecutable> {
    let is_test = artifact.pointer("/profile/test").and_then(Value::as_bool) == Some(true);
    let path = artifact.get("executable").and_then(Value::as_str)?; // null for libraries
    if !is_test {
        return None; // an example or binary built only to check it compiles
    }
    let target = artifact.get("target")?;
    Some(TestExecutable {
        target_name: target.get("name")?.as_str()?.to_string(),
        kind: target.pointer("/kind/0").and_then(Value::as_str).unwrap_or("test").to_string(),
        path: PathBuf::from(path),
    })
}

/// What a `cargo ... --message-format=json` build produced.
#[derive(Debug, Default)]
pub struct BuildOutcome {
    pub executables: Vec<TestExecutable>,
    /// Rendered error diagnostics, in the order rustc gave them.
    pub errors: Vec<String>,
    /// Rendered warnings (cargo replays them for crates it did not rebuild).
    pub warnings: Vec<String>,
    /// From the `build-finished` message; `None` if cargo never sent it
    /// (it failed before building: a bad manifest, an unknown target).
    pub success: Option<bool>,
}

impl BuildOutcome {
    /// Takes in one line of cargo's stdout; returns the diagnostic to show.
    pub fn record(&mut self, line: &str) -> Option<String> {
        match parse_cargo_line(line)? {
            CargoMessage::TestExecutable(executable) => {
                self.executables.push(executable);
                None
            }
            CargoMessage::Diagnostic { level, rendered } => {
                match level.as_str() {
                    "error" => self.errors.push(rendered.clone()),
                    "warning" => self.warnings.push(rendered.clone()),
                    _ => {}
                }
                Some(rendered)
            }
            CargoMessage::BuildFinished { success } => {
                self.success = Some(success);
                None
            }
            CargoMessage::Other => None,
        }
    }

    /// The executables sorted the way `cargo test` would run them.
    pub fn executables_in_run_order(&self) -> Vec<TestExecutable> {
        let mut sorted = self.executables.clone();
        sorted.sort_by_key(TestExecutable::run_order);
        sorted.dedup();
        sorted
    }
}
