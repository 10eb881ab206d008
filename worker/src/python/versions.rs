//! The driver's Python and cloudpickle against the worker's, compared at each call before
//! anything is unpickled.
//!
//! A function pickled by one cloudpickle may not load with another (cloudpickle 3 names helpers
//! that cloudpickle 2 does not have: the task would fail with `AttributeError: Can't get
//! attribute '_function_setstate'`), and code objects of one Python minor version do not run on
//! another. So a call (format 2 of the envelope, `mod.rs`) carries the driver's versions, and
//! the worker refuses it when the Python or the cloudpickle differ in their major or minor
//! version, naming both sides and what to do. Releases that differ only in their last number
//! are let through; should loading still fail, the failure names both sides too.

use super::detect::Found;

/// A driver's versions, as its envelope says them: `3.11.7 3.1.1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Versions {
    /// Python's, `3.11.7`.
    pub(crate) python: String,
    /// cloudpickle's, `3.1.1`.
    pub(crate) cloudpickle: String,
}

impl Versions {
    /// `PYTHON CLOUDPICKLE`, two words of printable text; `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<Versions> {
        let mut words = text.split(' ');
        let (python, cloudpickle) = (words.next()?, words.next()?);
        let fine =
            |w: &str| !w.is_empty() && w.len() <= 64 && w.bytes().all(|b| b.is_ascii_graphic());
        (fine(python) && fine(cloudpickle) && words.next().is_none()).then(|| Versions {
            python: python.to_string(),
            cloudpickle: cloudpickle.to_string(),
        })
    }
}

/// `3.11` of `3.11.7` (or of `3.11`); the whole text where there is no second number.
fn feature(version: &str) -> &str {
    let mut dots = version.match_indices('.');
    match (dots.next(), dots.next()) {
        (Some(_), Some((second, _))) => &version[..second],
        _ => version,
    }
}

/// Why a call from `driver` cannot run on `worker`, or `None` when their Python and
/// cloudpickle agree in their major and minor versions.
pub(crate) fn mismatch(driver: &Versions, worker: &Found) -> Option<String> {
    let python = feature(&driver.python) != feature(&worker.version);
    let cloudpickle = feature(&driver.cloudpickle) != feature(&worker.cloudpickle);
    if !python && !cloudpickle {
        return None;
    }
    let what = match (python, cloudpickle) {
        (true, true) => "Python and cloudpickle differ",
        (true, false) => "Python differs",
        _ => "cloudpickle differs",
    };
    let mut fixes = Vec::new();
    if cloudpickle {
        fixes.push(format!(
            "install the worker's cloudpickle in the driver's environment (pip install \
             cloudpickle=={}), or the driver's on the workers",
            worker.cloudpickle
        ));
    }
    if python {
        fixes.push(format!(
            "run the driver with Python {} as the workers do, or give the workers an \
             interpreter of Python {} (ESCHER_PYTHON)",
            feature(&worker.version),
            feature(&driver.python)
        ));
    }
    Some(format!(
        "the driver's {what} from this worker's: the driver runs Python {} with cloudpickle {}, \
         the worker ({}) Python {} with cloudpickle {}; a function pickled by one cannot be \
         loaded by the other. To fix it, {}",
        driver.python,
        driver.cloudpickle,
        worker.exe.display(),
        worker.version,
        worker.cloudpickle,
        fixes.join("; and ")
    ))
}

/// The text of a task whose function or arguments could not be loaded (`why`, the
/// interpreter's), with both sides' versions where they differ at all.
pub(crate) fn load_failure(why: &str, driver: Option<&Versions>, worker: &Found) -> String {
    match driver {
        Some(d) if d.python != worker.version || d.cloudpickle != worker.cloudpickle => format!(
            "{why} (the driver runs Python {} with cloudpickle {}, the worker Python {} with \
             cloudpickle {}: where a function pickled by one does not load with the other, \
             install the same versions on both sides)",
            d.python, d.cloudpickle, worker.version, worker.cloudpickle
        ),
        Some(_) => why.to_string(),
        None => format!(
            "{why} (this worker runs Python {} with cloudpickle {}; an older escher package \
             does not say the driver's)",
            worker.version, worker.cloudpickle
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(python: &str, cloudpickle: &str) -> Found {
        Found {
            exe: "/usr/bin/python3".into(),
            version: python.into(),
            cloudpickle: cloudpickle.into(),
        }
    }

    fn driver(text: &str) -> Versions {
        Versions::parse(text).expect("two versions")
    }

    #[test]
    fn versions_are_read_and_nonsense_is_not() {
        assert_eq!(
            Versions::parse("3.12.3 3.1.1"),
            Some(Versions {
                python: "3.12.3".into(),
                cloudpickle: "3.1.1".into()
            })
        );
        for bad in [
            "",
            "3.12.3",
            "3.12.3  3.1.1",
            "3.12.3 3.1.1 x",
            "3.12\n 3.1",
        ] {
            assert_eq!(Versions::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_different_cloudpickle_is_refused_naming_both_sides_and_the_fix() {
        let why = mismatch(&driver("3.11.7 3.1.3"), &worker("3.11.2", "2.1.0")).unwrap();
        for part in [
            "cloudpickle differs",
            "cloudpickle 3.1.3",
            "cloudpickle 2.1.0",
            "pip install cloudpickle==2.1.0",
            "/usr/bin/python3",
        ] {
            assert!(why.contains(part), "{part}: {why}");
        }
        assert!(!why.contains("run the driver with Python"), "{why}");
    }

    #[test]
    fn a_different_python_is_refused_too() {
        let why = mismatch(&driver("3.12.1 3.1.1"), &worker("3.11.7", "3.1.0")).unwrap();
        assert!(why.contains("Python differs"), "{why}");
        assert!(
            why.contains("Python 3.12.1") && why.contains("Python 3.11.7"),
            "{why}"
        );
        assert!(why.contains("Python 3.11 as the workers do"), "{why}");
        let both = mismatch(&driver("3.12.1 2.2.1"), &worker("3.11.7", "3.1.0")).unwrap();
        assert!(both.contains("Python and cloudpickle differ"), "{both}");
    }

    #[test]
    fn releases_that_differ_in_their_last_number_run() {
        assert_eq!(
            mismatch(&driver("3.11.7 3.1.1"), &worker("3.11.2", "3.1.0")),
            None
        );
        assert_eq!(
            mismatch(&driver("3.11 3.1"), &worker("3.11.2", "3.1.0")),
            None
        );
        assert_eq!(feature("3.11.7"), "3.11");
        assert_eq!(feature("3"), "3");
    }

    #[test]
    fn a_load_failure_says_which_versions_met() {
        let w = worker("3.11.2", "3.1.0");
        let text = load_failure("cannot load", Some(&driver("3.11.7 3.1.1")), &w);
        assert!(text.contains("cloudpickle 3.1.1") && text.contains("cloudpickle 3.1.0"));
        assert_eq!(
            load_failure("cannot load", Some(&driver("3.11.2 3.1.0")), &w),
            "cannot load"
        );
        assert!(load_failure("cannot load", None, &w).contains("older escher package"));
    }
}
