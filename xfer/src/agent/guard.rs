//! Bounded work for hostile peers, decided per incoming connection before
//! its handshake: how many connections one source address may hold, how
//! often it may start a handshake, and when it must first prove it owns its
//! address (a QUIC Retry).
//!
//! Every incoming connection is first counted against its source IP
//! ([`MAX_CONNECTIONS_PER_SOURCE`]); one over the cap is refused
//! (`Incoming::refuse`) before any cryptography. An incoming whose address
//! is not validated is then sent a Retry (stateless: one sealed token, no
//! state kept) when the [`RetryPolicy`] says so; a spoofed source cannot
//! answer it, so it never reaches the handshake nor the buckets below.
//! Last, each handshake takes a token from its source's bucket
//! ([`HANDSHAKE_BURST`], refilled at [`HANDSHAKES_PER_SECOND`]); a handshake
//! that authenticates gives its token back, so only failed or abandoned
//! handshakes drain a bucket: a node of the cluster opening connections is
//! never limited, an intruder retrying is, after the burst.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Connections (in handshake or established) one source IP may hold at
/// once; more are refused before the handshake. A node opens a few per
/// job (a control connection, a swarm link); 64 leaves room for many
/// concurrent jobs from one node and bounds what one address can pin:
/// per connection, [`crate::transport::quic::MAX_CONCURRENT_STREAMS`]
/// streams and one frame of at most `frame::MAX_FRAME` being read.
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 64;

/// Failed (or abandoned) handshakes one source IP may start in a burst.
pub const HANDSHAKE_BURST: u32 = 32;

/// The rate at which a source's handshake bucket refills, per second.
pub const HANDSHAKES_PER_SECOND: u32 = 8;

/// Handshakes in progress above which an incoming whose address is not
/// validated gets a Retry under [`RetryPolicy::UnderLoad`].
pub const RETRY_ABOVE_HANDSHAKES: usize = 16;

/// Source addresses tracked at once. A source with no connection and a
/// full bucket is forgotten when room is needed; a new source finding no
/// room is refused (each entry is a few dozen bytes: the map stays a few
/// MiB at most).
pub const MAX_SOURCES: usize = 65_536;

/// When an incoming whose source address is not validated is sent a Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RetryPolicy {
    /// Always: every connection costs one more round trip, and no
    /// unvalidated address ever reaches the handshake.
    Always,
    /// When more than [`RETRY_ABOVE_HANDSHAKES`] handshakes are in
    /// progress, or the source's bucket is empty.
    UnderLoad,
    /// Never (for measurements).
    Never,
}

/// The guard's settings; [`Default`] is the constants above.
#[derive(Debug, Clone, Copy)]
pub struct GuardConfig {
    /// How a source is asked to prove its address (QUIC Retry).
    pub retry: RetryPolicy,
    /// Connections one source address may hold at once.
    pub max_connections_per_source: usize,
    /// 0: no handshake rate limit.
    pub handshake_burst: u32,
    /// Handshakes started per second, over all sources, at the most.
    pub handshakes_per_second: u32,
    /// Source addresses tracked at once, at the most.
    pub max_sources: usize,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            retry: RetryPolicy::Always,
            max_connections_per_source: MAX_CONNECTIONS_PER_SOURCE,
            handshake_burst: HANDSHAKE_BURST,
            handshakes_per_second: HANDSHAKES_PER_SECOND,
            max_sources: MAX_SOURCES,
        }
    }
}

/// What to do with one incoming connection.
#[derive(Debug)]
pub enum Admit {
    /// Go on with the handshake; the connection counts against its source
    /// until the [`Admitted`] is dropped.
    Accept(Admitted),
    /// Send a Retry.
    Retry,
    /// Refuse, for this reason.
    Refuse(String),
}

/// The source an address counts as: an IPv4 address (also when mapped
/// into IPv6), or an IPv6 /64, the smallest block one host is usually
/// given (so one host cannot escape its caps by changing addresses).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
}

/// One source's connections and handshake bucket.
#[derive(Debug)]
struct Source {
    connections: usize,
    tokens: f64,
    refilled: Instant,
}

#[derive(Debug, Default)]
struct State {
    sources: HashMap<IpAddr, Source>,
    handshaking: usize,
}

/// Per-source connection caps and handshake buckets, shared by the accept
/// loop's tasks.
#[derive(Debug)]
pub struct Guard {
    cfg: GuardConfig,
    state: Mutex<State>,
}

impl Source {
    fn refill(&mut self, cfg: &GuardConfig, now: Instant) {
        let dt = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + dt * f64::from(cfg.handshakes_per_second))
            .min(f64::from(cfg.handshake_burst));
        self.refilled = now;
    }

    fn idle(&self, cfg: &GuardConfig) -> bool {
        self.connections == 0 && self.tokens >= f64::from(cfg.handshake_burst)
    }
}

