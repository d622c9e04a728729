//! The preflight's verdicts on made-up facts: a healthy cluster, then one
//! thing wrong at a time.

use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::config::tests::{setup, COMMIT};
use xfer_proto::image::Digest;
use xfer_proto::launch::*;

fn s() -> Setup {
    setup(&format!(
        "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""
    ))
}

/// What the build probe prints on a healthy GB10 node.
const BUILD: &str = r#"{"python": "/venv/bin/python3", "torch": "2.13.0+cu130", "cuda": "13.0", "nccl": "2.29.7", "nccl_lib": "2.29.7", "arch": "sm_121"}"#;

fn iface(name: &str, ip: IpAddr, mtu: u32) -> IfaceFacts {
    IfaceFacts {
        name: name.into(),
        operstate: "up".into(),
        carrier: Some(true),
        mtu,
        addrs: vec![(ip, 24)],
    }
}

/// A healthy node as the agent would describe it.
fn good(setup: &Setup, i: usize) -> NodeFacts {
    let n = &setup.nodes[i];
    let req = &requests(setup)[i];
    let fabric = iface(&n.fabric_if, n.fabric_ip, 9000);
    let mgmt_ip: IpAddr = format!("10.0.0.{}", i + 1).parse().unwrap();
    NodeFacts {
        hostname: n.name.clone(),
        agent_version: "0.1.0".into(),
        weights: WeightFacts {
            path: setup.model.path.clone(),
            commit: None,
            store_root: "/var/lib/xfer/hub".into(),
            model: Some("models--Qwen--Qwen3-8B".into()),
            state: Some(xfer_proto::admin::ModelState::Complete),
            root: Some(xfer_proto::hash::Hash([0xab; 32])),
            bytes_total: 16 << 30,
            bytes_present: 16 << 30,
            problems: vec![],
        },
        disk: Probe::Ok(DiskFacts {
            path: "/var/lib/xfer/hub".into(),
            free_bytes: 500 << 30,
            total_bytes: 1 << 40,
        }),
        memory: Probe::Ok(MemFacts {
            mem_total: 128 << 30,
            mem_available: 100 << 30,
        }),
        gpus: Probe::Ok(GpuFacts {
            gpus: vec![GpuInfo {
                index: 0,
                name: "NVIDIA GB10".into(),
                memory_total_mib: None,
                memory_used_mib: None,
            }],
            processes: vec![],
            driver: Some("580.95.05".into()),
        }),
        fabric: Probe::Ok(fabric.clone()),
        interfaces: vec![iface("enP7s7", mgmt_ip, 1500), fabric],
        default_route: Probe::Ok(RouteFacts {
            iface: "enP7s7".into(),
            gateway: None,
            src: Some(mgmt_ip),
        }),
        ports: req
            .ports
            .iter()
            .map(|p| PortFacts {
                what: p.what.clone(),
                port: p.port,
                free: Probe::Ok(()),
            })
            .collect(),
        listen: Probe::Ok(SocketAddr::new(n.fabric_ip, 29500)),
        reach: req
            .peers
            .iter()
            .map(|p| ReachFacts {
                node: p.node.clone(),
                addr: p.addr,
                result: Probe::Ok(250),
            })
            .collect(),
        versions: vec![
            VersionFacts {
                what: "vllm".into(),
                version: Probe::Ok("0.11.0".into()),
            },
            VersionFacts {
                what: "torch".into(),
                version: Probe::Ok("2.13.0+cu130".into()),
            },
        ]
        .into_iter()
        .chain(crate::unit::build_probe(setup).map(|p| VersionFacts {
            what: p.what,
            version: Probe::Ok(BUILD.into()),
        }))
        .collect(),
        page_cache: Probe::Ok(PageCacheFacts {
            resident_bytes: 4 << 30,
            total_bytes: 16 << 30,
            files: 4,
        }),
        unified_memory: Some(true),
        rendezvous: Probe::Ok(120),
        resolver: Probe::Ok(ResolverFacts {
            cap_ms: 1_500,
            forward: Lookup {
                query: n.name.clone(),
                ms: 1,
                answer: LookupAnswer::Found(mgmt_ip.to_string()),
            },
            reverse: req
                .resolve
                .iter()
                .map(|ip| Lookup {
                    query: ip.to_string(),
                    ms: 2,
                    answer: LookupAnswer::Found(ip.to_string()),
                })
                .collect(),
        }),
        containers: Probe::Ok(ContainerFacts {
            engine: xfer_proto::image::ContainerRuntime::Docker,
            version: "20.10.24".into(),
            nvidia_runtime: Probe::Ok("nvidia".into()),
            image: setup.container.as_ref().map(|_| Probe::Ok(Digest([7; 32]))),
        }),
        loader_link: if req.loader_link {
            Probe::Ok("/r/.xfer/agent.sock answers (m: syncing)".into())
        } else {
            Probe::Skipped("not asked".into())
        },
        rdma: Probe::Ok(RdmaFacts {
            device: n
                .rdma
                .as_ref()
                .map(|r| r.device.clone())
                .unwrap_or_default(),
            ports: vec![RdmaPort {
                port: 1,
                state: xfer_proto::rdma::PortState::Active,
                link_layer: Some(xfer_proto::rdma::LinkLayer::Ethernet),
                active_mtu: None,
            }],
            gid: None,
        }),
    }
}

