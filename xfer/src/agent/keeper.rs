//! The root's keeper: its budget (`serve --max-bytes`/`--max-percent`), its
//! watermarks (`--evict-above`, `--evict-to`), what each model holds and
//! when it was last used, pins, and the evictions [`store::evict`] plans.
//!
//! Held, never evicted: a model whose path a live run's ranks use, a model
//! a transfer holds the lock of or a sync job here has not finished, and a
//! pinned one. Every eviction is logged with its reason.

use std::path::Path;
use std::sync::Arc;

use crate::agent::ranks::supervisor::Supervisor;
use crate::agent::sync::runner::Runner;
use crate::store::evict::{self, Budget, Held, Hold, NoRoom, Plan, Want};
use crate::store::usage::{Usage, Use};
use crate::store::{Store, StoreError};
use xfer_proto::admin::{GcReport, GcRow};
use xfer_proto::names::ModelName;
use xfer_proto::refusal::Refusal;
use xfer_proto::units::Bytes;

/// How the operator bounded the root (`xfer serve`'s flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetConfig {
    /// `--max-bytes`.
    pub max_bytes: Option<u64>,
    /// `--max-percent` of the root's filesystem.
    pub max_percent: Option<u8>,
    /// `--evict-above`: the high watermark, percent of the budget.
    pub evict_above: Option<u8>,
    /// `--evict-to`: the low watermark, percent of the budget.
    pub evict_to: Option<u8>,
}

/// The keeper of one root.
pub struct Keeper {
    store: Store,
    usage: Usage,
    config: BudgetConfig,
    /// The models the cluster file's `[launch]` names: kept.
    launch: Vec<ModelName>,
    ranks: Arc<Supervisor>,
    runner: Arc<Runner>,
}

impl Keeper {
    /// The keeper of `store`'s root.
    pub fn new(
        store: Store,
        config: BudgetConfig,
        launch: Vec<ModelName>,
        ranks: Arc<Supervisor>,
        runner: Arc<Runner>,
    ) -> std::io::Result<Keeper> {
        let fs = crate::util::beneath::Root::open(store.root())?;
        Ok(Keeper {
            store,
            usage: Usage::new(fs),
            config,
            launch,
            ranks,
            runner,
        })
    }

    /// The budget now: `--max-bytes`, else `--max-percent` of the
    /// filesystem, else the filesystem's size; the watermarks within it
    /// (without `--evict-above` both are the whole budget: no eviction
    /// until room is asked for).
    pub fn budget(&self) -> Budget {
        let fs_total = match crate::sysinfo::host::disk(self.store.root()) {
            xfer_proto::launch::Probe::Ok(d) => d.total_bytes,
            _ => u64::MAX,
        };
        let limit = match (self.config.max_bytes, self.config.max_percent) {
            (Some(b), Some(p)) => b.min(pct(fs_total, p)),
            (Some(b), None) => b,
            (None, Some(p)) => pct(fs_total, p),
            (None, None) => fs_total,
        };
        let high = self.config.evict_above.unwrap_or(100);
        let low = self.config.evict_to.unwrap_or(high);
        Budget::new(limit, high, low)
    }

    /// Every model of the root as eviction sees it.
    pub fn inventory(&self) -> Vec<(Held, Use)> {
        let uses = self.usage.all();
        let live = self.ranks.live_models();
        let jobs: Vec<ModelName> = self
            .runner
            .records()
            .into_iter()
            .filter(|r| !r.state.is_final())
            .map(|r| r.spec.name)
            .collect();
        let root = self.store.root().to_path_buf();
        self.store
            .sizes()
            .into_iter()
            .map(|(name, bytes, written)| {
                let u = uses.get(name.as_str()).copied().unwrap_or_default();
                let dir = root.join(name.as_str());
                let in_use = live.iter().find(|(_, paths)| {
                    paths
                        .iter()
                        .any(|p| Path::new(p).starts_with(&dir) || Path::new(p) == dir)
                });
                let hold = if let Some((run, _)) = in_use {
                    Some(Hold::InUse(run.clone()))
                } else if jobs.contains(&name) || self.store.is_busy(&name) {
                    Some(Hold::Busy)
                } else if u.pinned {
                    Some(Hold::Pinned)
                } else if self.launch.contains(&name) {
                    Some(Hold::Launch)
                } else {
                    None
                };
                let last_used_ms = if u.last_used_ms > 0 {
                    u.last_used_ms
                } else {
                    written
                };
                (
                    Held {
                        name,
                        bytes,
                        last_used_ms,
                        hold,
                    },
                    u,
                )
            })
            .collect()
    }

