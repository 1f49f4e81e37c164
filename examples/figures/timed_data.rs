//! Reads the data files that benchmarks
//! write into `chapters/figures/data/`, for the timed figures of
//! `cargo run --example figures`. A data file is tab-separated text: `# key
//! <tab> value` lines about the run (its command, the machine, its load),
//! then a header row naming the columns, then one row per measurement. A
//! missing file, key or column is an error that names it.

use std::path::PathBuf;

use anyhow::Context;

/// `chapters/figures/data/NAME`.
pub fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("chapters").join("figures").join("data").join(name)
}

/// The text of data file `name`.
pub fn read_text(name: &str) -> anyhow::Result<String> {
    let path = data_path(name);
    std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (its benchmark writes it: see the figure's module for the command)",
            path.display()
        )
    })
}

/// One data file: what it says about its run, its columns and its rows.
pub struct DataFile {
    name: String,
    about: Vec<(String, String)>,
    columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Data file `name`, read.
pub fn read_data(name: &str) -> anyhow::Result<DataFile> {
    let text = read_text(name)?;
    let mut file = DataFile { name: name.into(), about: vec![], columns: vec![], rows: vec![] };
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if let Some(about) = line.strip_prefix("# ") {
            let (key, value) = about.split_once('\t').unwrap_or((about, ""));
            file.about.push((key.to_string(), value.to_string()));
        } else if file.columns.is_empty() {
            file.columns = line.split('\t').map(str::to_string).collect();
        } else {
            file.rows.push(line.split('\t').map(str::to_string).collect());
        }
    }
    anyhow::ensure!(!file.rows.is_empty(), "{name} has no rows of data");
    Ok(file)
}

impl DataFile {
    /// The value of `# key` about the run.
    pub fn about(&self, key: &str) -> anyhow::Result<&str> {
        let found = self.about.iter().find(|(k, _)| k == key).map(|(_, value)| value.as_str());
        found.with_context(|| format!("{} says nothing about `{key}`", self.name))
    }

    /// `row`'s value in column `column`.
    pub fn get<'a>(&self, row: &'a [String], column: &str) -> anyhow::Result<&'a str> {
        let index = self.columns.iter().position(|c| c == column);
        let index = index.with_context(|| format!("{} has no column `{column}`", self.name))?;
        row.get(index).map(String::as_str).with_context(|| format!("a row of {} is short", self.name))
    }

    /// `row`'s value in column `column`, as a number.
    pub fn number(&self, row: &[String], column: &str) -> anyhow::Result<f64> {
        let text = self.get(row, column)?;
        text.parse().with_context(|| format!("{}: `{text}` in column `{column}` is not a number", self.name))
    }
}
