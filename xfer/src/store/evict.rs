//! Which models a node's root gives up when it needs room: a pure planner,
//! facts in and a plan out, so every rule is tested without a disk.
//!
//! A root has a budget (bytes it may hold) and two watermarks inside it.
//! [`plan`] evicts, least recently used first, until what is held fits:
//! under the low watermark once the high one is passed ([`Want::Watermarks`]),
//! or with `need` more bytes free under the budget ([`Want::Room`]). It
//! never picks a model that is held: in use by a live run, being received
//! or read by a job, or pinned. When evicting every model that is not held
//! cannot make the room, nothing is evicted and [`NoRoom`] names what holds
//! the space.

use std::fmt;

use xfer_proto::names::ModelName;
use xfer_proto::units::Bytes;

/// Why a model may not be evicted now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A live run's ranks use it (the run's id).
    InUse(String),
    /// A transfer or sync job writes or reads it here.
    Busy,
    /// An operator pinned it (`xfer pin`).
    Pinned,
    /// The cluster file's `[launch]` names it (`serve --cluster`).
    Launch,
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hold::InUse(run) => write!(f, "in use by run {run}"),
            Hold::Busy => f.write_str("being transferred"),
            Hold::Pinned => f.write_str("pinned"),
            Hold::Launch => f.write_str("the model of the cluster file's [launch]"),
        }
    }
}

/// One model a root holds, as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Its stored name.
    pub name: ModelName,
    /// Bytes it takes on disk.
    pub bytes: u64,
    /// When it was last used (unix milliseconds): a launch on it, a transfer
    /// from or into it, an operator's touch.
    pub last_used_ms: u64,
    /// Why it must stay, if it must.
    pub hold: Option<Hold>,
}

/// A root's budget: the bytes it may hold and its watermarks, all in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The most the root may hold.
    pub limit: u64,
    /// Past this, eviction starts ([`Want::Watermarks`]).
    pub high: u64,
    /// ... and goes on until the root holds no more than this.
    pub low: u64,
}

impl Budget {
    /// A budget of `limit` bytes with watermarks at `high_pct` and
    /// `low_pct` percent of it (`low_pct` ≤ `high_pct` ≤ 100).
    pub fn new(limit: u64, high_pct: u8, low_pct: u8) -> Budget {
        let pct = |p: u8| (limit as u128 * p.min(100) as u128 / 100) as u64;
        let high = pct(high_pct);
        Budget {
            limit,
            high,
            low: pct(low_pct).min(high),
        }
    }
}

/// What the plan must achieve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Once past the high watermark, down to the low one.
    Watermarks,
    /// `need` more bytes under the budget (a sync that lacks room).
    Room {
        /// The bytes the new model needs.
        need: u64,
    },
}

/// One eviction of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evict {
    /// The model.
    pub name: ModelName,
    /// Its bytes.
    pub bytes: u64,
    /// When it was last used (unix milliseconds).
    pub last_used_ms: u64,
}

/// The models to evict, in order, least recently used first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// What goes.
    pub evict: Vec<Evict>,
}

impl Plan {
    /// Bytes the plan frees.
    pub fn freed(&self) -> u64 {
        self.evict.iter().map(|e| e.bytes).sum()
    }
}

/// No plan can make the room: what holds the space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoRoom {
    /// Bytes the root would have to hold at most.
    pub target: u64,
    /// Bytes it holds now.
    pub used: u64,
    /// Bytes evicting every model not held would free.
    pub evictable: u64,
    /// The held models, largest first: name, bytes, why.
    pub held: Vec<(ModelName, u64, Hold)>,
}

impl fmt::Display for NoRoom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot make room: {} held must come down to {}, and evicting every model not held frees only {}",
            Bytes(self.used),
            Bytes(self.target),
            Bytes(self.evictable)
        )?;
        if self.held.is_empty() {
            return f.write_str("; raise the node's --max-bytes or free its disk");
        }
        f.write_str("; held: ")?;
        for (i, (name, bytes, why)) in self.held.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} ({}, {why})", Bytes(*bytes))?;
        }
        f.write_str("; unpin or stop what holds them, or raise the node's --max-bytes")
    }
}