    /// Plans as `want` asks and, unless `dry_run`, evicts: the report of
    /// the root after it, or what holds the space.
    pub fn gc(&self, want: Want, dry_run: bool) -> Result<GcReport, NoRoom> {
        let budget = self.budget();
        let inv = self.inventory();
        let held: Vec<Held> = inv.iter().map(|(h, _)| h.clone()).collect();
        let plan = evict::plan(&held, budget, want)?;
        let reason = match want {
            Want::Watermarks => "above the high watermark",
            Want::Room { .. } => "room asked for",
        };
        let (evicted, failed) = if dry_run {
            let now = crate::util::clock::unix_now_ms();
            let would = plan
                .evict
                .iter()
                .map(|e| {
                    let ago = now.saturating_sub(e.last_used_ms) / 1000;
                    let why = format!("{reason}: least recently used (last used {ago} s ago)");
                    (e.name.to_string(), e.bytes, why)
                })
                .collect();
            (would, Vec::new())
        } else {
            self.execute(&plan, reason)
        };
        Ok(report(budget, inv, evicted, failed, dry_run))
    }

    /// Before `need` bytes of model `name` are received here: fine when
    /// they fit under the budget beside the other models; else, with
    /// watermarks set (`--evict-above`, the operator's consent to evict),
    /// evicts least recently used first what is not held; else refuses,
    /// saying what `xfer gc` would evict or what holds the space.
    pub fn make_room(&self, name: &ModelName, need: u64) -> Result<(), Refusal> {
        if self.config.max_bytes.is_none() && self.config.max_percent.is_none() {
            // No budget but the disk: the store's free-space check speaks.
            return Ok(());
        }
        let budget = self.budget();
        let others: Vec<Held> = self
            .inventory()
            .into_iter()
            .map(|(h, _)| h)
            .filter(|h| &h.name != name)
            .collect();
        let used: u64 = others.iter().map(|h| h.bytes).sum();
        if used.saturating_add(need) <= budget.limit {
            return Ok(());
        }
        let short = format!(
            "{name} needs {} and this node's budget of {} holds {} of other models",
            Bytes(need),
            Bytes(budget.limit),
            Bytes(used)
        );
        let plan = evict::plan(&others, budget, Want::Room { need })
            .map_err(|no| Refusal::OverBudget(format!("{short}: {no}")))?;
        if self.config.evict_above.is_none() {
            let names: Vec<&str> = plan.evict.iter().map(|e| e.name.as_str()).collect();
            return Err(Refusal::OverBudget(format!(
                "{short}; `xfer gc --need {need}` would evict {} (least recently used first), or start the agent with --evict-above to evict on demand",
                names.join(", ")
            )));
        }
        let (_, failed) = self.execute(&plan, &format!("room for {name}"));
        match failed.first() {
            None => Ok(()),
            Some(f) => Err(Refusal::OverBudget(format!("{short}; evicting {f}"))),
        }
    }

    /// Evicts what `plan` lists (each under its transfer lock, so a sync
    /// begun since the plan keeps its model); what went, and `NAME: why`
    /// of what could not.
    fn execute(&self, plan: &Plan, reason: &str) -> (Vec<(String, u64, String)>, Vec<String>) {
        let mut evicted = Vec::new();
        let mut failed = Vec::new();
        for e in &plan.evict {
            let why = format!(
                "{reason}: least recently used (last used {} s ago)",
                crate::util::clock::unix_now_ms().saturating_sub(e.last_used_ms) / 1000
            );
            match self.store.remove(&e.name, false) {
                Ok(_) => {
                    let _ = self.usage.forget(&e.name);
                    tracing::info!("evicted {} ({}): {why}", e.name, Bytes(e.bytes));
                    evicted.push((e.name.to_string(), e.bytes, why));
                }
                Err(err) => failed.push(format!("{}: {err}", e.name)),
            }
        }
        (evicted, failed)
    }