impl Guard {
    /// A guard with these settings.
    pub fn new(cfg: GuardConfig) -> Arc<Guard> {
        Arc::new(Guard {
            cfg,
            state: Mutex::default(),
        })
    }

    /// Decides for an incoming from `ip` (`validated`: it answered a Retry;
    /// `may_retry`: it has not been sent one yet).
    pub fn admit(self: &Arc<Self>, ip: IpAddr, validated: bool, may_retry: bool) -> Admit {
        self.admit_at(source_key(ip), validated, may_retry, Instant::now())
    }

    fn admit_at(
        self: &Arc<Self>,
        ip: IpAddr,
        validated: bool,
        may_retry: bool,
        now: Instant,
    ) -> Admit {
        let cfg = &self.cfg;
        let limited = cfg.handshake_burst > 0;
        let mut st = self.state.lock().unwrap();
        let handshaking = st.handshaking;
        if !st.sources.contains_key(&ip) && st.sources.len() >= cfg.max_sources {
            st.sources.retain(|_, s| {
                s.refill(cfg, now);
                !s.idle(cfg)
            });
            if st.sources.len() >= cfg.max_sources {
                return Admit::Refuse(format!(
                    "{} source addresses are active, the most this agent tracks",
                    cfg.max_sources
                ));
            }
        }
        let source = st.sources.entry(ip).or_insert(Source {
            connections: 0,
            tokens: f64::from(cfg.handshake_burst),
            refilled: now,
        });
        if source.connections >= cfg.max_connections_per_source {
            return Admit::Refuse(format!(
                "{ip} already holds {} connections, the most one address may",
                source.connections
            ));
        }
        source.refill(cfg, now);
        let empty = limited && source.tokens < 1.0;
        if !validated && may_retry {
            let retry = match cfg.retry {
                RetryPolicy::Always => true,
                RetryPolicy::UnderLoad => empty || handshaking >= RETRY_ABOVE_HANDSHAKES,
                RetryPolicy::Never => false,
            };
            if retry {
                // Nothing is counted for an address not yet validated.
                if source.idle(cfg) {
                    st.sources.remove(&ip);
                }
                return Admit::Retry;
            }
        }
        if empty {
            return Admit::Refuse(format!(
                "{ip} failed more than {} handshakes in a burst (it may start {} a second)",
                cfg.handshake_burst, cfg.handshakes_per_second
            ));
        }
        if limited {
            source.tokens -= 1.0;
        }
        source.connections += 1;
        st.handshaking += 1;
        Admit::Accept(Admitted {
            guard: self.clone(),
            ip,
            handshaking: true,
            refund: limited,
        })
    }

    /// Connections `ip` holds now.
    #[cfg(test)]
    fn connections(&self, ip: IpAddr) -> usize {
        let st = self.state.lock().unwrap();
        st.sources.get(&ip).map_or(0, |s| s.connections)
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.state.lock().unwrap().sources.len()
    }
}

/// A connection counted against its source, from admission until drop.
#[derive(Debug)]
pub struct Admitted {
    guard: Arc<Guard>,
    ip: IpAddr,
    handshaking: bool,
    refund: bool,
}

