//! The outcome file: how a command task tells its worker *why* it failed, beyond an exit code.
//!
//! The worker gives every command task the path of a file in [`OUTCOME_FILE_ENV`]. A task that
//! ran out of GPU memory (a CUDA `cudaErrorMemoryAllocation`, PyTorch's `OutOfMemoryError`,
//! the simulated GPU of `escher sim-work`) writes one line there before it exits:
//!
//! ```text
//! out_of_memory used_mib=12288 limit_mib=9856
//! ```
//!
//! and the worker reports the attempt as [`TaskResult::OutOfMemory`] instead of its exit code,
//! so a policy can restart it on a larger slice. The file is read only when the process exits
//! with a code other than 0; anything else in it is ignored (the exit code stands).

use super::TaskResult;

/// The environment variable naming a command task's outcome file.
pub const OUTCOME_FILE_ENV: &str = "ESCHER_OUTCOME_FILE";

/// The most bytes of an outcome file the worker reads.
pub const MAX_OUTCOME_BYTES: usize = 4096;

/// The line a task writes when it ran out of memory.
pub fn out_of_memory_line(used_mib: u64, limit_mib: u64) -> String {
    format!("out_of_memory used_mib={used_mib} limit_mib={limit_mib}\n")
}

/// The outcome an outcome file states, if it states one this version understands.
pub fn parse_outcome(text: &str) -> Option<TaskResult> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut words = line.split_whitespace();
    if words.next()? != "out_of_memory" {
        return None;
    }
    let (mut used, mut limit) = (None, None);
    for word in words {
        let (key, value) = word.split_once('=')?;
        let value = value.parse::<u64>().ok()?;
        match key {
            "used_mib" => used = Some(value),
            "limit_mib" => limit = Some(value),
            _ => {}
        }
    }
    Some(TaskResult::OutOfMemory {
        used_mib: used?,
        limit_mib: limit?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_memory_line_round_trips() {
        let line = out_of_memory_line(12288, 9856);
        assert_eq!(
            parse_outcome(&line),
            Some(TaskResult::OutOfMemory {
                used_mib: 12288,
                limit_mib: 9856
            })
        );
        let padded = format!("\n  {}extra lines are ignored\n", line);
        assert!(parse_outcome(&padded).is_some());
        let reordered = "out_of_memory limit_mib=2 used_mib=3 note=1";
        assert_eq!(
            parse_outcome(reordered),
            Some(TaskResult::OutOfMemory {
                used_mib: 3,
                limit_mib: 2
            })
        );
    }

    #[test]
    fn anything_else_states_nothing() {
        for text in [
            "",
            "\n\n",
            "segfault",
            "out_of_memory",
            "out_of_memory used_mib=1",
            "out_of_memory used_mib=x limit_mib=2",
            "out_of_memory used_mib=1 limit_mib=-2",
            "out_of_memory used_mib",
        ] {
            assert_eq!(parse_outcome(text), None, "{text:?}");
        }
    }
}
