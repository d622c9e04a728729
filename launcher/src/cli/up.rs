//! `xfer-launch up`: launch, then say how it went: the readiness
//! measurement, or the failed ranks' last lines.

use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;
use launcher::diagnose::Diagnosed;
use launcher::up::UpOptions;

use super::CliError;

pub async fn up(
    setup: Setup,
    agents: Agents,
    opts: UpOptions,
    json: bool,
) -> Result<ExitCode, CliError> {
    up_after(setup, &agents, opts, json, None).await
}

/// `up`, after `deploy`'s phases (shown in the JSON as `phases`, with
/// `up_s` added) and the preflight that passed in them.
pub async fn up_after(
    setup: Setup,
    agents: &Agents,
    opts: UpOptions,
    json: bool,
    deployed: Option<(launcher::deploy::Phases, &launcher::check::Checked)>,
) -> Result<ExitCode, CliError> {
    let t0 = std::time::Instant::now();
    let (phases, before) = match deployed {
        Some((p, c)) => (Some(p), launcher::up::Before::Passed(c)),
        None => (None, launcher::up::Before::Fresh),
    };
    let out = launcher::up::up(&setup, agents, &opts, before).await?;
    report(&setup, out, json, phases, t0)
}

/// Says how `up` went; `t0` is when it started (`up_s` in `phases`).
pub fn report(
    setup: &Setup,
    out: launcher::up::UpOutcome,
    json: bool,
    phases: Option<launcher::deploy::Phases>,
    t0: std::time::Instant,
) -> Result<ExitCode, CliError> {
    let answered_at = out.result.as_ref().ok().and_then(|r| r.answered_at);
    let phases = phases.map(|mut p| {
        // A preflight that ran beside held ranks ended inside `up`.
        if let Some(rounds) = &out.held_check {
            p.check_s = rounds.total_s();
            p.check_rounds = rounds.clone();
        }
        let started = p.started;
        let mut v = serde_json::to_value(p).unwrap_or_default();
        v["up_s"] = t0.elapsed().as_secs_f64().into();
        // From nothing to the model's first answer (the one-token
        // completion), before the tokens-per-second measure.
        if let (Some(s), Some(a)) = (started, answered_at) {
            v["answered_s"] = a.saturating_duration_since(s).as_secs_f64().into();
            // The same moment on the wall clock, for a bench's own clock.
            let now = xfer::util::clock::since_epoch();
            v["answered_unix"] = now.saturating_sub(a.elapsed()).as_secs_f64().into();
        }
        v
    });
    let record = out.record.display().to_string();
    match out.result {
        Ok(r) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"run": out.run, "record": record, "ready": true, "readiness": r, "phases": phases})
                );
            }
            let secs = std::fs::read(&out.record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["time_to_ready_s"].as_f64())
                .unwrap_or(0.0);
            eprintln!(
                "ready: run {} answers at {} after {secs:.1}s; first token in {:.0} ms, {} tokens in {:.2}s = {:.1} tokens/s",
                out.run, r.url, r.first_token_ms, r.completion_tokens, r.completion_s, r.tokens_per_s
            );
            eprintln!("record: {record}");
            eprintln!(
                "the agents supervise the ranks now; stop them with `xfer-launch down --cluster {}`",
                setup.path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"run": out.run, "record": record, "ready": false, "error": why, "phases": phases})
                );
            }
            // Show the failing ranks from the record.
            let failed = std::fs::read(&out.record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| serde_json::from_value::<Vec<Diagnosed>>(v["failure"].clone()).ok())
                .unwrap_or_default();
            for f in failed.iter().take(3) {
                print_failure(f);
            }
            eprintln!("record: {record}");
            Err(CliError::NotUp { run: out.run, why })
        }
    }
}

fn print_failure(d: &Diagnosed) {
    let r = &d.report;
    eprintln!(
        "--- last lines of rank {} on {} ({}) ---",
        r.rank, r.node, r.log
    );
    for l in &r.tail {
        eprintln!("  {l}");
    }
    if let Some(cause) = &d.root_cause {
        eprintln!("root cause: {cause}");
    }
    for h in &d.hints {
        eprintln!("hint [{}]: {}\n  seen: {}", h.id, h.hint, h.line);
    }
}
