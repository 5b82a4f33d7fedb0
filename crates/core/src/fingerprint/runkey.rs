//! Deterministic ids: hashes of inputs, never of the clock or a random source.

use crate::job::date::RunDate;
use crate::fingerprint::Fingerprint;
use crate::job::digest::hash_hex;
use crate::job::files::InputFiles;

/// The run key: a hash of the job's definition, the run date and the input's
/// fingerprint. A retry over the same input has the same key; one changed
/// input row gives another.
pub fn run_key(job_hash: &str, run_date: RunDate, input: &Fingerprint) -> String {
    hash_hex(&["fixpoint-run-v1", job_hash, &run_date.to_string(), &input.kind, &input.rows.to_string(), &input.checksum])
}

impl InputFiles {
    /// The input fingerprint of a file source: its kind
    /// ([`InputFiles::kind`]), the number of files, the combined hash.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint { kind: self.kind().into(), rows: self.files.len() as u64, checksum: self.checksum.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_delimited() {
        assert_ne!(hash_hex(&["ab", "c"]), hash_hex(&["a", "bc"]));
        assert_eq!(hash_hex(&["a"]).len(), 32);
    }

    #[test]
    fn run_key_depends_on_each_input() {
        let d = RunDate::parse("2026-10-20").unwrap();
        let fp = Fingerprint { kind: "k".into(), rows: 3, checksum: "c".into() };
        let k = run_key("job", d, &fp);
        assert_eq!(k, run_key("job", d, &fp.clone()));
        assert_ne!(k, run_key("job2", d, &fp));
        assert_ne!(k, run_key("job", d.next(), &fp));
        assert_ne!(k, run_key("job", d, &Fingerprint { rows: 4, ..fp.clone() }));
        assert_ne!(k, run_key("job", d, &Fingerprint { checksum: "d".into(), ..fp }));
    }
}
