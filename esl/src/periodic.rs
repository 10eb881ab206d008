//! [`Periodic`]: a policy's background loop (the HFS rebalancer, the fault-tolerance watcher),
//! run every interval on the tokio runtime until it is stopped or its handle is dropped.
//!
//! The thesis runs ESLs as daemons (§4.3.3); a policy here stays a plain library object and
//! the application chooses to drive it from a background task. One shutdown mechanism: a
//! `watch` channel whose sender is the handle, so [`Periodic::stop`] ends the loop after the
//! round in progress and waits for it, and dropping the handle ends it too. (The workspace's
//! `CancellationToken` lives in `tokio-util`, which this crate does not depend on; a `watch`
//! channel gives the same "stop, then join" shape with tokio alone.)

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A background loop; stop it with [`stop`](Periodic::stop) (or drop it).
#[derive(Debug)]
pub struct Periodic {
    stop: watch::Sender<bool>,
    task: JoinHandle<u64>,
}

impl Periodic {
    /// Runs `round` now and then every `interval` (measured from the end of a round).
    pub(crate) fn spawn<F, Fut>(interval: Duration, mut round: F) -> Periodic
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut rounds = 0u64;
            loop {
                round().await;
                rounds += 1;
                tokio::select! {
                    biased;
                    // A closed channel (handle dropped) stops the loop as well.
                    _ = stopped.changed() => return rounds,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
        });
        Periodic { stop, task }
    }

    /// Stops the loop after the round in progress and waits for it; how many rounds ran.
    pub async fn stop(self) -> u64 {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test]
    async fn runs_until_stopped_and_not_after() {
        let count = Arc::new(AtomicU64::new(0));
        let seen = count.clone();
        let p = Periodic::spawn(Duration::from_millis(1), move || {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while count.load(Ordering::SeqCst) < 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the loop never ran 3 rounds"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let rounds = p.stop().await;
        assert_eq!(rounds, count.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            count.load(Ordering::SeqCst),
            rounds,
            "nothing runs after stop"
        );
    }
}
