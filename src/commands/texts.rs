//! Texts from a file, one per line: plain text, or JSONL with the text in a named field. Every
//! line is checked (valid UTF-8, valid JSON object, a non-empty string field) and a bad one is
//! an error naming the file and the line. Shared by `embed` (streamed) and `quantize`
//! (calibration text, read whole).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::error::CliError;

/// Whether `path` names a JSONL file (`.jsonl` / `.ndjson`), else plain text.
pub(crate) fn jsonl_by_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .is_some_and(|e| e == "jsonl" || e == "ndjson")
}

/// All texts of `path` (the `text` field of JSONL, or each line), in order; an empty file is
/// an error.
pub(crate) fn read_all(path: &Path) -> Result<Vec<String>, CliError> {
    let texts =
        Texts::open(path, jsonl_by_extension(path), "text")?.collect::<Result<Vec<_>, _>>()?;
    if texts.is_empty() {
        return Err(CliError::Runtime(runtime::Error::Data {
            path: path.to_path_buf(),
            message: "no texts (the file is empty)".into(),
        }));
    }
    Ok(texts)
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
    move |source| CliError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn line_err(path: &Path, line: usize, message: impl Into<String>) -> CliError {
    CliError::Runtime(runtime::Error::DataLine {
        path: path.to_path_buf(),
        line,
        message: message.into(),
    })
}

/// The lines of a text file, read one at a time.
pub(crate) struct Texts {
    path: PathBuf,
    jsonl: bool,
    field: String,
    lines: std::io::Lines<BufReader<File>>,
    line: usize,
}

impl Texts {
    pub(crate) fn open(path: &Path, jsonl: bool, field: &str) -> Result<Texts, CliError> {
        let file = File::open(path).map_err(io_err(path))?;
        Ok(Texts {
            path: path.to_path_buf(),
            jsonl,
            field: field.to_string(),
            lines: BufReader::new(file).lines(),
            line: 0,
        })
    }

    /// The text of one line (1-based `line`): checked, never empty.
    fn parse(&self, raw: &str) -> Result<String, CliError> {
        let line = self.line;
        let text = if self.jsonl {
            let v: serde_json::Value = if raw.trim().is_empty() {
                return Err(line_err(&self.path, line, "empty line"));
            } else {
                serde_json::from_str(raw)
                    .map_err(|e| line_err(&self.path, line, format!("not valid JSON: {e}")))?
            };
            let obj = v
                .as_object()
                .ok_or_else(|| line_err(&self.path, line, "not a JSON object"))?;
            match obj.get(&self.field) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(_) => {
                    return Err(line_err(
                        &self.path,
                        line,
                        format!("field `{}` is not a string", self.field),
                    ))
                }
                None => {
                    return Err(line_err(
                        &self.path,
                        line,
                        format!("no field `{}`", self.field),
                    ))
                }
            }
        } else {
            raw.strip_suffix('\r').unwrap_or(raw).to_string()
        };
        if text.trim().is_empty() {
            return Err(line_err(
                &self.path,
                line,
                if self.jsonl {
                    format!("field `{}` is empty", self.field)
                } else {
                    "empty line".to_string()
                },
            ));
        }
        Ok(text)
    }
}

impl Iterator for Texts {
    type Item = Result<String, CliError>;

    fn next(&mut self) -> Option<Self::Item> {
        let raw = self.lines.next()?;
        self.line += 1;
        Some(match raw {
            Ok(r) => self.parse(&r),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                Err(line_err(&self.path, self.line, "not valid UTF-8"))
            }
            Err(e) => Err(io_err(&self.path)(e)),
        })
    }
}