fn judged(setup: &Setup, f: impl Fn(usize, &mut NodeFacts)) -> Vec<Row> {
    let answers: Vec<Result<NodeFacts, NodeError>> = (0..setup.nodes.len())
        .map(|i| {
            let mut facts = good(setup, i);
            f(i, &mut facts);
            Ok(facts)
        })
        .collect();
    judge(setup, &answers)
}

fn fails(rows: &[Row]) -> Vec<(&str, &str, &str)> {
    rows.iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| (r.check, r.node.as_str(), r.detail.as_str()))
        .collect()
}

#[test]
fn a_healthy_cluster_passes_and_flags_the_management_route() {
    let s = s();
    let rows = judged(&s, |_, _| {});
    assert!(!failed(&rows), "{}", render(&rows, None));
    let warn: Vec<&Row> = rows.iter().filter(|r| r.verdict == Verdict::Warn).collect();
    assert_eq!(warn.len(), 2, "{}", render(&rows, None));
    assert!(
        warn[0].detail.contains("would pick 10.0.0.1"),
        "{}",
        warn[0].detail
    );
    assert!(
        warn[0].detail.contains("pins 192.168.100.1"),
        "{}",
        warn[0].detail
    );
    // Every check has a row, in the table's order.
    let checks: Vec<&str> = rows.iter().map(|r| r.check).collect();
    let mut sorted = checks.clone();
    sorted.sort_by_key(|c| CHECKS.iter().position(|x| x == c));
    assert_eq!(checks, sorted);
    for c in CHECKS {
        assert!(checks.contains(c), "no {c} row");
    }
    assert!(render(&rows, None).contains("0 failed"));
}

#[test]
fn the_weight_gate_names_the_node_and_what_is_missing() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.weights.state = Some(xfer_proto::admin::ModelState::Syncing);
            f.weights.root = None;
            f.weights.bytes_present = 4 << 30;
            f.weights.problems = vec!["model-00003-of-00004.safetensors: missing".into()];
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].0, f[0].1), ("weights", "spark-b"));
    assert!(
        f[0].2.contains("is syncing (4.0 GiB of 16.0 GiB present)"),
        "{}",
        f[0].2
    );
    assert!(f[0].2.contains("model-00003-of-00004.safetensors: missing"));

    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.weights.root = Some(xfer_proto::hash::Hash([0xcd; 32]));
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].0, f[0].1), ("weights", "*"));
    assert!(f[0].2.contains("spark-b differ"), "{}", f[0].2);
}

#[test]
fn an_unreachable_agent_fails_with_its_line() {
    let s = s();
    let answers = vec![
        Ok(good(&s, 0)),
        Err(NodeError::from(xfer::client::AskError::Unreachable(
            xfer::client::ask::ExchangeError::Timeout(5),
        ))),
    ];
    let rows = judge(&s, &answers);
    let f = fails(&rows);
    assert!(f
        .iter()
        .any(|(c, n, d)| *c == "agent" && *n == "spark-b" && d.contains("no answer")));
    let fix = rows
        .iter()
        .find(|r| r.check == "agent" && r.node == "spark-b")
        .unwrap();
    assert!(fix
        .fix
        .as_ref()
        .unwrap()
        .contains(&format!("cluster.toml:{}", s.nodes[1].line)));
    // spark-a still reaches spark-b, whose agent said nothing: only agent fails.
    assert_eq!(f.len(), 1, "{f:?}");
}

#[test]
fn network_ports_versions_and_gpus_fail_clearly() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 0 {
            f.ports[1].free = Probe::Failed("in use by python3 (pid 4242)".into());
            f.gpus = Probe::Ok(GpuFacts {
                gpus: vec![],
                processes: vec![GpuProcess {
                    pid: 77,
                    name: "python3".into(),
                    used_mib: Some(90000),
                }],
                driver: None,
            });
        } else {
            f.reach[0].result = Probe::Failed("timed out after 3s".into());
            if let Probe::Ok(i) = &mut f.fabric {
                i.mtu = 1500;
            }
            f.versions[0].version = Probe::Ok("0.10.2".into());
        }
    });
    let f = fails(&rows);
    let has = |c: &str, n: &str, needle: &str| {
        f.iter()
            .any(|(fc, fnode, d)| *fc == c && *fnode == n && d.contains(needle))
    };
    assert!(
        has(
            "ports",
            "spark-a",
            "api port 8000 in use by python3 (pid 4242)"
        ),
        "{f:?}"
    );
    assert!(
        has("gpu", "spark-a", "python3 (pid 77, 90000 MiB)"),
        "{f:?}"
    );
    assert!(
        has(
            "reach",
            "spark-b",
            "spark-a at 192.168.100.1:29500: timed out"
        ),
        "{f:?}"
    );
    assert!(
        has("links", "*", "1500 on spark-b; 9000 on spark-a"),
        "{f:?}"
    );
    assert!(
        has("versions", "*", "0.10.2 on spark-b; 0.11.0 on spark-a"),
        "{f:?}"
    );
    assert_eq!(f.len(), 5, "{f:?}");
}

