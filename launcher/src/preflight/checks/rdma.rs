//! The `rdma` check: the RDMA device named for each node, and its ports.

use xfer_proto::launch::Probe;

use crate::preflight::{Ctx, Rows, Verdict};

/// `rdma`: the node's RDMA device and its ports.
pub fn rdma(ctx: &Ctx, rows: &mut Rows) {
    let (nodes, file) = (&ctx.nodes, &ctx.file);
    for (n, f) in nodes {
        match &f.rdma {
            Probe::Ok(r) => {
                let ports: Vec<String> = r
                    .ports
                    .iter()
                    .map(|p| {
                        let layer = p.link_layer.as_ref().map_or("link layer unknown", |l| l.as_str());
                        format!("port {} {} ({layer})", p.port, p.state)
                    })
                    .collect();
                rows.add(
                    "rdma",
                    &n.name,
                    Verdict::Pass,
                    format!(
                        "{}: {}{}",
                        r.device,
                        ports.join(", "),
                        r.gid.as_deref().map(|g| format!(", gid {g}")).unwrap_or_default()
                    ),
                    None,
                );
            }
            Probe::Skipped(why) => rows.add("rdma", &n.name, Verdict::Skip, format!("skipped: {why}"), None),
            Probe::Failed(why) => rows.add(
                "rdma",
                &n.name,
                Verdict::Fail,
                match &n.rdma {
                    Some(r) if !why.contains(&r.device) => format!("rdma_device {}: {why}", r.device),
                    _ => why.clone(),
                },
                Some(format!(
                    "fix the device, or correct rdma_device / gid_index at {file}:{} (remove them to run NCCL over TCP)",
                    n.line
                )),
            ),
        }
    }
}