/// The evictions that bring `held` (which fills the root by the sum of
/// its bytes) within `budget` as `want` asks, least recently used first
/// (then largest first, then by name: deterministic).
pub fn plan(held: &[Held], budget: Budget, want: Want) -> Result<Plan, NoRoom> {
    let used: u64 = held.iter().map(|h| h.bytes).sum();
    let target = match want {
        Want::Watermarks if used <= budget.high => return Ok(Plan::default()),
        Want::Watermarks => budget.low,
        Want::Room { need } => budget.limit.saturating_sub(need),
    };
    if used <= target {
        return Ok(Plan::default());
    }
    let mut free: Vec<&Held> = held.iter().filter(|h| h.hold.is_none()).collect();
    free.sort_by(|a, b| {
        a.last_used_ms
            .cmp(&b.last_used_ms)
            .then(b.bytes.cmp(&a.bytes))
            .then(a.name.as_str().cmp(b.name.as_str()))
    });
    let evictable: u64 = free.iter().map(|h| h.bytes).sum();
    if used - evictable.min(used) > target {
        let mut held: Vec<(ModelName, u64, Hold)> = held
            .iter()
            .filter_map(|h| Some((h.name.clone(), h.bytes, h.hold.clone()?)))
            .collect();
        held.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.as_str().cmp(b.0.as_str())));
        return Err(NoRoom {
            target,
            used,
            evictable,
            held,
        });
    }
    let mut now = used;
    let mut plan = Plan::default();
    for h in free {
        if now <= target {
            break;
        }
        now -= h.bytes;
        plan.evict.push(Evict {
            name: h.name.clone(),
            bytes: h.bytes,
            last_used_ms: h.last_used_ms,
        });
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn m(name: &str, bytes: u64, last_used_ms: u64, hold: Option<Hold>) -> Held {
        Held {
            name: ModelName::new(name).unwrap(),
            bytes,
            last_used_ms,
            hold,
        }
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.evict.iter().map(|e| e.name.as_str()).collect()
    }

    #[test]
    fn the_least_recently_used_go_first_and_held_models_stay() {
        let held = [
            m("a", 30, 10, None),
            m("b", 30, 5, Some(Hold::InUse("r1".into()))),
            m("c", 30, 7, Some(Hold::Pinned)),
            m("d", 30, 20, None),
        ];
        let b = Budget::new(100, 85, 75);
        // 120 held, room for 30 more: 50 must go (a, then d).
        let p = plan(&held, b, Want::Room { need: 30 }).unwrap();
        assert_eq!(names(&p), ["a", "d"]);
        // 120 > 85: down to 75, so two go.
        let p = plan(&held, b, Want::Watermarks).unwrap();
        assert_eq!(names(&p), ["a", "d"]);
        // Under the high watermark: nothing.
        assert_eq!(
            plan(&held[..2], b, Want::Watermarks).unwrap(),
            Plan::default()
        );
    }

    #[test]
    fn no_room_names_what_holds_the_space() {
        let held = [
            m("a", 40, 1, Some(Hold::Pinned)),
            m("b", 50, 2, Some(Hold::InUse("r9".into()))),
            m("c", 10, 3, None),
        ];
        let e = plan(&held, Budget::new(100, 90, 80), Want::Room { need: 30 }).unwrap_err();
        assert_eq!(e.evictable, 10);
        let line = e.to_string();
        assert!(
            line.contains("b (50 B, in use by run r9), a (40 B, pinned)"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    /// The invariants, over seeded random roots: a held model is never in a
    /// plan; a plan reaches its target and stops as soon as it does; what
    /// it evicts is the least recently used of what may go; a refusal comes
    /// only when evicting everything that may go would not do.
    #[test]
    fn random_roots_keep_the_invariants() {
        for seed in 0..2000u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let n = rng.gen_range(0..12);
            let held: Vec<Held> = (0..n)
                .map(|i| {
                    let hold = match rng.gen_range(0..6) {
                        0 => Some(Hold::Pinned),
                        1 => Some(Hold::InUse(format!("r{i}"))),
                        2 => Some(Hold::Busy),
                        _ => None,
                    };
                    m(
                        &format!("m{i}"),
                        rng.gen_range(1..100),
                        rng.gen_range(0..20),
                        hold,
                    )
                })
                .collect();
            let limit = rng.gen_range(1..600);
            let budget = Budget::new(limit, rng.gen_range(50..=100), rng.gen_range(0..=100));
            let want = if rng.gen_bool(0.5) {
                Want::Watermarks
            } else {
                Want::Room {
                    need: rng.gen_range(0..300),
                }
            };
            let used: u64 = held.iter().map(|h| h.bytes).sum();
            let target = match want {
                Want::Watermarks if used <= budget.high => used,
                Want::Watermarks => budget.low,
                Want::Room { need } => limit.saturating_sub(need),
            };
            let evictable: u64 = held
                .iter()
                .filter(|h| h.hold.is_none())
                .map(|h| h.bytes)
                .sum();
            match plan(&held, budget, want) {
                Ok(p) => {
                    let after = used - p.freed();
                    assert!(after <= target, "seed {seed}: {after} > {target}");
                    for e in &p.evict {
                        let h = held.iter().find(|h| h.name == e.name).unwrap();
                        assert!(h.hold.is_none(), "seed {seed}: evicted held {}", e.name);
                    }
                    if let Some(last) = p.evict.last() {
                        // Stops once there: without the last, not there yet.
                        assert!(after + last.bytes > target, "seed {seed}: evicted too much");
                        // Nothing kept that may go was used before the last.
                        for h in held.iter().filter(|h| h.hold.is_none()) {
                            if !p.evict.iter().any(|e| e.name == h.name) {
                                assert!(
                                    h.last_used_ms >= last.last_used_ms,
                                    "seed {seed}: not LRU"
                                );
                            }
                        }
                    }
                }
                Err(e) => {
                    assert!(
                        used - evictable > target,
                        "seed {seed}: refused though it could"
                    );
                    assert_eq!(e.evictable, evictable);
                }
            }
        }
    }
}
