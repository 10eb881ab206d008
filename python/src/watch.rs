//! [`EventStream`]: the events of a watch, one at a time, as JSON text (the package turns them
//! into dicts, and into an iterator and an async iterator); [`LogTail`]: a command task's
//! output as it is written.

use std::sync::Arc;
use std::time::Duration;

use escher_client::Watch;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::Mutex;

use crate::{error, seconds, wait_for};

/// An open watch.
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct EventStream {
    watch: Arc<Mutex<Watch>>,
}

impl EventStream {
    pub(crate) fn new(watch: Watch) -> EventStream {
        EventStream {
            watch: Arc::new(Mutex::new(watch)),
        }
    }
}

#[pymethods]
impl EventStream {
    /// The next event as JSON, waiting at most `timeout` seconds (`None`: without limit);
    /// `None` when the timeout passed or the watch ended.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<String>> {
        let limit = seconds(timeout, "timeout")?.unwrap_or(Duration::MAX);
        let watch = Arc::clone(&self.watch);
        let next = wait_for(py, async move {
            let mut watch = watch.lock().await;
            tokio::time::timeout(limit, watch.next())
                .await
                .unwrap_or_default()
        })?;
        match next {
            None => Ok(None),
            Some(Ok(event)) => serde_json::to_string(&event)
                .map(Some)
                .map_err(|e| crate::EscherError::new_err(e.to_string())),
            Some(Err(e)) => Err(error(e)),
        }
    }

    /// The revision of the last event seen (to resume from).
    fn revision(&self, py: Python<'_>) -> PyResult<u64> {
        let watch = Arc::clone(&self.watch);
        wait_for(py, async move { watch.lock().await.revision() })
    }
}

/// A command task's output, read piece by piece as it is written (`escher.logs(ref,
/// follow=True)`).
#[pyclass(module = "escher._escher", frozen)]
#[derive(Debug)]
pub(crate) struct LogTail {
    reader: Arc<Mutex<escher_client::LogReader>>,
}

impl LogTail {
    pub(crate) fn new(reader: escher_client::LogReader) -> LogTail {
        LogTail {
            reader: Arc::new(Mutex::new(reader)),
        }
    }
}

#[pymethods]
impl LogTail {
    /// What was written since the last call (empty when nothing new yet); `None` once the
    /// task has finished and everything was read.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let reader = Arc::clone(&self.reader);
        let chunk =
            wait_for(py, async move { reader.lock().await.next_chunk().await })?.map_err(error)?;
        Ok(chunk.map(|bytes| PyBytes::new(py, &bytes)))
    }
}
