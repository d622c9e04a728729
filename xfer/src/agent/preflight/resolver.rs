//! The resolver probe: how long this node's resolver takes for the
//! lookups the engine's collective libraries make, each waited for a
//! bounded time.
//!
//! torch.distributed's c10d formats the address of every socket it opens
//! with `getnameinfo` (a reverse lookup: the store client of the master's
//! address, the store server of every rank that connects), and Gloo
//! without a matching `GLOO_SOCKET_IFNAME` looks up the host name. On a
//! node whose resolver is unreachable from the fabric each of those
//! lookups waits out the resolver's timeout (vLLM logs `The hostname of
//! the client socket cannot be retrieved. err=-3`): torch before 2.9 on
//! every connection, 2.9 and later once per process (c10d stops asking
//! after the first failure, pytorch#159596). The fix is the fabric
//! addresses in `/etc/hosts`, which glibc reads before DNS.
//!
//! The lookups are the ones glibc makes for those libraries (`getnameinfo`
//! and `getaddrinfo`, through this node's nsswitch, `/etc/hosts` and
//! resolver), each on a thread of its own, all at once; the probe waits
//! [`CAP`] for all of them together and reports a lookup still running
//! then as [`LookupAnswer::Pending`], so that a dead resolver costs the
//! preflight 1.5 s, not its timeout times the number of lookups. A thread
//! left waiting holds nothing and ends with the resolver's own timeout.

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Lookup, LookupAnswer, Probe, ResolverFacts};

/// How long the probe waits for its lookups, all together.
pub const CAP: Duration = Duration::from_millis(1_500);

/// One lookup to make: the host name (forward) or an address (reverse).
#[derive(Clone, Copy, Debug)]
enum Job<'a> {
    Forward(&'a str),
    Reverse(IpAddr),
}

/// Looks up `host` (forward) and every address of `addrs` (reverse), at
/// once, waiting `cap` at most.
pub fn probe(host: &str, addrs: &[IpAddr], cap: Duration) -> Probe<ResolverFacts> {
    run(host, addrs, cap, |job| match job {
        Job::Forward(h) => forward(h),
        Job::Reverse(ip) => reverse(ip),
    })
}

/// [`probe`] with the lookup passed in (the tests' slow resolver).
fn run(
    host: &str,
    addrs: &[IpAddr],
    cap: Duration,
    lookup: fn(Job) -> LookupAnswer,
) -> Probe<ResolverFacts> {
    let start = Instant::now();
    let (tx, rx) = mpsc::channel::<(usize, u64, LookupAnswer)>();
    let mut queries = vec![host.to_string()];
    queries.extend(addrs.iter().map(|a| a.to_string()));
    let jobs = std::iter::once(None).chain(addrs.iter().copied().map(Some));
    for (i, ip) in jobs.enumerate() {
        let tx = tx.clone();
        let host = host.to_string();
        let spawned = std::thread::Builder::new()
            .name("resolver-probe".into())
            .spawn(move || {
                let t = Instant::now();
                let answer = lookup(match ip {
                    None => Job::Forward(&host),
                    Some(ip) => Job::Reverse(ip),
                });
                // The probe may have stopped waiting: nothing to tell.
                let _ = tx.send((i, t.elapsed().as_millis() as u64, answer));
            });
        if let Err(e) = spawned {
            return Probe::Failed(format!("cannot start a lookup thread: {e}"));
        }
    }
    drop(tx);
    let cap_ms = cap.as_millis() as u64;
    let mut done: Vec<Option<(u64, LookupAnswer)>> = vec![None; queries.len()];
    while done.iter().any(Option::is_none) {
        let left = cap.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok((i, ms, answer)) => done[i] = Some((ms, answer)),
            Err(_) => break,
        }
    }
    let mut lookups = queries.into_iter().zip(done).map(|(query, d)| {
        let (ms, answer) = d.unwrap_or((cap_ms, LookupAnswer::Pending));
        Lookup { query, ms, answer }
    });
    let forward = lookups.next().expect("the host name is always looked up");
    Probe::Ok(ResolverFacts {
        cap_ms,
        forward,
        reverse: lookups.collect(),
    })
}

/// `getaddrinfo(host)`, as Gloo's default device does: its first address.
fn forward(host: &str) -> LookupAnswer {
    match (host, 0).to_socket_addrs() {
        Ok(mut it) => match it.next() {
            Some(a) => LookupAnswer::Found(a.ip().to_string()),
            None => LookupAnswer::Error("no address".into()),
        },
        Err(e) => LookupAnswer::Error(e.to_string()),
    }
}

