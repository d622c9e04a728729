//! Preflight: the facts one node reports about itself before a launch.
//!
//! The launcher sends a [`PreflightRequest`] to every node's agent at once;
//! each agent answers with [`NodeFacts`]: what it found, never a verdict.
//! Judging the facts (is this enough memory, do the nodes agree) is the
//! launcher's job, where all nodes' answers meet. Every probe that could
//! not run says why ([`Probe::Skipped`]) instead of passing silently.
//!
//! The probes themselves are small Linux readers, one module each:
//! [`weights`] (the model at its path, from the agent's store), [`host`]
//! (disk, memory, GPUs), [`net`] (interfaces, default route, ports),
//! [`reach`] (TCP between the nodes over the fabric), [`versions`]
//! (running the engine to ask its version), [`resolver`] (how long the
//! host name and the fabric addresses take to look up) and [`rdma`]
//! (sysfs).
//!
//! These types travel in postcard frames, which cannot carry serde's
//! tagged or flattened forms, so they use none.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use xfer_proto::launch::*;

use crate::sysinfo::{host, net, pagecache, rdma};

pub mod reach;
pub mod rendezvous;
pub mod resolver;
pub mod versions;
pub mod weights;

/// Whether a command line may run here: as it is to run (its program by
/// absolute path), or why not ([`crate::agent::permit::Permits::may_run`]).
pub type MayRun =
    dyn Fn(&[String]) -> Result<Vec<String>, crate::agent::permit::PermitError> + Sync;

