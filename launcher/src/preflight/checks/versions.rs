//! The `versions` check: one engine build, and one NVIDIA driver, on
//! every node.

use xfer_proto::launch::Probe;

use crate::preflight::{by_value, spread, version_probes, Ctx, Rows, Verdict};

/// `versions`: one engine build everywhere (and one driver).
pub fn versions(ctx: &Ctx, rows: &mut Rows) {
    let (setup, nodes) = (ctx.setup, &ctx.nodes);
    let probes = version_probes(setup.engine);
    if probes.is_empty() {
        rows.add(
            "versions",
            "*",
            Verdict::Skip,
            "skipped: a custom engine has no version to ask for".into(),
            None,
        );
    }
    for p in &probes {
        let mut seen: Vec<(String, &str)> = Vec::new();
        let mut missing = Vec::new();
        // Not run: the agent's permits refused it (its own reason says which).
        let mut refused = Vec::new();
        for (n, f) in nodes {
            match f
                .versions
                .iter()
                .find(|v| v.what == p.what)
                .map(|v| &v.version)
            {
                Some(Probe::Ok(v)) => seen.push((v.clone(), &n.name)),
                Some(Probe::Failed(w)) => missing.push(format!("{}: {w}", n.name)),
                Some(Probe::Skipped(w)) => refused.push(w.clone()),
                None => missing.push(format!("{}: not asked", n.name)),
            }
        }
        let seen = by_value(seen);
        if !refused.is_empty() {
            rows.add(
                "versions",
                "*",
                Verdict::Fail,
                format!("{} was not asked: {}", p.what, refused.join("; ")),
                Some(
                    "the agent runs the engine only when started with `xfer serve --allow-launch` (and `--allow-exec` listing it, if it lists any): docs/launcher.md#allowing-launches"
                        .into(),
                ),
            );
        }
        if !missing.is_empty() {
            rows.add(
                "versions",
                "*",
                Verdict::Fail,
                format!("{} on every node: {}", p.what, missing.join("; ")),
                Some(format!("install the same {} on every node, on the PATH the xfer agent runs with (the ranks inherit it)", p.what)),
            );
        } else if seen.len() > 1 && refused.is_empty() {
            let list = spread(&seen, |v| v.clone(), "; ");
            rows.add(
                "versions",
                "*",
                Verdict::Fail,
                format!("{} differs: {list}", p.what),
                Some(format!(
                    "install one {} version on every node; mixed builds hang or fail at init",
                    p.what
                )),
            );
        } else if let (Some(v), true) = (seen.keys().next(), refused.is_empty()) {
            rows.add(
                "versions",
                "*",
                Verdict::Pass,
                format!("{} {v} on every node", p.what),
                None,
            );
        }
    }
    let drivers = by_value(nodes.iter().filter_map(|(n, f)| match &f.gpus {
        Probe::Ok(g) => g.driver.as_deref().map(|d| (d, n.name.as_str())),
        _ => None,
    }));
    if drivers.len() > 1 {
        let list = spread(&drivers, |d| d.to_string(), "; ");
        rows.add(
            "versions",
            "*",
            Verdict::Warn,
            format!("NVIDIA drivers differ: {list}"),
            Some("install one driver version on every node".into()),
        );
    }
}