    /// Pins or unpins `name`, which the root must hold.
    pub fn pin(&self, name: &ModelName, pinned: bool) -> Result<Use, StoreError> {
        let names = self.store.model_names();
        if !names.iter().any(|n| n == name) {
            return Err(StoreError::Invalid(format!(
                "this node holds no model `{name}`; `xfer status` lists what it holds"
            )));
        }
        self.usage
            .pin(name, pinned, crate::util::clock::unix_now_ms(), |n| {
                names.iter().any(|k| k.as_str() == n)
            })
            .map_err(|e| StoreError::Io {
                path: self
                    .store
                    .root()
                    .join(".xfer/usage.json")
                    .display()
                    .to_string(),
                message: e.to_string(),
            })
    }

    /// `name` was used now (a launch, a transfer, an operator).
    pub fn touch(&self, name: &ModelName) {
        let names = self.store.model_names();
        if let Err(e) = self
            .usage
            .touch(name, crate::util::clock::unix_now_ms(), |n| {
                names.iter().any(|k| k.as_str() == n)
            })
        {
            tracing::warn!("cannot note the use of {name}: {e}");
        }
    }

    /// The model a path under the root belongs to (its first component).
    pub fn model_of(&self, path: &str) -> Option<ModelName> {
        let rel = Path::new(path).strip_prefix(self.store.root()).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        ModelName::new(first).ok()
    }
}

/// The report of a `gc`: the root's models as the plan saw them, less
/// what it evicted (unless a dry run).
fn report(
    budget: Budget,
    inv: Vec<(Held, Use)>,
    evicted: Vec<(String, u64, String)>,
    failed: Vec<String>,
    dry_run: bool,
) -> GcReport {
    let gone = |name: &str| !dry_run && evicted.iter().any(|(n, _, _)| n == name);
    let models: Vec<GcRow> = inv
        .into_iter()
        .filter(|(h, _)| !gone(h.name.as_str()))
        .map(|(h, u)| GcRow {
            name: h.name.to_string(),
            bytes: h.bytes,
            last_used_ms: h.last_used_ms,
            pinned: u.pinned,
            held: h.hold.map(|x| x.to_string()),
        })
        .collect();
    GcReport {
        limit: budget.limit,
        high: budget.high,
        low: budget.low,
        used: models.iter().map(|m| m.bytes).sum(),
        models,
        evicted,
        failed,
        dry_run,
    }
}

fn pct(total: u64, p: u8) -> u64 {
    (total as u128 * p.min(100) as u128 / 100) as u64
}

/// The stored name of the model a cluster file's `[launch] model` names:
/// a repo id (`ORG/NAME[@REV]`, its cache folder) or a path under `root`
/// (its first component there); none for anything else.
pub fn launch_model(launch: Option<&toml::Table>, root: &Path) -> Option<ModelName> {
    let model = launch?.get("model")?.as_str()?;
    if model.starts_with('/') {
        let rel = Path::new(model).strip_prefix(root).ok()?;
        return ModelName::new(rel.components().next()?.as_os_str().to_str()?).ok();
    }
    ModelName::from_user(model, xfer_proto::repo::RepoType::Model).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_model_is_named_by_repo_id_or_by_its_path_under_the_root() {
        let t = |s: &str| -> toml::Table { toml::from_str(s).unwrap() };
        let root = Path::new("/data/xfer");
        let named = |s: &str| launch_model(Some(&t(s)), root).map(|n| n.to_string());
        assert_eq!(
            named("model = \"Qwen/Qwen3-8B@main\""),
            Some("models--Qwen--Qwen3-8B".into())
        );
        assert_eq!(
            named("model = \"/data/xfer/tiny/snapshots\""),
            Some("tiny".into())
        );
        assert_eq!(named("model = \"/elsewhere/tiny\""), None);
        assert_eq!(named("engine = \"vllm\""), None);
        assert_eq!(launch_model(None, root), None);
    }
}