impl Admitted {
    /// The handshake ended: `authenticated` gives its token back.
    pub fn handshake_done(&mut self, authenticated: bool) {
        if !self.handshaking {
            return;
        }
        self.handshaking = false;
        let mut st = self.guard.state.lock().unwrap();
        st.handshaking -= 1;
        if authenticated && self.refund {
            let burst = f64::from(self.guard.cfg.handshake_burst);
            if let Some(s) = st.sources.get_mut(&self.ip) {
                s.tokens = (s.tokens + 1.0).min(burst);
            }
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.handshake_done(false);
        let mut st = self.guard.state.lock().unwrap();
        if let Some(s) = st.sources.get_mut(&self.ip) {
            s.connections -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    fn cfg() -> GuardConfig {
        GuardConfig {
            retry: RetryPolicy::Never,
            max_connections_per_source: 3,
            handshake_burst: 4,
            handshakes_per_second: 2,
            max_sources: 8,
        }
    }

    fn accepted(a: Admit) -> Admitted {
        match a {
            Admit::Accept(a) => a,
            other => panic!("not accepted: {other:?}"),
        }
    }

    #[test]
    fn connections_over_the_cap_are_refused_and_freed_on_drop() {
        let g = Guard::new(cfg());
        let t = Instant::now();
        let mut held: Vec<_> = (0..3)
            .map(|_| {
                let mut a = accepted(g.admit_at(ip(1), true, false, t));
                a.handshake_done(true);
                a
            })
            .collect();
        match g.admit_at(ip(1), true, false, t) {
            Admit::Refuse(why) => assert!(why.contains("already holds 3 connections"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Another source is not affected.
        let _other = accepted(g.admit_at(ip(2), true, false, t));
        held.pop();
        assert_eq!(g.connections(ip(1)), 2);
        let _again = accepted(g.admit_at(ip(1), true, false, t));
    }

    #[test]
    fn failed_handshakes_drain_the_bucket_authenticated_ones_do_not() {
        let g = Guard::new(GuardConfig {
            max_connections_per_source: 100,
            ..cfg()
        });
        let t = Instant::now();
        // Authenticated handshakes: as many as you like.
        for _ in 0..20 {
            accepted(g.admit_at(ip(1), true, false, t)).handshake_done(true);
        }
        // Failed ones: the burst, then refused.
        for _ in 0..4 {
            accepted(g.admit_at(ip(1), true, false, t)).handshake_done(false);
        }
        match g.admit_at(ip(1), true, false, t) {
            Admit::Refuse(why) => assert!(why.contains("failed more than 4 handshakes"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Abandoned (dropped mid-handshake) counts as failed, elsewhere too.
        for _ in 0..4 {
            drop(accepted(g.admit_at(ip(2), true, false, t)));
        }
        assert!(matches!(
            g.admit_at(ip(2), true, false, t),
            Admit::Refuse(_)
        ));
        // Refills at 2 a second: one token after half a second.
        let later = t + Duration::from_millis(500);
        accepted(g.admit_at(ip(1), true, false, later)).handshake_done(false);
        assert!(matches!(
            g.admit_at(ip(1), true, false, later),
            Admit::Refuse(_)
        ));
    }

    #[test]
    fn retry_policies() {
        let t = Instant::now();
        let always = Guard::new(GuardConfig {
            retry: RetryPolicy::Always,
            ..cfg()
        });
        assert!(matches!(
            always.admit_at(ip(1), false, true, t),
            Admit::Retry
        ));
        // An unvalidated address is not tracked.
        assert_eq!(always.tracked(), 0);
        // Validated (or already retried): on to the handshake.
        let _a = accepted(always.admit_at(ip(1), true, false, t));
        let _b = accepted(always.admit_at(ip(1), false, false, t));

        let load = Guard::new(GuardConfig {
            retry: RetryPolicy::UnderLoad,
            max_connections_per_source: 100,
            handshake_burst: 100,
            ..cfg()
        });
        let mut busy: Vec<_> = (0..RETRY_ABOVE_HANDSHAKES)
            .map(|_| accepted(load.admit_at(ip(1), false, true, t)))
            .collect();
        assert!(matches!(load.admit_at(ip(2), false, true, t), Admit::Retry));
        let mut validated = accepted(load.admit_at(ip(2), true, false, t));
        validated.handshake_done(true);
        busy.pop().unwrap().handshake_done(true);
        let _calm = accepted(load.admit_at(ip(2), false, true, t));

        // Under load, a source whose bucket is empty is asked to validate
        // rather than refused, so a spoofer cannot lock out the address it
        // spoofs.
        let spoof = Guard::new(GuardConfig {
            retry: RetryPolicy::UnderLoad,
            ..cfg()
        });
        for _ in 0..4 {
            accepted(spoof.admit_at(ip(3), false, true, t)).handshake_done(false);
        }
        assert!(matches!(
            spoof.admit_at(ip(3), false, true, t),
            Admit::Retry
        ));
    }

    #[test]
    fn sources_are_v4_addresses_or_v6_slash_64s() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(source_key(v4), v4);
        assert_eq!(source_key("::ffff:10.1.2.3".parse().unwrap()), v4);
        let a = source_key("2001:db8:1:2:aaaa::1".parse().unwrap());
        assert_eq!(a, "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        assert_eq!(a, source_key("2001:db8:1:2:ffff::9".parse().unwrap()));
        assert_ne!(a, source_key("2001:db8:1:3::1".parse().unwrap()));
    }

    #[test]
    fn the_map_of_sources_is_bounded_and_forgets_idle_ones() {
        let g = Guard::new(cfg());
        let t = Instant::now();
        let held: Vec<_> = (0..8)
            .map(|n| accepted(g.admit_at(ip(n), true, false, t)))
            .collect();
        assert_eq!(g.tracked(), 8);
        match g.admit_at(ip(100), true, false, t) {
            Admit::Refuse(why) => assert!(why.contains("8 source addresses"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Connections closed, buckets not yet full again: still tracked.
        drop(held);
        assert!(matches!(
            g.admit_at(ip(100), true, false, t),
            Admit::Refuse(_)
        ));
        // Once their buckets have refilled they are forgotten.
        let later = t + Duration::from_secs(10);
        let _a = accepted(g.admit_at(ip(100), true, false, later));
        assert_eq!(g.tracked(), 1);
    }
}
