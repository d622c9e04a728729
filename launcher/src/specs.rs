//! From a plan to what each node's agent runs: one [`RankSpec`] per rank.
//!
//! A rank's processes are the plan's `pre` commands (`ray start --block`)
//! then its `argv`, every one long-running. With Ray, a worker's
//! `ray start` and the head's `vllm serve` wait until the Ray head accepts
//! connections, so all ranks can be started at once; `ray stop --force`
//! runs after the processes are stopped. With `[launch] image` every
//! process runs in the image: the argv stays the engine's command line,
//! the agent wraps it in its `docker run`, and there is no stop hook
//! (removing the containers stops everything in them). Pure.

use std::net::SocketAddr;
use std::time::Duration;

use xfer_proto::image::Digest;
use xfer_proto::launch::{ContainerSpec, GroupPeer, ProcSpec, RankSpec, WeightGate};

use crate::config::{Engine, Setup};
use crate::plan::Plan;

/// A run id: the plan digest's first 8 hex digits and the start time, so
/// runs sort by time and name what they ran.
pub fn run_id(plan: &Plan, unix: u64) -> String {
    format!("{}-{unix}", &plan.digest[..8])
}

/// Where another node's agent may be reached from a node: its address in
/// the cluster file, and its fabric address on the same port (the nodes
/// may not share the network the launcher reaches the agents on).
fn peer_addrs(n: &crate::config::RankNode) -> Vec<String> {
    let mut addrs = vec![n.agent.clone()];
    if let Some((_, port)) = n.agent.rsplit_once(':') {
        let fabric = SocketAddr::new(n.fabric_ip, port.parse().unwrap_or(7470)).to_string();
        if fabric != n.agent {
            addrs.push(fabric);
        }
    }
    addrs
}

