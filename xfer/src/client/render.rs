//! The words of `xfer status`: the table of nodes and models fitted to
//! the terminal (errors and fallbacks wrapped under their rows, never
//! cut), the images table, and the line of one job.

use super::status::NodeReport;
use xfer_proto::admin::{JobState, JobView, ModelState, ModelStatus};
use xfer_proto::text::{wrap, Table};
use xfer_proto::units::{Bytes, Rate};

/// The line `xfer status` prints for a job its source reports: id, model,
/// nodes, the Hub endpoint it pulls from, its state, and while it retries
/// the cause, the retry count and the next attempt.
pub fn job_line(j: &JobView, now_unix: u64) -> String {
    let via = j
        .hub_endpoint
        .as_deref()
        .map(|e| format!(" via {e}"))
        .unwrap_or_default();
    // While it retries, the retry line is its state: no `syncing`
    // beside a cause that says it is not.
    let (shown, detail) = match (j.retry_line(now_unix), &j.last_error, &j.state) {
        (Some(retry), _, _) => (retry, String::new()),
        (None, _, JobState::Failed { .. }) => (j.shown(), String::new()),
        (None, Some(e), _) => (j.shown(), format!(" (last error: {e})")),
        (None, None, _) => (j.shown(), String::new()),
    };
    let striped = if j.intake.is_empty() {
        String::new()
    } else {
        format!(" (striped with {})", j.intake.join(","))
    };
    format!(
        "job {} {} from {}{striped} to {}{via}: {shown}{detail}{}",
        j.id,
        xfer_proto::names::for_people(&j.name),
        j.source_node,
        j.nodes.join(","),
        intake_detail(j)
    )
}

/// For a striped job: what each node fetched from the Hub in the last
/// round, and each node named, with why.
fn intake_detail(j: &JobView) -> String {
    if j.intake.is_empty() {
        return String::new();
    }
    let shares: Vec<String> = j
        .delivered
        .iter()
        .filter(|t| t.from_origin > 0)
        .map(|t| format!("{} {}", t.node, xfer_proto::units::Bytes(t.from_origin)))
        .collect();
    let mut out = String::new();
    if !shares.is_empty() {
        out.push_str(&format!("; from the Hub: {}", shares.join(", ")));
    }
    for t in &j.delivered {
        if let Some(why) = &t.named {
            out.push_str(&format!("; {} named: {why}", t.node));
        }
    }
    out
}

/// The status table, one line per node and model, fitted to `width`
/// columns (`None`: no limit): a model name too long is elided (it is whole
/// in `--json`), a root shown by its first 12 hex digits, and an error or a
/// fallback wrapped on indented lines under its row, never cut.
pub fn render(reports: &[NodeReport], width: Option<usize>) -> String {
    let mut t = Table::new(
        &["NODE", "MODEL", "ROOT", "STATE", "DONE", "RATE", "ETA"],
        &[1, 0],
    );
    let dash = || "-".to_string();
    for r in reports {
        let Some(s) = &r.status else {
            t.row(
                vec![
                    r.node.clone(),
                    dash(),
                    dash(),
                    "unreachable".into(),
                    dash(),
                    dash(),
                    dash(),
                ],
                r.error.iter().map(|e| format!("error: {e}")).collect(),
            );
            continue;
        };
        if s.models.is_empty() {
            t.row(
                vec![
                    r.node.clone(),
                    dash(),
                    dash(),
                    "idle".into(),
                    dash(),
                    dash(),
                    dash(),
                ],
                Vec::new(),
            );
        }
        // A complete blob of an image shows as its image, below.
        for m in s.models.iter().filter(|m| {
            m.state != ModelState::Complete
                || xfer_proto::image::Digest::of_model(&m.name).is_none()
        }) {
            let details = m
                .last_error
                .iter()
                .map(|e| format!("last error: {e}"))
                .collect();
            t.row(row(&r.node, m), details);
        }
    }
    let mut out = t.render(width);
    out.push_str(&render_images(reports, width));
    // Never silent: every pair whose data went over management.
    let mut seen = Vec::new();
    for m in reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| &s.models)
    {
        for f in &m.fallbacks {
            let line = format!("{}: {f}", m.name);
            if !seen.contains(&line) {
                out.push_str(&wrap(&line, width, 4));
                out.push('\n');
                seen.push(line);
            }
        }
    }
    out
}

