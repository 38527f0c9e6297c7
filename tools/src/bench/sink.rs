//! Where a running benchmark's results go as they are made: each row is printed the moment
//! it finishes (stdout, whatever `--quiet` says: quiet silences only the progress bar) and the
//! `--json` file is rewritten, whole and atomically, after every row and every ceiling. A run
//! stopped part-way (a time limit, Ctrl-C) leaves every finished row on screen and a valid
//! JSON file holding them.

use std::io::Write;
use std::path::PathBuf;

use polyattn::error::{Error, Result};

use super::report::{self, BenchFile, Row};
use polyattn::probe::Peaks;

/// Receives a run's ceilings and rows as they are measured.
pub struct ResultSink<W: Write> {
    out: W,
    json: Option<PathBuf>,
    file: BenchFile,
    header_printed: bool,
}

impl<W: Write> ResultSink<W> {
    /// A sink printing to `out` and saving to `json` (when given) the document `file`, whose
    /// rows and ceilings the sink's calls add. Prints the machine line and saves the file
    /// (with the rows and ceilings it already has) at once.
    pub fn new(mut out: W, json: Option<PathBuf>, file: BenchFile) -> Result<Self> {
        writeln!(out, "machine: {}", file.machine.summary()).map_err(stdout_err)?;
        out.flush().map_err(stdout_err)?;
        let sink = ResultSink {
            out,
            json,
            file,
            header_printed: false,
        };
        sink.save()?;
        Ok(sink)
    }

    /// Adds the ceilings of a device: printed, and saved.
    pub fn ceilings(&mut self, peaks: Peaks) -> Result<()> {
        for l in report::peaks_lines(std::slice::from_ref(&peaks)) {
            writeln!(self.out, "ceilings: {l}").map_err(stdout_err)?;
        }
        self.out.flush().map_err(stdout_err)?;
        self.file.peaks.push(peaks);
        self.save()
    }

    /// Adds a finished row: printed (the table header first, once), and saved.
    pub fn row(&mut self, row: Row) -> Result<()> {
        if !self.header_printed {
            writeln!(self.out, "{}", report::stream_header()).map_err(stdout_err)?;
            self.header_printed = true;
        }
        writeln!(self.out, "{}", report::stream_line(&row)).map_err(stdout_err)?;
        self.out.flush().map_err(stdout_err)?;
        self.file.rows.push(row);
        self.save()
    }

    /// The document so far.
    pub fn file(&self) -> &BenchFile {
        &self.file
    }

    /// Ends the run: `finish_machine` completes the machine record (clocks after the run),
    /// the file is saved a last time and returned.
    pub fn finish(mut self, finish_machine: impl FnOnce(&mut BenchFile)) -> Result<BenchFile> {
        finish_machine(&mut self.file);
        self.save()?;
        Ok(self.file)
    }

    fn save(&self) -> Result<()> {
        match &self.json {
            Some(path) => self.file.save(path),
            None => Ok(()),
        }
    }
}

fn stdout_err(e: std::io::Error) -> Error {
    Error::Io {
        path: "<stdout>".into(),
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::machine::Machine;
    use crate::bench::report::{Status, SCHEMA};

    fn row(id: &str, us: Option<f64>) -> Row {
        let mut v = serde_json::json!({
            "id": id, "group": "C", "family": "decode", "shape": "B=1",
            "backend": "CPU", "device": "cpu", "dtype": "f32", "kv_dtype": "auto",
            "status": if us.is_some() { "ok" } else { "skipped" },
            "flops": 1e9, "bytes": 1e8, "reps": 5,
        });
        if let Some(us) = us {
            // Values that JSON round-trips exactly (the test compares rows read back).
            v["us_median"] = us.into();
            v["us_p10"] = (us - 0.5).into();
            v["us_p90"] = (us + 0.5).into();
        } else {
            v["note"] = "too large".into();
        }
        serde_json::from_value(v).expect("row")
    }

    fn empty_file() -> BenchFile {
        BenchFile {
            schema: SCHEMA.into(),
            generator: "test".into(),
            command: "polyattn bench".into(),
            machine: Machine {
                cpu_model: "test cpu".into(),
                ..Default::default()
            },
            peaks: vec![],
            rows: vec![],
        }
    }

    fn peaks() -> Peaks {
        Peaks {
            device: "cpu".into(),
            kind: "cpu".into(),
            dtype: "f32".into(),
            compute_tflops: 0.1,
            compute_method: "fma".into(),
            mem_gbps: 10.0,
            mem_method: "copy".into(),
            read_gbps: None,
        }
    }

    /// A folder of its own under the system's temporary folder.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("polyattn-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn every_row_is_printed_and_saved_as_it_finishes() {
        let dir = scratch("rows");
        let path = dir.join("out.json");
        let mut out = Vec::new();
        {
            let mut sink = ResultSink::new(&mut out, Some(path.clone()), empty_file()).unwrap();
            // Saved before any row: a run stopped while measuring its first row still
            // leaves a valid file.
            assert!(BenchFile::load(&path).unwrap().rows.is_empty());
            sink.ceilings(peaks()).unwrap();
            assert_eq!(BenchFile::load(&path).unwrap().peaks, vec![peaks()]);
            let rows = [
                row("C.D1.s4k", Some(2000.0)),
                row("C.P1.s1k", None),
                row("C.P2.s2k", Some(35.5)),
            ];
            for (n, r) in rows.iter().enumerate() {
                sink.row(r.clone()).unwrap();
                // After every row the file parses and holds exactly the rows so far: what a
                // run stopped here leaves.
                let saved = BenchFile::load(&path).unwrap();
                assert_eq!(saved.rows, rows[..=n].to_vec());
                assert_eq!(sink.file().rows.len(), n + 1);
            }
            let done = sink
                .finish(|f| {
                    f.machine.extra.insert("after".into(), "yes".into());
                })
                .unwrap();
            assert_eq!(done.rows.len(), 3);
            assert_eq!(BenchFile::load(&path).unwrap(), done);
        }
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("machine: test cpu"), "{text}");
        assert!(
            lines[1].starts_with("ceilings: cpu: compute 0.100"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("id ") && lines[2].contains("µs median"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("C.D1.s4k") && lines[3].contains("2000"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("C.P1.s1k") && lines[4].contains("skipped: too large"),
            "{text}"
        );
        assert!(
            lines[5].starts_with("C.P2.s2k") && lines[5].contains("35.50"),
            "{text}"
        );
        assert_eq!(lines.len(), 6, "{text}");
        // Only the result is left in the folder: no temporary file.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["out.json".to_string()]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_json_rows_are_still_printed() {
        let mut out = Vec::new();
        let mut sink = ResultSink::new(&mut out, None, empty_file()).unwrap();
        sink.row(row("G.b1", Some(3.0))).unwrap();
        let f = sink.finish(|_| {}).unwrap();
        assert_eq!(f.rows[0].status, Status::Ok);
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().any(|l| l.starts_with("G.b1")), "{text}");
    }

    #[test]
    fn a_save_replaces_the_previous_file_whole() {
        let dir = scratch("replace");
        let path = dir.join("r.json");
        std::fs::create_dir_all(&dir).unwrap();
        // A longer earlier file: a shorter rewrite must not leave its tail behind.
        std::fs::write(&path, "x".repeat(100_000)).unwrap();
        let mut f = empty_file();
        f.rows.push(row("K.1", Some(1.0)));
        f.save(&path).unwrap();
        assert_eq!(BenchFile::load(&path).unwrap(), f);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
