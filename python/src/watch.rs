//! [`EventStream`]: the events of a watch, one at a time, as JSON text (the package turns them
//! into dicts, and into an iterator and an async iterator).

use std::sync::Arc;
use std::time::Duration;

use escher_client::Watch;
use pyo3::prelude::*;
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
