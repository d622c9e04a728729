//! The container checks, for ranks that run in `[launch] image`:
//! `containers` (each agent has a container engine, and the NVIDIA
//! runtime where the GPUs need it) and `image` (the gate: every node's
//! engine holds the image, under one id).

use xfer_proto::image::Digest;
use xfer_proto::launch::{GpuAccess, NodeFacts, Probe};

use crate::preflight::{by_value, spread, Ctx, Rows, Verdict};

/// The fix for an agent without a container engine.
fn engine_fix(node: &str) -> String {
    format!(
        "restart the agent on {node} with `xfer serve --container-engine docker` (or podman), beside --allow-launch, then check again"
    )
}

/// Whether the node reported GPUs of its own.
fn has_gpus(f: &NodeFacts) -> bool {
    matches!(&f.gpus, Probe::Ok(g) if !g.gpus.is_empty())
}

/// `containers`: with an image, every agent runs a container engine
/// (`xfer serve --container-engine`), and has the NVIDIA runtime when the
/// node's GPUs go to the containers by `--gpus`/`--device`. Without an
/// image, a report that never fails.
pub fn containers(ctx: &Ctx, rows: &mut Rows) {
    let container = ctx.setup.container.as_ref();
    for (n, f) in &ctx.nodes {
        let Some(c) = container else {
            let here = match &f.containers {
                Probe::Ok(e) => format!(" ({} {} on this agent)", e.engine, e.version),
                _ => String::new(),
            };
            rows.add(
                "containers",
                &n.name,
                Verdict::Skip,
                format!("skipped: no [launch] image; the ranks run on the host{here}"),
                None,
            );
            continue;
        };
        match &f.containers {
            Probe::Skipped(why) => rows.add(
                "containers",
                &n.name,
                Verdict::Fail,
                format!("image {} needs a container engine: {why}", c.image),
                Some(engine_fix(&n.name)),
            ),
            Probe::Failed(why) => rows.add(
                "containers",
                &n.name,
                Verdict::Fail,
                format!("the container engine does not answer: {why}"),
                Some(format!(
                    "check the engine on {} (`docker version` as the agent's user: its daemon running, the socket readable), or start the agent with `xfer serve --container-engine docker`",
                    n.name
                )),
            ),
            Probe::Ok(e) => {
                let runtime = match &e.nvidia_runtime {
                    Probe::Ok(name) => name.clone(),
                    Probe::Skipped(why) => format!("skipped: {why}"),
                    Probe::Failed(why) => why.clone(),
                };
                let missing = matches!(e.nvidia_runtime, Probe::Failed(_))
                    && c.gpus != GpuAccess::None
                    && has_gpus(f);
                rows.add(
                    "containers",
                    &n.name,
                    if missing { Verdict::Warn } else { Verdict::Pass },
                    format!("{} {}; nvidia runtime: {runtime}", e.engine, e.version),
                    missing.then(|| {
                        format!(
                            "the containers would not see {}'s GPUs: install the NVIDIA Container Toolkit there and run `nvidia-ctk runtime configure --runtime=docker`, then restart docker; or pass CDI devices with gpus = [\"nvidia.com/gpu=all\"], or set gpus = \"none\"",
                            n.name
                        )
                    }),
                );
            }
        }
    }
}

/// `image`: the gate on the image, like the weights' gate: every node's
/// engine holds `[launch] image`, and all under the same id (the one
/// `up` asks every agent to check again right before it starts).
pub fn image(ctx: &Ctx, rows: &mut Rows) {
    let (setup, file) = (ctx.setup, &ctx.file);
    let Some(c) = &setup.container else {
        rows.add(
            "image",
            "*",
            Verdict::Skip,
            "skipped: no [launch] image; the ranks run on the host".into(),
            None,
        );
        return;
    };
    let push = |nodes: &[&str]| {
        let only = if nodes.is_empty() {
            String::new()
        } else {
            format!(" --nodes {}", nodes.join(","))
        };
        format!(
            "`xfer image push {} --cluster {file}{only}` (from the machine that holds the image), then check again",
            c.image
        )
    };
    let mut held: Vec<(Digest, &str)> = Vec::new();
    let mut complete = true;
    for (n, f) in &ctx.nodes {
        let name = n.name.as_str();
        match &f.containers {
            Probe::Ok(e) => match &e.image {
                Some(Probe::Ok(id)) => held.push((*id, name)),
                Some(Probe::Failed(why) | Probe::Skipped(why)) => {
                    complete = false;
                    rows.add(
                        "image",
                        name,
                        Verdict::Fail,
                        format!("{name} lacks image {}: {why}", c.image),
                        Some(format!("load it: {}", push(&[name]))),
                    );
                }
                None => {
                    complete = false;
                    rows.add(
                        "image",
                        name,
                        Verdict::Fail,
                        format!(
                            "the agent on {name} did not look up image {} (its xfer predates [launch] image)",
                            c.image
                        ),
                        Some(format!("upgrade xfer on {name}, restart its agent, then check again")),
                    );
                }
            },
            _ => {
                // The containers row fails it; never a pass here.
                complete = false;
                rows.add(
                    "image",
                    name,
                    Verdict::Skip,
                    format!("skipped: no container engine on {name} to hold image {} (see the containers row)", c.image),
                    None,
                );
            }
        }
    }
    let ids = by_value(held);
    if ids.len() > 1 {
        let head = setup.nodes[0].name.as_str();
        let major = ids
            .iter()
            .max_by_key(|(id, ns)| (ns.len(), ns.contains(&head), *id))
            .map(|(id, _)| *id);
        let odd: Vec<&str> = ids
            .iter()
            .filter(|(id, _)| Some(**id) != major)
            .flat_map(|(_, ns)| ns.iter().copied())
            .collect();
        rows.add(
            "image",
            "*",
            Verdict::Fail,
            format!(
                "the nodes hold different images under {}: {}; {} differ",
                c.image,
                spread(&ids, |id| id.short(), "; "),
                odd.join(", ")
            ),
            Some(format!(
                "load the operator's image on every node (blobs a node holds are not sent again): {}",
                push(&[])
            )),
        );
    } else if let (Some((id, ns)), true) = (ids.iter().next(), complete) {
        let all = if ns.len() == setup.nodes.len() {
            format!("all {} node(s)", ns.len())
        } else {
            format!("the {} node(s) that answered", ns.len())
        };
        rows.add(
            "image",
            "*",
            Verdict::Pass,
            format!("image {} is {} on {all}", c.image, id.short()),
            None,
        );
    }
}