/// One port check and listen window at a time on this agent.
static ONE_LISTENER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs every probe of `req` on this node. `states` maps the store's
/// models to what `xfer status` says of them ("complete", "syncing", ...).
///
/// The ports are checked before the reachability listener binds (it
/// listens on one of them); the version commands and the reachability
/// window run at the same time, and the blocking probes (the weights'
/// stat, nvidia-smi, sysfs) on blocking threads meanwhile.
pub async fn gather(
    req: PreflightRequest,
    store: crate::store::Store,
    states: HashMap<String, xfer_proto::admin::ModelState>,
    may_run: &MayRun,
) -> NodeFacts {
    let blocking = |what: &'static str| {
        move |e: tokio::task::JoinError| format!("the {what} probe failed: {e}; report this bug")
    };
    let root = store.root().to_path_buf();
    let (model_path, revision) = (req.model_path.clone(), req.revision.clone());
    let weights = tokio::task::spawn_blocking(move || {
        weights::weights(&store, &states, &model_path, revision.as_deref())
    });
    let gpus = tokio::task::spawn_blocking(host::gpus);
    let rdma_need = req.rdma.clone();
    let host = tokio::task::spawn_blocking(move || {
        let ifaces = net::interfaces();
        (
            host::disk(&root),
            host::memory(),
            net::default_route(),
            rdma::rdma(Path::new("/sys"), rdma_need.as_ref()),
            ifaces,
        )
    });

    // Bounded by its own cap (a resolver that does not answer costs 1.5 s).
    let resolve = req.resolve.clone();
    let resolver = tokio::task::spawn_blocking(move || {
        if resolve.is_empty() {
            return Probe::Skipped("no fabric address to look up".into());
        }
        resolver::probe(&hostname(), &resolve, resolver::CAP)
    });

    // Before the listener takes one of them; and no other check's listener
    // between the two (a check whose caller went away still runs out its
    // listen window, and a check beside it would read its port as taken).
    let one_listener = ONE_LISTENER.lock().await;
    let needs = req.ports.clone();
    let ports = tokio::task::spawn_blocking(move || {
        needs
            .iter()
            .map(|p| net::port_free(&p.what, p.port))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_else(|e| {
        let why = blocking("port")(e);
        req.ports
            .iter()
            .map(|p| PortFacts {
                what: p.what.clone(),
                port: p.port,
                free: Probe::Failed(why.clone()),
            })
            .collect()
    });

    let version_tasks: Vec<_> = req
        .versions
        .iter()
        .cloned()
        .map(|mut v| {
            // Each program as `may_run` resolved it; an engine's Python
            // only when its program may run too.
            let allowed = may_run(&v.argv);
            v.python_of = v
                .python_of
                .take()
                .and_then(|p| may_run(&[p]).ok())
                .map(|mut p| p.remove(0));
            tokio::spawn(async move {
                match allowed {
                    Ok(argv) => {
                        v.argv = argv;
                        versions::run(&v, versions::DEFAULT_TIMEOUT).await
                    }
                    // Not run: refused by this agent's permits (a skip,
                    // whose fix is the agent's flags, not the engine).
                    Err(why) => VersionFacts {
                        what: v.what,
                        version: Probe::Skipped(why.to_string()),
                    },
                }
            })
        })
        .collect();
    let listen = req.listen_port.map(|p| SocketAddr::new(req.fabric_ip, p));
    let (listen, reach) =
        reach::probe(listen, &req.peers, Duration::from_millis(req.window_ms)).await;
    drop(one_listener);
    let mut version_facts = Vec::with_capacity(version_tasks.len());
    for (v, t) in req.versions.iter().zip(version_tasks) {
        version_facts.push(t.await.unwrap_or_else(|e| VersionFacts {
            what: v.what.clone(),
            version: Probe::Failed(blocking("version")(e)),
        }));
    }

    let weights = weights.await.unwrap_or_else(|e| WeightFacts {
        path: req.model_path.clone(),
        problems: vec![blocking("weights")(e)],
        ..WeightFacts::default()
    });
    let gpus = gpus
        .await
        .unwrap_or_else(|e| Probe::Failed(blocking("GPU")(e)));
    let unified_memory = host::unified_memory(&gpus);
    let model_dir = std::path::PathBuf::from(&weights.path);
    let page_cache = tokio::task::spawn_blocking(move || pagecache::model_resident(&model_dir))
        .await
        .unwrap_or_else(|e| Probe::Failed(blocking("page cache")(e)));
    let (disk, memory, default_route, rdma, interfaces) = match host.await {
        Ok(h) => h,
        Err(e) => {
            let why = blocking("host")(e);
            (
                Probe::Failed(why.clone()),
                Probe::Failed(why.clone()),
                Probe::Failed(why.clone()),
                Probe::Failed(why),
                Vec::new(),
            )
        }
    };
    let resolver = resolver
        .await
        .unwrap_or_else(|e| Probe::Failed(blocking("resolver")(e)));
    NodeFacts {
        hostname: hostname(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        weights,
        disk,
        memory,
        gpus,
        fabric: net::fabric(&req.fabric_if, &interfaces),
        interfaces,
        default_route,
        ports,
        listen,
        reach,
        versions: version_facts,
        rdma,
        page_cache,
        unified_memory,
        rendezvous: Probe::Skipped("not asked".into()),
        resolver,
        // Filled in by the launch service, which knows the engine.
        containers: Probe::Skipped("not asked".into()),
        // Filled in by the launch service, which knows the socket.
        loader_link: Probe::Skipped("not asked".into()),
    }
}

/// This machine's hostname.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname NUL-terminates
    // within it on success (we also stop at the end).
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if end > 0 {
            return String::from_utf8_lossy(&buf[..end]).into_owned();
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::names::NodeName;

    #[tokio::test]
    async fn gather_checks_the_ports_before_listening_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let req = PreflightRequest {
            node: NodeName::new("n1").unwrap(),
            fabric_if: "lo".into(),
            fabric_ip: "127.0.0.1".parse().unwrap(),
            model_path: dir.path().join("m").display().to_string(),
            revision: None,
            ports: vec![PortNeed {
                what: "master".into(),
                port,
            }],
            listen_port: Some(port),
            peers: vec![ReachTarget {
                node: NodeName::new("n1").unwrap(),
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            }],
            window_ms: 300,
            versions: vec![VersionProbe {
                what: "engine".into(),
                argv: vec!["sh".into(), "-c".into(), "echo 1.2.3".into()],
                python_of: None,
            }],
            rdma: None,
            image: None,
            resolve: vec!["127.0.0.1".parse().unwrap()],
            loader_link: false,
        };
        let f = gather(req.clone(), store.clone(), HashMap::new(), &|a| {
            Ok(a.to_vec())
        })
        .await;
        assert_eq!(f.ports[0].free, Probe::Ok(()), "{:?}", f.ports);
        assert_eq!(
            f.listen,
            Probe::Ok(SocketAddr::from(([127, 0, 0, 1], port)))
        );
        assert!(matches!(f.reach[0].result, Probe::Ok(_)), "{:?}", f.reach);
        assert_eq!(f.versions[0].version, Probe::Ok("1.2.3".into()));
        assert!(matches!(f.fabric, Probe::Ok(ref i) if i.name == "lo"));
        assert!(matches!(f.disk, Probe::Ok(_)));
        assert!(matches!(f.rdma, Probe::Skipped(_)));
        match &f.resolver {
            Probe::Ok(r) => assert_eq!(r.reverse[0].query, "127.0.0.1"),
            other => panic!("{other:?}"),
        }
        assert_eq!(f.weights.model.as_deref(), Some("m"));
        assert!(
            f.weights.problems[0].contains("is not held"),
            "{:?}",
            f.weights
        );
        assert!(!f.hostname.is_empty());
        assert_eq!(f.agent_version, env!("CARGO_PKG_VERSION"));
        // The reply survives the wire.
        let back: NodeFacts = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }
}
