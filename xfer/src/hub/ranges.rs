//! What each server does with a Range request, learnt from its first
//! answer. Until a host has answered one, only one ranged request at a time
//! goes to it; the others wait for that answer. A host that honours Range
//! then gets every part in parallel; one that ignores it (olah's local
//! mirrors answer `200` with the whole file) gets one whole-file request per
//! file, instead of one per part, each of which it would answer with the
//! whole file.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// What a request to a host should be.
#[derive(Debug, PartialEq, Eq)]
pub enum Ask {
    /// The host honours Range: ask for the part.
    Part,
    /// The host ignores Range: ask for the whole file.
    Whole,
    /// Nobody knows yet: ask for the part, and tell [`Probe::learnt`] what
    /// came back (dropping the probe unanswered lets another try).
    Probe(Probe),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Probing,
    Honours,
    Ignores,
}

#[derive(Default)]
struct Inner {
    hosts: Mutex<HashMap<String, State>>,
    answered: Notify,
}

/// The hosts of one download.
#[derive(Default, Clone)]
pub struct RangeHosts(Arc<Inner>);

/// The one request in flight that will tell how a host treats Range.
#[derive(Debug)]
pub struct Probe {
    hosts: Option<RangeHosts>,
    host: String,
}

impl std::fmt::Debug for RangeHosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.hosts.lock().unwrap().iter())
            .finish()
    }
}

impl PartialEq for Probe {
    fn eq(&self, other: &Probe) -> bool {
        self.host == other.host
    }
}
impl Eq for Probe {}

impl RangeHosts {
    /// How to ask `host` for a part; waits while another request probes it.
    pub async fn ask(&self, host: &str) -> Ask {
        loop {
            let answered = self.0.answered.notified();
            {
                let mut hosts = self.0.hosts.lock().unwrap();
                match hosts.get(host) {
                    None => {
                        hosts.insert(host.to_string(), State::Probing);
                        return Ask::Probe(Probe {
                            hosts: Some(self.clone()),
                            host: host.to_string(),
                        });
                    }
                    Some(State::Honours) => return Ask::Part,
                    Some(State::Ignores) => return Ask::Whole,
                    Some(State::Probing) => {}
                }
            }
            answered.await;
        }
    }

    /// Whether `host` is known to ignore Range.
    pub fn ignores(&self, host: &str) -> bool {
        self.0.hosts.lock().unwrap().get(host) == Some(&State::Ignores)
    }

    fn settle(&self, host: &str, state: Option<State>) {
        let mut hosts = self.0.hosts.lock().unwrap();
        match state {
            Some(s) => hosts.insert(host.to_string(), s),
            None => hosts.remove(host),
        };
        drop(hosts);
        self.0.answered.notify_waiters();
    }
}

impl Probe {
    /// The host answered a ranged request with `206` (`honours`) or with
    /// `200` and the whole file.
    pub fn learnt(mut self, honours: bool) {
        if let Some(h) = self.hosts.take() {
            let s = if honours {
                State::Honours
            } else {
                State::Ignores
            };
            h.settle(&self.host, Some(s));
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(h) = self.hosts.take() {
            h.settle(&self.host, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_probe_per_host_and_the_others_wait_for_its_answer() {
        let hosts = RangeHosts::default();
        let Ask::Probe(p) = hosts.ask("a").await else {
            panic!("the first ask probes")
        };
        // Another host is independent.
        assert!(matches!(hosts.ask("b").await, Ask::Probe(_)));
        let waiter = tokio::spawn({
            let hosts = hosts.clone();
            async move { hosts.ask("a").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        p.learnt(false);
        assert_eq!(waiter.await.unwrap(), Ask::Whole);
        assert!(hosts.ignores("a"));
    }

    #[tokio::test]
    async fn an_unanswered_probe_lets_the_next_request_probe() {
        let hosts = RangeHosts::default();
        let Ask::Probe(p) = hosts.ask("a").await else {
            panic!()
        };
        let waiter = tokio::spawn({
            let hosts = hosts.clone();
            async move { hosts.ask("a").await }
        });
        drop(p); // the request failed before any answer
        let Ask::Probe(p2) = waiter.await.unwrap() else {
            panic!("the waiter probes next")
        };
        p2.learnt(true);
        assert_eq!(hosts.ask("a").await, Ask::Part);
        assert!(!hosts.ignores("a"));
    }
}