/// The images table: one line per node and image it loaded; a state that
/// is an error goes on an indented line under its row.
fn render_images(reports: &[NodeReport], width: Option<usize>) -> String {
    let mut t = Table::new(&["NODE", "IMAGE", "ID", "SIZE", "LAYERS", "STATE"], &[1, 0]);
    let mut any = false;
    for r in reports {
        for i in r.status.iter().flat_map(|s| &s.images) {
            any = true;
            let (state, detail) = match &i.engine_id {
                None => (
                    "loaded".to_string(),
                    Some("no engine to ask now".to_string()),
                ),
                Some(Ok(id)) if *id == i.id => ("loaded".to_string(), None),
                Some(Ok(id)) => (
                    "replaced".to_string(),
                    Some(format!(
                        "the engine now holds {} under this name",
                        id.short()
                    )),
                ),
                Some(Err(e)) => ("unknown".to_string(), Some(e.clone())),
            };
            t.row(
                vec![
                    r.node.clone(),
                    i.reference.clone(),
                    i.id.short(),
                    Bytes(i.bytes).to_string(),
                    i.layers.to_string(),
                    state,
                ],
                detail.into_iter().collect(),
            );
        }
    }
    if !any {
        return String::new();
    }
    format!("\n{}", t.render(width))
}

fn row(node: &str, m: &ModelStatus) -> Vec<String> {
    let pct = if m.bytes_total == 0 {
        if m.state == ModelState::Complete {
            "100%".into()
        } else {
            "-".into()
        }
    } else {
        format!("{:.1}%", m.bytes_held as f64 * 100.0 / m.bytes_total as f64)
    };
    vec![
        node.to_string(),
        xfer_proto::names::for_people(&m.name),
        m.root.map(|r| r.short()).unwrap_or_else(|| "-".into()),
        m.state.label().to_string(),
        pct,
        if m.rate_bps > 0.0 {
            Rate(m.rate_bps).to_string()
        } else {
            "-".into()
        },
        m.eta_s
            .map(|e| format!("{e:.0}s"))
            .unwrap_or_else(|| "-".into()),
    ]
}

#[cfg(test)]
mod table_tests {
    use super::*;
    use xfer_proto::admin::AgentStatus;

    /// A node's status as the wire carries it (built from JSON so fields
    /// added later with `#[serde(default)]` need no edit here).
    fn node(name: &str, models: serde_json::Value) -> NodeReport {
        let status: AgentStatus = serde_json::from_value(serde_json::json!({
            "node": name, "root": "/models", "models": models, "jobs": [], "images": []
        }))
        .expect("a status");
        NodeReport {
            node: name.into(),
            agent: "127.0.0.1:7000".into(),
            reachable: true,
            error: None,
            status: Some(status),
        }
    }

    /// At 100 columns no line of the table is wider, a long model name is
    /// elided, and an error is wrapped under its row with every word kept.
    #[test]
    fn the_status_table_fits_100_columns_and_keeps_errors_whole() {
        let error = "cannot write /models/.staging/meta-llama--Llama-3.1-70B-Instruct/model-00017-of-00030.safetensors: No space left on device (os error 28); free 40.2 GiB on /models or move --root";
        let model = serde_json::json!({
            "name": "meta-llama--Llama-3.1-70B-Instruct-with-a-much-longer-name-than-fits",
            "root": null, "state": "syncing", "bytes_total": 141_000_000_000u64,
            "bytes_held": 70_000_000_000u64, "rate_bps": 21_000_000.0, "eta_s": 3400.0,
            "from_source": 0, "from_peers": 0, "last_error": error, "repaired_files": 0
        });
        let mut unreachable = node("node-b", serde_json::json!([]));
        unreachable.status = None;
        unreachable.reachable = false;
        unreachable.error = Some(format!("{}: {error}", "x".repeat(130)));
        let reports = [node("node-a", serde_json::json!([model])), unreachable];
        let shown = render(&reports, Some(100));
        for l in shown.lines() {
            assert!(
                l.chars().count() <= 100,
                "{} columns: {l:?}",
                l.chars().count()
            );
        }
        let words: Vec<&str> = shown.split_whitespace().collect();
        for w in error.split_whitespace() {
            assert!(words.contains(&w), "{w} lost:\n{shown}");
        }
        assert!(shown.contains('…'), "{shown}");
        assert!(shown.contains("20.0 MiB/s"), "{shown}");
        // Without a terminal nothing is elided.
        assert!(render(&reports, None).contains("with-a-much-longer-name-than-fits"));
    }
}