/// Under `stream_weights` each node's ranks must reach their agent's
/// loader link; a node whose socket did not answer fails with the fix.
#[test]
fn a_streaming_launch_checks_that_the_ranks_reach_their_agent() {
    let streaming = setup(&format!(
        "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\nstream_weights = true"
    ));
    assert!(requests(&streaming).iter().all(|r| r.loader_link));
    let rows = judged(&streaming, |i, f| {
        f.loader_link = if i == 1 {
            Probe::Failed(
                "cannot connect to /r/.xfer/agent.sock (No such file or directory)".into(),
            )
        } else {
            Probe::Ok("/r/.xfer/agent.sock answers (m: syncing)".into())
        };
    });
    let loader = rows_of(&rows, "loader");
    assert_eq!(loader.len(), 2, "{loader:?}");
    assert_eq!(loader[0].verdict, Verdict::Pass);
    assert_eq!(loader[1].verdict, Verdict::Fail);
    assert!(loader[1].detail.contains("No such file"), "{loader:?}");
    assert!(loader[1]
        .fix
        .as_deref()
        .unwrap()
        .contains("restart `xfer serve` on spark-b"));
    // Without streaming it is not asked, and says so.
    assert!(requests(&s()).iter().all(|r| !r.loader_link));
    let rows = judged(&s(), |_, _| {});
    assert!(rows_of(&rows, "loader")
        .iter()
        .all(|r| r.verdict == Verdict::Skip));
}

/// An agent that refused to run the version probe (launching off) is
/// told to start with `--allow-launch`, not to install the engine.
#[test]
fn a_version_probe_the_agent_refused_names_the_agents_flag_not_the_engine() {
    let s = s();
    let off = "spark-b: launching is off on this agent (it starts no engine, stop hook or version probe); start it with `xfer serve --allow-launch`";
    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.versions[0].version = Probe::Skipped(off.into());
        }
    });
    let row = rows
        .iter()
        .find(|r| r.check == "versions" && r.verdict == Verdict::Fail)
        .expect("a failed versions row");
    assert!(row.detail.contains(off), "{row:?}");
    let fix = row.fix.as_deref().unwrap();
    assert!(
        fix.contains("--allow-launch") && !fix.contains("install"),
        "{fix}"
    );
    assert_eq!(fails(&rows).len(), 1, "{rows:?}");
}

#[test]
fn a_fabric_ip_on_the_wrong_interface_says_where_it_is() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 0 {
            let wrong: IpAddr = "10.9.9.9".parse().unwrap();
            if let Probe::Ok(x) = &mut f.fabric {
                x.addrs = vec![(wrong, 24)];
            }
            f.interfaces[0].addrs.push((s.nodes[0].fabric_ip, 24));
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].2.contains(
            "192.168.100.1 is not on enp1s0f1np1 (it has 10.9.9.9/24); 192.168.100.1 is on enP7s7"
        ),
        "{}",
        f[0].2
    );
}

#[test]
fn skipped_probes_say_why_and_never_pass() {
    let s = s();
    let rows = judged(&s, |_, f| {
        f.gpus = Probe::Skipped("nvidia-smi not found on PATH; no NVIDIA GPU check".into());
        f.rdma = Probe::Skipped("no rdma_device for this node in the cluster file".into());
    });
    let gpu: Vec<&Row> = rows.iter().filter(|r| r.check == "gpu").collect();
    assert!(gpu.iter().all(
        |r| r.verdict == Verdict::Skip && r.detail.starts_with("skipped: nvidia-smi not found")
    ));
    assert!(!failed(&rows));
}

#[test]
fn requests_probe_the_rendezvous_port_and_bind_ports_on_the_head_only() {
    let s = s();
    let r = requests(&s);
    assert_eq!(r[0].listen_port, Some(29500));
    assert_eq!(r[0].peers[0].addr, "192.168.100.2:29500".parse().unwrap());
    assert_eq!(
        r[0].ports.iter().map(|p| p.port).collect::<Vec<_>>(),
        [29500, 8000]
    );
    assert!(r[1].ports.is_empty());
    assert_eq!(r[0].versions[0].argv, ["vllm", "--version"]);
    assert_eq!(
        r[1].rdma.as_ref().unwrap().device,
        s.nodes[1].rdma.as_ref().unwrap().device
    );
    let sg = setup(&format!(
        "engine = \"sglang\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""
    ));
    assert_eq!(requests(&sg)[1].listen_port, Some(20000));
}

#[test]
fn every_check_is_judged_in_the_order_of_the_table() {
    let names: Vec<&str> = JUDGES.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, CHECKS);
}