/// `getnameinfo(ip)` without `NI_NUMERICHOST`, as c10d's `formatSockAddr`
/// calls it: the name, or the address itself when it has none.
fn reverse(ip: IpAddr) -> LookupAnswer {
    let mut host = [0 as libc::c_char; libc::NI_MAXHOST as usize];
    let err = match ip {
        IpAddr::V4(v4) => {
            // SAFETY: an all-zero sockaddr_in is a valid value.
            let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_addr.s_addr = u32::from_ne_bytes(v4.octets());
            // SAFETY: `sa` is a sockaddr_in of the length passed; `host`
            // is writable for its length; no service buffer is passed.
            unsafe {
                libc::getnameinfo(
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    host.as_mut_ptr(),
                    host.len() as libc::socklen_t,
                    std::ptr::null_mut(),
                    0,
                    0,
                )
            }
        }
        IpAddr::V6(v6) => {
            // SAFETY: an all-zero sockaddr_in6 is a valid value.
            let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_addr.s6_addr = v6.octets();
            // SAFETY: as above, for a sockaddr_in6.
            unsafe {
                libc::getnameinfo(
                    (&sa as *const libc::sockaddr_in6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                    host.as_mut_ptr(),
                    host.len() as libc::socklen_t,
                    std::ptr::null_mut(),
                    0,
                    0,
                )
            }
        }
    };
    if err != 0 {
        // SAFETY: gai_strerror returns a static NUL-terminated string.
        let why = unsafe { std::ffi::CStr::from_ptr(libc::gai_strerror(err)) };
        return LookupAnswer::Error(format!("{} (EAI {err})", why.to_string_lossy()));
    }
    // SAFETY: getnameinfo NUL-terminated `host` on success.
    let name = unsafe { std::ffi::CStr::from_ptr(host.as_ptr()) };
    LookupAnswer::Found(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_resolves_at_once_from_the_hosts_file() {
        let f = match probe("localhost", &["127.0.0.1".parse().unwrap()], CAP) {
            Probe::Ok(f) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!(f.cap_ms, 1_500);
        assert_eq!(f.forward.query, "localhost");
        assert!(
            matches!(f.forward.answer, LookupAnswer::Found(ref a) if a == "127.0.0.1" || a == "::1"),
            "{f:?}"
        );
        assert_eq!(f.reverse.len(), 1);
        assert_eq!(f.reverse[0].query, "127.0.0.1");
        assert!(
            matches!(f.reverse[0].answer, LookupAnswer::Found(ref n) if !n.is_empty()),
            "{f:?}"
        );
    }

    /// Released by the test when it is done: the stuck lookup's end.
    static RELEASE: std::sync::Mutex<Option<mpsc::Receiver<()>>> = std::sync::Mutex::new(None);

    #[test]
    fn a_lookup_past_the_cap_is_pending_and_not_waited_for() {
        let (release, held) = mpsc::channel::<()>();
        *RELEASE.lock().unwrap() = Some(held);
        // 10.0.0.2 never answers while the test runs, like a dead resolver.
        let slow = |job: Job| match job {
            Job::Reverse(ip) if ip.to_string() == "10.0.0.2" => {
                if let Some(rx) = RELEASE.lock().unwrap().take() {
                    let _ = rx.recv();
                }
                LookupAnswer::Error("released".into())
            }
            Job::Reverse(ip) => LookupAnswer::Found(format!("{ip}-name")),
            Job::Forward(h) => LookupAnswer::Found(format!("{h}-addr")),
        };
        let cap = Duration::from_millis(300);
        let t = Instant::now();
        let addrs = ["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let f = match run("n1", &addrs, cap, slow) {
            Probe::Ok(f) => f,
            other => panic!("{other:?}"),
        };
        // It returned at the cap, not when the stuck lookup ended.
        assert!(
            t.elapsed() >= cap && t.elapsed() < cap * 5,
            "{:?}",
            t.elapsed()
        );
        assert_eq!(f.forward.answer, LookupAnswer::Found("n1-addr".into()));
        assert_eq!(
            f.reverse[0].answer,
            LookupAnswer::Found("10.0.0.1-name".into())
        );
        assert_eq!(f.reverse[1].query, "10.0.0.2");
        assert_eq!(f.reverse[1].answer, LookupAnswer::Pending);
        assert_eq!(f.reverse[1].ms, 300);
        drop(release);
    }
}