/// The specs of every rank, in rank order. `weights` and `image_id` are
/// what the gates passed, for each agent to check again before it starts
/// its rank.
pub fn rank_specs(
    setup: &Setup,
    plan: &Plan,
    run: &str,
    weights: Option<WeightGate>,
    image_id: Option<Digest>,
    init_timeout: Duration,
    grace: Duration,
) -> Vec<RankSpec> {
    let container = setup.container.as_ref().map(|c| ContainerSpec {
        image: c.image.clone(),
        image_id,
        gpus: c.gpus.clone(),
        shm_bytes: c.shm_bytes,
    });
    let ray_head = SocketAddr::new(setup.nodes[0].fabric_ip, setup.ports.ray);
    plan.ranks
        .iter()
        .map(|r| {
            let ray = setup.engine == Engine::VllmRay;
            let mut procs: Vec<ProcSpec> = r
                .pre
                .iter()
                .map(|argv| ProcSpec {
                    argv: argv.clone(),
                    // A worker's `ray start` joins the head's.
                    wait_tcp: (ray && r.rank > 0).then_some(ray_head),
                })
                .collect();
            if !r.argv.is_empty() {
                procs.push(ProcSpec {
                    argv: r.argv.clone(),
                    wait_tcp: ray.then_some(ray_head),
                });
            }
            RankSpec {
                run: run.to_string(),
                node: r
                    .node
                    .parse()
                    .expect("a [[node]] name, checked when the cluster file was read"),
                rank: r.rank as u32,
                env: r.env.clone(),
                procs,
                // In a container, the agent's removal of the containers
                // stops Ray with everything else.
                on_stop: if ray && container.is_none() {
                    vec![vec!["ray".into(), "stop".into(), "--force".into()]]
                } else {
                    Vec::new()
                },
                group: setup
                    .nodes
                    .iter()
                    .filter(|n| n.name != r.node)
                    .map(|n| GroupPeer {
                        node: n
                            .name
                            .parse()
                            .expect("a [[node]] name, checked when the cluster file was read"),
                        addrs: peer_addrs(n),
                    })
                    .collect(),
                wait_timeout_ms: init_timeout.as_millis() as u64,
                grace_ms: grace.as_millis() as u64,
                weights: weights.clone(),
                // Set by `up` per node (unified memory, or asked for).
                evict_page_cache: false,
                container: container.clone(),
                // Set by `up` per node, once the caches are delivered.
                caches: None,
                // Set by `up` when it starts the ranks before its
                // preflight ended (`stream_weights`).
                held: false,
                rendezvous: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{setup, COMMIT};

    #[test]
    fn ray_workers_and_the_server_wait_for_the_ray_head() {
        let s = setup(&format!(
            "engine = \"vllm-ray\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\npp = 2"
        ));
        let p = crate::plan::plan(&s);
        let specs = rank_specs(
            &s,
            &p,
            "r",
            None,
            None,
            Duration::from_secs(60),
            Duration::from_secs(5),
        );
        let head: SocketAddr = "192.168.100.1:6379".parse().unwrap();
        assert_eq!(specs[0].procs.len(), 2);
        assert_eq!(specs[0].procs[0].wait_tcp, None);
        assert_eq!(specs[0].procs[0].argv[..3], ["ray", "start", "--block"]);
        assert_eq!(specs[0].procs[1].argv[..2], ["vllm", "serve"]);
        assert_eq!(specs[0].procs[1].wait_tcp, Some(head));
        assert_eq!(specs[1].procs.len(), 1);
        assert_eq!(specs[1].procs[0].wait_tcp, Some(head));
        assert_eq!(specs[1].on_stop, [["ray", "stop", "--force"]]);
        assert_eq!(specs[0].group[0].node, "spark-b");
        assert_eq!(
            specs[0].group[0].addrs,
            ["10.0.0.2:7470", "192.168.100.2:7470"]
        );
        assert_eq!(
            specs[1].group[0].addrs,
            ["10.0.0.1:7470", "192.168.100.1:7470"]
        );
        assert_eq!(specs[1].env, p.ranks[1].env);
    }

    #[test]
    fn in_an_image_the_argv_is_the_engines_and_nothing_runs_on_stop() {
        let s = setup(&format!(
            "engine = \"vllm-ray\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\npp = 2\nimage = \"xt/app:1\"\ngpus = [\"nvidia.com/gpu=all\"]\nshm_size = \"16GiB\""
        ));
        let p = crate::plan::plan(&s);
        let id = Digest([7; 32]);
        let specs = rank_specs(
            &s,
            &p,
            "r",
            None,
            Some(id),
            Duration::from_secs(60),
            Duration::from_secs(5),
        );
        let want = ContainerSpec {
            image: "xt/app:1".into(),
            image_id: Some(id),
            gpus: xfer_proto::launch::GpuAccess::Devices(vec!["nvidia.com/gpu=all".into()]),
            shm_bytes: Some(16 << 30),
        };
        for (spec, r) in specs.iter().zip(&p.ranks) {
            assert_eq!(spec.container.as_ref(), Some(&want));
            // Removing the containers stops Ray: no `ray stop` on the host.
            assert!(spec.on_stop.is_empty(), "{:?}", spec.on_stop);
            // The engine's own command line: the agent wraps it.
            let argvs: Vec<&Vec<String>> = spec.procs.iter().map(|p| &p.argv).collect();
            let planned: Vec<&Vec<String>> = r
                .pre
                .iter()
                .chain(Some(&r.argv).filter(|a| !a.is_empty()))
                .collect();
            assert_eq!(argvs, planned);
            assert_eq!(spec.procs[0].argv[0], "ray");
        }
        // The same launch on the host has no container and stops Ray.
        let host = setup(&format!(
            "engine = \"vllm-ray\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\npp = 2"
        ));
        let specs = rank_specs(
            &host,
            &crate::plan::plan(&host),
            "r",
            None,
            None,
            Duration::from_secs(60),
            Duration::from_secs(5),
        );
        assert!(specs.iter().all(|s| s.container.is_none()));
        assert_eq!(specs[0].on_stop, [["ray", "stop", "--force"]]);
    }

    #[test]
    fn multiprocess_ranks_start_at_once() {
        let s = setup(&format!(
            "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""
        ));
        let p = crate::plan::plan(&s);
        let specs = rank_specs(
            &s,
            &p,
            "r",
            None,
            None,
            Duration::from_secs(60),
            Duration::from_secs(5),
        );
        for (spec, r) in specs.iter().zip(&p.ranks) {
            assert_eq!(spec.procs.len(), 1);
            assert_eq!(spec.procs[0].argv, r.argv);
            assert_eq!(spec.procs[0].wait_tcp, None);
            assert!(spec.on_stop.is_empty());
        }
        assert!(run_id(&p, 1_764_558_000).starts_with(&p.digest[..8]));
    }
}