#[test]
fn the_rendezvous_and_the_page_cache_are_reported_per_node() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.rendezvous = Probe::Failed(
                "the Gloo all-reduce did not finish within 22.0s: a rank waits for a peer it cannot reach".into(),
            );
            f.unified_memory = Some(false);
        }
    });
    let bad = fails(&rows);
    assert_eq!(bad.len(), 1, "{}", render(&rows, None));
    assert_eq!(bad[0].0, "rendezvous");
    assert_eq!(bad[0].1, s.nodes[1].name);
    assert!(
        bad[0].2.contains("did not finish within 22.0s"),
        "{}",
        bad[0].2
    );
    let fix = rows
        .iter()
        .find(|r| r.check == "rendezvous" && r.verdict == Verdict::Fail)
        .and_then(|r| r.fix.clone())
        .unwrap();
    assert!(fix.contains("firewall"), "{fix}");
    let cache: Vec<&Row> = rows.iter().filter(|r| r.check == "cache").collect();
    assert_eq!(cache.len(), 2);
    assert!(
        cache[0]
            .detail
            .contains("(25 %, 4 files) in the page cache; unified memory"),
        "{}",
        cache[0].detail
    );
    assert!(
        cache[1].detail.contains("GPU memory is separate"),
        "{}",
        cache[1].detail
    );
    // The torch version is compared like the engine's.
    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.versions[1].version = Probe::Ok("2.12.0+cu128".into());
        }
    });
    let bad = fails(&rows);
    assert!(
        bad.iter()
            .any(|(c, _, d)| *c == "versions" && d.contains("torch differs")),
        "{}",
        render(&rows, None)
    );
}

/// The two nodes, their ranks in `xt/app:1`, with `more` in [launch].
fn in_image(more: &str) -> Setup {
    setup(&format!(
        "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\nimage = \"xt/app:1\"\n{more}"
    ))
}

/// The rows of one check.
fn rows_of<'a>(rows: &'a [Row], check: &str) -> Vec<&'a Row> {
    rows.iter().filter(|r| r.check == check).collect()
}

/// Node `i`'s container facts, to change.
fn engine_of(f: &mut NodeFacts) -> &mut ContainerFacts {
    match &mut f.containers {
        Probe::Ok(c) => c,
        other => panic!("no engine: {other:?}"),
    }
}

#[test]
fn without_an_image_the_container_rows_only_report() {
    let s = s();
    assert!(requests(&s).iter().all(|r| r.image.is_none()));
    // Not even an agent without an engine fails a launch on the host.
    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.containers = Probe::Skipped("no container engine on this agent; start it with `xfer serve --container-engine docker`".into());
        }
    });
    assert!(!failed(&rows), "{}", render(&rows, None));
    let c = rows_of(&rows, "containers");
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|r| r.verdict == Verdict::Skip), "{c:?}");
    assert_eq!(
        c[0].detail,
        "skipped: no [launch] image; the ranks run on the host (docker 20.10.24 on this agent)"
    );
    assert_eq!(
        c[1].detail,
        "skipped: no [launch] image; the ranks run on the host"
    );
    let img = rows_of(&rows, "image");
    assert_eq!(img.len(), 1);
    assert_eq!((img[0].node.as_str(), img[0].verdict), ("*", Verdict::Skip));
}

#[test]
fn one_image_id_everywhere_passes_the_gate() {
    let s = in_image("");
    assert!(requests(&s)
        .iter()
        .all(|r| r.image.as_deref() == Some("xt/app:1")));
    let rows = judged(&s, |_, _| {});
    assert!(!failed(&rows), "{}", render(&rows, None));
    let c = rows_of(&rows, "containers");
    assert_eq!(c.len(), 2);
    for r in &c {
        assert_eq!(r.verdict, Verdict::Pass);
        assert_eq!(r.detail, "docker 20.10.24; nvidia runtime: nvidia");
    }
    let img = rows_of(&rows, "image");
    assert_eq!(img.len(), 1, "{img:?}");
    assert_eq!(img[0].verdict, Verdict::Pass);
    assert_eq!(img[0].node, "*");
    assert_eq!(
        img[0].detail,
        "image xt/app:1 is 070707070707 on all 2 node(s)"
    );
    // `up` hands that id to every agent.
    let checked = crate::check::Checked {
        ok: true,
        rows: rows.clone(),
        nodes: (0..2)
            .map(|i| (s.nodes[i].name.clone(), Ok(good(&s, i))))
            .collect(),
        model_path: s.model.path.clone(),
        units: vec![],
        caches: Vec::new(),
        rounds: Default::default(),
    };
    assert_eq!(checked.image_id(), Some(Digest([7; 32])));
}

#[test]
fn an_agent_without_a_container_engine_fails_with_the_switch() {
    let s = in_image("");
    let rows = judged(&s, |i, f| {
        if i == 1 {
            f.containers = Probe::Skipped(
                "no container engine on this agent; start it with `xfer serve --container-engine docker`".into(),
            );
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert_eq!((f[0].0, f[0].1), ("containers", "spark-b"));
    assert_eq!(
        f[0].2,
        "image xt/app:1 needs a container engine: no container engine on this agent; start it with `xfer serve --container-engine docker`"
    );
    let row = rows_of(&rows, "containers")[1];
    assert!(
        row.fix
            .as_deref()
            .unwrap()
            .contains("restart the agent on spark-b with `xfer serve --container-engine docker`"),
        "{row:?}"
    );
    // The gate never passes a node it could not look in.
    let img = rows_of(&rows, "image");
    assert_eq!(img.len(), 1, "{img:?}");
    assert_eq!(
        (img[0].node.as_str(), img[0].verdict),
        ("spark-b", Verdict::Skip)
    );
    // An engine that does not answer fails the same row.
    let rows = judged(&s, |i, f| {
        if i == 0 {
            f.containers = Probe::Failed(
                "Cannot connect to the Docker daemon at unix:///var/run/docker.sock".into(),
            );
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert_eq!((f[0].0, f[0].1), ("containers", "spark-a"));
    assert!(
        f[0].2
            .contains("does not answer: Cannot connect to the Docker daemon"),
        "{}",
        f[0].2
    );
}

#[test]
fn a_missing_nvidia_runtime_warns_only_where_gpus_would_use_it() {
    let no_runtime = |f: &mut NodeFacts| {
        engine_of(f).nvidia_runtime = Probe::Failed(
            "no nvidia runtime (runtimes: io.containerd.runc.v2, runc); install the NVIDIA Container Toolkit".into(),
        );
    };
    let rows = judged(&in_image(""), |_, f| no_runtime(f));
    assert!(!failed(&rows), "{}", render(&rows, None));
    let c = rows_of(&rows, "containers");
    assert!(c.iter().all(|r| r.verdict == Verdict::Warn), "{c:?}");
    assert!(
        c[0].detail
            .starts_with("docker 20.10.24; nvidia runtime: no nvidia runtime (runtimes: "),
        "{}",
        c[0].detail
    );
    assert!(c[0]
        .fix
        .as_deref()
        .unwrap()
        .contains("nvidia-ctk runtime configure"));
    // Without GPUs on the node, or with gpus = "none", nothing needs it.
    let rows = judged(&in_image(""), |i, f| {
        no_runtime(f);
        if i == 1 {
            f.gpus = Probe::Skipped("nvidia-smi not found on PATH".into());
        }
    });
    let c = rows_of(&rows, "containers");
    assert_eq!((c[0].verdict, c[1].verdict), (Verdict::Warn, Verdict::Pass));
    let rows = judged(&in_image("gpus = \"none\""), |_, f| no_runtime(f));
    assert!(rows_of(&rows, "containers")
        .iter()
        .all(|r| r.verdict == Verdict::Pass));
    // Podman passes GPUs by CDI: a skipped probe is shown, not warned of.
    let rows = judged(&in_image(""), |_, f| {
        let e = engine_of(f);
        e.engine = xfer_proto::image::ContainerRuntime::Podman;
        e.version = "4.3.1".into();
        e.nvidia_runtime = Probe::Skipped("podman passes GPUs by CDI".into());
    });
    let c = rows_of(&rows, "containers");
    assert_eq!(c[0].verdict, Verdict::Pass);
    assert_eq!(
        c[0].detail,
        "podman 4.3.1; nvidia runtime: skipped: podman passes GPUs by CDI"
    );
}

#[test]
fn the_image_gate_names_the_node_that_lacks_it() {
    let s = in_image("");
    let rows = judged(&s, |i, f| {
        if i == 1 {
            engine_of(f).image = Some(Probe::Failed(
                "image xt/app:1 is not loaded in docker".into(),
            ));
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert_eq!((f[0].0, f[0].1), ("image", "spark-b"));
    assert_eq!(
        f[0].2,
        "spark-b lacks image xt/app:1: image xt/app:1 is not loaded in docker"
    );
    let row = rows_of(&rows, "image")[0];
    assert_eq!(
        row.fix.as_deref(),
        Some("load it: `xfer image push xt/app:1 --cluster cluster.toml --nodes spark-b` (from the machine that holds the image), then check again")
    );
    // No pass for the nodes that hold it while one does not.
    assert!(rows_of(&rows, "image")
        .iter()
        .all(|r| r.verdict != Verdict::Pass));
    // An agent that did not look is not taken as holding it.
    let rows = judged(&s, |i, f| {
        if i == 0 {
            engine_of(f).image = None;
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert_eq!((f[0].0, f[0].1), ("image", "spark-a"));
    assert!(
        f[0].2.contains("did not look up image xt/app:1"),
        "{}",
        f[0].2
    );
}

#[test]
fn the_image_gate_names_the_odd_node_when_ids_differ() {
    let s = in_image("");
    let rows = judged(&s, |i, f| {
        if i == 1 {
            engine_of(f).image = Some(Probe::Ok(Digest([0xab; 32])));
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert_eq!((f[0].0, f[0].1), ("image", "*"));
    assert_eq!(
        f[0].2,
        "the nodes hold different images under xt/app:1: 070707070707 on spark-a; abababababab on spark-b; spark-b differ"
    );
    let row = rows_of(&rows, "image")[0];
    assert!(
        row.fix
            .as_deref()
            .unwrap()
            .contains("`xfer image push xt/app:1 --cluster cluster.toml`"),
        "{row:?}"
    );
    // Of three nodes, the one against the other two is named, head or not.
    let text = crate::config::tests::file(&format!(
        "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\nimage = \"xt/app:1\""
    ))
    .replace(
        "\n[launch]",
        "\n[[node]]\nname = \"spark-c\"\nagent = \"10.0.0.3\"\nfabric_if = \"eth1\"\nfabric_ip = \"192.168.100.3\"\n\n[launch]",
    );
    let s3 = crate::config::parse(&text, "cluster.toml").unwrap();
    let rows = judged(&s3, |i, f| {
        if i == 0 {
            engine_of(f).image = Some(Probe::Ok(Digest([0xab; 32])));
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert!(f[0].2.ends_with("; spark-a differ"), "{}", f[0].2);
    // No id for `up` to hand on.
    let checked = crate::check::Checked {
        ok: false,
        rows: rows.clone(),
        nodes: (0..3)
            .map(|i| {
                let mut facts = good(&s3, i);
                if i == 0 {
                    engine_of(&mut facts).image = Some(Probe::Ok(Digest([0xab; 32])));
                }
                (s3.nodes[i].name.clone(), Ok(facts))
            })
            .collect(),
        model_path: s3.model.path.clone(),
        units: vec![],
        caches: Vec::new(),
        rounds: Default::default(),
    };
    assert_eq!(checked.image_id(), None);
}

/// A long detail and fix wrap within the width, every word kept, the
/// continuation lines indented; without a width a row stays one line.
#[test]
fn rows_fit_the_width_and_keep_every_word() {
    let detail = "node n1 holds /models/hub/models--meta-llama--Llama-3.1-70B-Instruct/snapshots/<COMMIT> at root 3f2a9c0d1e2b, n2 holds nothing there";
    let fix = "run `xfer sync meta-llama/Llama-3.1-70B-Instruct --cluster cluster.toml --nodes n2` and check again";
    let rows = vec![Row {
        check: "weights",
        node: "n1".into(),
        verdict: Verdict::Fail,
        detail: detail.into(),
        fix: Some(fix.into()),
    }];
    let shown = render(&rows, Some(100));
    for l in shown.lines() {
        assert!(l.chars().count() <= 100, "{l:?}");
    }
    let words: Vec<&str> = shown.split_whitespace().collect();
    for w in detail.split_whitespace().chain(fix.split_whitespace()) {
        assert!(words.contains(&w), "{w} lost: {shown}");
    }
    assert!(
        shown.lines().nth(2).unwrap().starts_with("        "),
        "{shown}"
    );
    let one = render(&rows, None);
    assert!(one.lines().nth(1).unwrap().ends_with(detail), "{one}");
}

/// Node `i`'s build probe answer replaced by `line` (or a failure).
fn build(f: &mut NodeFacts, answer: Probe<String>) {
    let v = f
        .versions
        .iter_mut()
        .find(|v| v.what == crate::unit::BUILD_PROBE)
        .expect("a build probe in the facts");
    v.version = answer;
}

#[test]
fn the_unit_passes_with_its_id_and_nccl_has_its_own_row() {
    let s = s();
    let rows = judged(&s, |_, _| {});
    let n = rows_of(&rows, "nccl");
    assert_eq!(n.len(), 1, "{}", render(&rows, None));
    assert_eq!(n[0].verdict, Verdict::Pass);
    assert_eq!(n[0].detail, "NCCL 2.29.7 on every node");
    let u = rows_of(&rows, "unit");
    assert_eq!(u.len(), 1, "{}", render(&rows, None));
    assert_eq!(u[0].verdict, Verdict::Pass);
    let unit = crate::unit::LaunchUnit::of(&s, &good(&s, 0));
    assert!(
        u[0].detail.starts_with(&format!("unit {}: ", unit.id)),
        "{}",
        u[0].detail
    );
    assert!(
        u[0].detail.contains("vllm 0.11.0, torch 2.13.0+cu130, nccl 2.29.7, cuda driver 580.95.05, cuda runtime 13.0, gpu sm_121"),
        "{}",
        u[0].detail
    );
}

#[test]
fn an_nccl_mismatch_fails_its_own_row_with_the_hang_it_causes() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 1 {
            build(f, Probe::Ok(BUILD.replace("2.29.7", "2.21.5")));
        }
    });
    let f = fails(&rows);
    assert_eq!(f.len(), 1, "{}", render(&rows, None));
    assert_eq!(
        f[0],
        (
            "nccl",
            "*",
            "NCCL differs: 2.21.5 on spark-b; 2.29.7 on spark-a"
        )
    );
    let n = rows_of(&rows, "nccl");
    assert!(n[0].fix.as_deref().unwrap().contains("vllm#46097"));
    assert!(rows_of(&rows, "unit").is_empty(), "{}", render(&rows, None));

    // torch's NCCL agrees, the library vLLM loads does not.
    let rows = judged(&s, |i, f| {
        if i == 0 {
            build(
                f,
                Probe::Ok(BUILD.replace(r#""nccl_lib": "2.29.7""#, r#""nccl_lib": "2.26.2""#)),
            );
        }
    });
    let n = rows_of(&rows, "nccl");
    assert_eq!(n[0].verdict, Verdict::Fail);
    assert_eq!(
        n[0].detail,
        "NCCL differs: 2.29.7 on spark-b; 2.29.7, libnccl 2.26.2 on spark-a"
    );
}

/// Three nodes, without an image.
fn s3() -> Setup {
    let text = crate::config::tests::file(&format!(
        "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""
    ))
    .replace(
        "\n[launch]",
        "\n[[node]]\nname = \"spark-c\"\nagent = \"10.0.0.3\"\nfabric_if = \"eth1\"\nfabric_ip = \"192.168.100.3\"\n\n[launch]",
    );
    crate::config::parse(&text, "cluster.toml").unwrap()
}

#[test]
fn a_node_that_cannot_say_its_nccl_warns_and_the_rest_still_compare() {
    let s = s3();
    let rows = judged(&s, |i, f| {
        match i {
        1 => build(f, Probe::Failed("python3 exited with 1: torch cannot be imported by /usr/bin/python3: No module named 'torch'".into())),
        2 => build(f, Probe::Ok(BUILD.replace("2.29.7", "2.21.5"))),
        _ => {}
    }
    });
    let n = rows_of(&rows, "nccl");
    assert_eq!(n.len(), 2, "{}", render(&rows, None));
    assert_eq!(n[0].verdict, Verdict::Warn);
    assert!(
        n[0].detail
            .starts_with("cannot tell the NCCL build on spark-b: python3 exited with 1"),
        "{}",
        n[0].detail
    );
    assert_eq!(n[1].verdict, Verdict::Fail);
    assert_eq!(
        n[1].detail,
        "NCCL differs: 2.21.5 on spark-c; 2.29.7 on spark-a"
    );
}

#[test]
fn cuda_runtime_and_gpu_architecture_differences_fail_in_rows_of_their_own() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 1 {
            build(
                f,
                Probe::Ok(
                    BUILD
                        .replace(r#""cuda": "13.0""#, r#""cuda": "12.8""#)
                        .replace("sm_121", "sm_90"),
                ),
            );
        }
    });
    let u = rows_of(&rows, "unit");
    assert_eq!(u.len(), 2, "{}", render(&rows, None));
    assert_eq!(
        u[0].detail,
        "CUDA runtime differs: 12.8 on spark-b; 13.0 on spark-a"
    );
    assert_eq!(
        u[1].detail,
        "GPU architecture differs: sm_121 on spark-a; sm_90 on spark-b"
    );
    assert!(u.iter().all(|r| r.verdict == Verdict::Fail));

    let rows = judged(&s, |i, f| {
        if i == 1 {
            if let Probe::Ok(g) = &mut f.gpus {
                g.driver = Some("580.82.07".into());
            }
        }
    });
    // The `versions` check warns of it; the unit has no row of its own.
    assert!(!failed(&rows), "{}", render(&rows, None));
    assert!(rows_of(&rows, "unit").is_empty());
    assert!(rows_of(&rows, "versions")
        .iter()
        .any(|r| r.verdict == Verdict::Warn && r.detail.starts_with("NVIDIA drivers differ")));
}

#[test]
fn the_build_probe_runs_in_the_engines_python_and_not_for_an_image_or_a_custom_engine() {
    let s = s();
    let reqs = requests(&s);
    let p = reqs[0]
        .versions
        .iter()
        .find(|v| v.what == crate::unit::BUILD_PROBE)
        .expect("the build probe is asked");
    assert_eq!(p.argv[..2], ["python3", "-c"]);
    assert_eq!(p.argv[4], "vllm");
    assert!(requests(&in_image(""))[0]
        .versions
        .iter()
        .all(|v| v.what != crate::unit::BUILD_PROBE));
    let rows = judged(&in_image(""), |_, _| {});
    assert_eq!(rows_of(&rows, "nccl")[0].verdict, Verdict::Skip);
}

/// Node `i`'s reverse lookup of `ip` replaced by `l`.
fn slow_reverse(f: &mut NodeFacts, ip: &str, ms: u64, answer: LookupAnswer) {
    let Probe::Ok(r) = &mut f.resolver else {
        panic!("no resolver facts")
    };
    let l = r.reverse.iter_mut().find(|l| l.query == ip).unwrap();
    l.ms = ms;
    l.answer = answer;
}

fn resolver_rows(rows: &[Row]) -> Vec<&Row> {
    rows.iter().filter(|r| r.check == "resolver").collect()
}

#[test]
fn requests_ask_every_node_to_look_up_every_fabric_address() {
    let s = s();
    let r = requests(&s);
    let all: Vec<IpAddr> = s.nodes.iter().map(|n| n.fabric_ip).collect();
    assert_eq!(all.len(), 2);
    assert_eq!(r[0].resolve, all);
    assert_eq!(r[1].resolve, all);
    let rows = judged(&s, |_, _| {});
    let res = resolver_rows(&rows);
    assert_eq!(res.len(), 2);
    assert!(res.iter().all(|r| r.verdict == Verdict::Pass), "{res:?}");
    assert!(
        res[0]
            .detail
            .contains("2 fabric addresses looked up in at most 2 ms"),
        "{}",
        res[0].detail
    );
}

#[test]
fn a_resolver_that_does_not_answer_warns_with_the_hosts_fix_on_recent_torch() {
    let s = s();
    let peer = s.nodes[1].fabric_ip.to_string();
    let rows = judged(&s, |i, f| {
        if i == 0 {
            slow_reverse(f, &peer, 1_500, LookupAnswer::Pending);
        }
    });
    let res = resolver_rows(&rows);
    assert_eq!(res[0].verdict, Verdict::Warn, "{}", render(&rows, None));
    assert_eq!(res[1].verdict, Verdict::Pass);
    let d = &res[0].detail;
    assert!(
        d.contains(&format!(
            "reverse lookup of {peer} ({}) got no answer within 1.5 s",
            s.nodes[1].name
        )),
        "{d}"
    );
    assert!(d.contains("once as it starts"), "{d}");
    let fix = res[0].fix.as_deref().unwrap();
    assert!(
        fix.contains(
            "add the fabric addresses to /etc/hosts on every node: run `xfer-launch hosts "
        ),
        "{fix}"
    );
    assert!(fix.contains(&s.path.display().to_string()), "{fix}");
    // One second is still fine.
    let rows = judged(&s, |_, f| {
        slow_reverse(f, &peer, 1_000, LookupAnswer::Found("b".into()))
    });
    assert!(resolver_rows(&rows)
        .iter()
        .all(|r| r.verdict == Verdict::Pass));
}

#[test]
fn a_lookup_paid_on_every_connection_fails() {
    let s = s();
    let peer = s.nodes[1].fabric_ip.to_string();
    // torch before 2.9 asks again on every connection, even after a failure.
    let rows = judged(&s, |i, f| {
        if i == 0 {
            f.versions[1].version = Probe::Ok("2.8.0+cu128".into());
            slow_reverse(
                f,
                &peer,
                1_200,
                LookupAnswer::Error("Temporary failure in name resolution (EAI -3)".into()),
            );
        }
    });
    let res = resolver_rows(&rows);
    assert_eq!(res[0].verdict, Verdict::Fail, "{}", render(&rows, None));
    assert!(
        res[0]
            .detail
            .contains("took 1.2 s and failed: Temporary failure")
            && res[0]
                .detail
                .contains("torch 2.8.0+cu128 waits it out on every connection"),
        "{}",
        res[0].detail
    );
    assert!(failed(&rows));
    // A lookup that answers, slowly, is never remembered as failed: every
    // torch pays it on every connection.
    let rows = judged(&s, |i, f| {
        if i == 1 {
            slow_reverse(f, &peer, 5_010, LookupAnswer::Found(peer.clone()));
        }
    });
    let res = resolver_rows(&rows);
    assert_eq!(res[1].verdict, Verdict::Fail);
    assert!(
        res[1].detail.contains("took 5.0 s: it answers, slowly"),
        "{}",
        res[1].detail
    );
    // The same failure on torch 2.13 only warns.
    let rows = judged(&s, |i, f| {
        if i == 0 {
            slow_reverse(f, &peer, 1_200, LookupAnswer::Error("x".into()));
        }
    });
    assert_eq!(resolver_rows(&rows)[0].verdict, Verdict::Warn);
}

#[test]
fn a_slow_host_name_warns_with_its_own_line() {
    let s = s();
    let rows = judged(&s, |i, f| {
        if i == 1 {
            let Probe::Ok(r) = &mut f.resolver else {
                unreachable!()
            };
            r.forward.ms = 1_500;
            r.forward.answer = LookupAnswer::Pending;
        }
    });
    let res = resolver_rows(&rows);
    assert_eq!(res[1].verdict, Verdict::Warn);
    assert!(
        res[1].detail.contains(&format!(
            "forward lookup of the host name {} got no answer",
            s.nodes[1].name
        )),
        "{}",
        res[1].detail
    );
    let fix = res[1].fix.as_deref().unwrap();
    assert_eq!(
        fix,
        format!(
            "add `{} {}` to /etc/hosts on {}",
            s.nodes[1].fabric_ip, s.nodes[1].name, s.nodes[1].name
        )
    );
}

#[test]
fn an_agent_that_did_not_probe_is_skipped() {
    let s = s();
    let rows = judged(&s, |_, f| {
        f.resolver = Probe::Skipped("no fabric address to look up".into())
    });
    assert!(resolver_rows(&rows)
        .iter()
        .all(|r| r.verdict == Verdict::Skip && r.detail.contains("no fabric address")));
}
