//! The Slurm job a command runs in, as the cluster file's `[slurm]` table
//! sees it: [`Allocation`] (the job's id and its hosts, from
//! `SLURM_JOB_NODELIST`) and [`expand_hostlist`], which expands Slurm's
//! compressed host lists (`gpu[01-04,07],login1`) the way
//! `scontrol show hostnames` does, so nothing has to call Slurm's tools.
//!
//! The `[slurm]` table itself is read with the rest of the cluster file
//! (`config::cluster`); this module owns only what Slurm hands a job.

use std::path::PathBuf;

/// The most hosts one list may expand to: a typo such as `n[0-99999999]`
/// is refused instead of filling memory (Slurm's own limit is 64 Ki).
pub const MAX_HOSTS: usize = 65_536;

/// The cluster file `--cluster slurm` (or `XFER_CLUSTER=slurm`) names:
/// the one every node of a Slurm cluster shares.
pub const SLURM_CLUSTER_FILE: &str = "/etc/xfer/cluster.toml";

/// The word that, given as `--cluster`, means "the nodes of the Slurm job
/// this runs in, described by [`SLURM_CLUSTER_FILE`]".
pub const SLURM_WORD: &str = "slurm";

/// Why a host list could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    /// Nothing to expand.
    #[error("the host list is empty; Slurm sets SLURM_JOB_NODELIST inside a job (run this inside sbatch, salloc or srun)")]
    Empty,
    /// `[` without its `]`, or `]` without its `[`.
    #[error("host list {0:?} has an unmatched bracket; write ranges as name[1-4,7]")]
    Bracket(String),
    /// Something in brackets that is not `N` or `N-M`.
    #[error("host list {list:?}: {range:?} is not a range; write N or N-M with N <= M, e.g. gpu[01-04,07]")]
    Range {
        /// The whole list.
        list: String,
        /// The bad range.
        range: String,
    },
    /// An empty name between commas.
    #[error("host list {0:?} has an empty name (two commas, or one at an end); remove it")]
    EmptyName(String),
    /// More than [`MAX_HOSTS`].
    #[error("host list {0:?} expands to more than {MAX_HOSTS} hosts; check its ranges")]
    TooMany(String),
}

/// Expands a Slurm host list, in order and keeping repeats, as
/// `scontrol show hostnames` prints it: `gpu[01-03,7],r[1-2]-n[8-9]` is
/// gpu01 gpu02 gpu03 gpu7 r1-n8 r1-n9 r2-n8 r2-n9. A range whose first
/// number has a leading zero pads every number to that width.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let list_trimmed = list.trim();
    if list_trimmed.is_empty() {
        return Err(HostlistError::Empty);
    }
    let mut hosts = Vec::new();
    for item in split_top_level(list_trimmed)? {
        if item.is_empty() {
            return Err(HostlistError::EmptyName(list.to_string()));
        }
        expand_item(list_trimmed, item, &mut hosts)?;
    }
    Ok(hosts)
}

/// Splits at the commas that are outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, HostlistError> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            ']' if depth == 1 => depth = 0,
            '[' | ']' => return Err(HostlistError::Bracket(list.to_string())),
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(HostlistError::Bracket(list.to_string()));
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// One name with any number of bracket groups: the Cartesian product, the
/// first group outermost.
fn expand_item(list: &str, item: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    // Literal text and the choices of each bracket group, alternating.
    let mut parts: Vec<Vec<String>> = Vec::new();
    let mut rest = item;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| HostlistError::Bracket(list.to_string()))?;
        parts.push(vec![rest[..open].to_string()]);
        parts.push(expand_ranges(list, &rest[open + 1..close])?);
        rest = &rest[close + 1..];
    }
    if rest.contains(']') {
        return Err(HostlistError::Bracket(list.to_string()));
    }
    parts.push(vec![rest.to_string()]);
    let mut names = vec![String::new()];
    for choices in &parts {
        if names.len().saturating_mul(choices.len()) + out.len() > MAX_HOSTS {
            return Err(HostlistError::TooMany(list.to_string()));
        }
        names = names
            .iter()
            .flat_map(|n| choices.iter().map(move |c| format!("{n}{c}")))
            .collect();
    }
    out.extend(names);
    Ok(())
}

/// `01-03,7` as `["01", "02", "03", "7"]`.
fn expand_ranges(list: &str, ranges: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let bad = || HostlistError::Range {
            list: list.to_string(),
            range: range.to_string(),
        };
        let (lo_text, hi_text) = range.split_once('-').unwrap_or((range, range));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo_text) || !digits(hi_text) {
            return Err(bad());
        }
        let lo: u64 = lo_text.parse().map_err(|_| bad())?;
        let hi: u64 = hi_text.parse().map_err(|_| bad())?;
        if lo > hi {
            return Err(bad());
        }
        if (hi - lo) as usize >= MAX_HOSTS || out.len() + (hi - lo) as usize >= MAX_HOSTS {
            return Err(HostlistError::TooMany(list.to_string()));
        }
        let width = if lo_text.len() > 1 && lo_text.starts_with('0') {
            lo_text.len()
        } else {
            0
        };
        out.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// The Slurm job this process runs in: what `[slurm]` turns into nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// `SLURM_JOB_ID`, for messages.
    pub job_id: Option<String>,
    /// The job's hosts, expanded, in Slurm's order, without repeats.
    pub hosts: Vec<String>,
    /// The list as Slurm gave it, for messages.
    pub nodelist: String,
}

impl Allocation {
    /// The job this process runs in, from `SLURM_JOB_NODELIST` (or the
    /// older `SLURM_NODELIST`); `Ok(None)` outside a job.
    pub fn from_env() -> Result<Option<Allocation>, HostlistError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let Some(nodelist) = var("SLURM_JOB_NODELIST").or_else(|| var("SLURM_NODELIST")) else {
            return Ok(None);
        };
        Self::new(var("SLURM_JOB_ID"), &nodelist).map(Some)
    }

    /// An allocation of the hosts `nodelist` names.
    pub fn new(job_id: Option<String>, nodelist: &str) -> Result<Allocation, HostlistError> {
        let mut hosts: Vec<String> = Vec::new();
        for h in expand_hostlist(nodelist)? {
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        Ok(Allocation {
            job_id,
            hosts,
            nodelist: nodelist.to_string(),
        })
    }

    /// How messages name the job: `Slurm job 1234 (gpu[01-04])`.
    pub fn describe(&self) -> String {
        match &self.job_id {
            Some(id) => format!("Slurm job {id} ({})", self.nodelist),
            None => format!("the Slurm allocation {}", self.nodelist),
        }
    }
}

/// The cluster file a `--cluster` value names: [`SLURM_WORD`] is
/// [`SLURM_CLUSTER_FILE`]; anything else is a path.
pub fn cluster_path(given: PathBuf) -> PathBuf {
    if given.as_os_str() == SLURM_WORD {
        PathBuf::from(SLURM_CLUSTER_FILE)
    } else {
        given
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand_hostlist(s).unwrap()
    }

    #[test]
    fn lists_expand_as_scontrol_show_hostnames_prints_them() {
        // Each expected line is what `scontrol show hostnames` (Slurm
        // 22.05) printed for the same list.
        assert_eq!(
            ex("gpu[01-03,7],login1,r[1-2]-n[08-10]").join(" "),
            "gpu01 gpu02 gpu03 gpu7 login1 r1-n08 r1-n09 r1-n10 r2-n08 r2-n09 r2-n10"
        );
        assert_eq!(ex("n[1-2],n1").join(" "), "n1 n2 n1");
        assert_eq!(ex("n[001-3]").join(" "), "n001 n002 n003");
        assert_eq!(ex("n[8-11]").join(" "), "n8 n9 n10 n11");
        assert_eq!(ex("single").join(" "), "single");
        assert_eq!(ex(" a , b ").join(" "), "a b");
        assert_eq!(ex("x[0]y").join(" "), "x0y");
    }

    #[test]
    fn a_malformed_list_is_refused_naming_the_fix() {
        for (list, want) in [
            ("", "empty"),
            ("a[1-3", "unmatched bracket"),
            ("a]1", "unmatched bracket"),
            ("a[[1]]", "unmatched bracket"),
            ("a[3-1]", "not a range"),
            ("x[1-3]y[a]", "not a range"),
            ("a[1-]", "not a range"),
            ("a[]", "not a range"),
            ("a,,b", "empty name"),
            ("n[0-99999999]", "more than 65536"),
            ("a[0-999],b[0-999],c[0-99],d[0-999999]", "more than 65536"),
        ] {
            let e = expand_hostlist(list).unwrap_err().to_string();
            assert!(e.contains(want), "{list:?}: {e}");
        }
        // The product of groups is bounded too, before it is built.
        let e = expand_hostlist("a[0-999]b[0-999]").unwrap_err();
        assert!(matches!(e, HostlistError::TooMany(_)), "{e}");
    }

    #[test]
    fn an_allocation_drops_repeats_and_keeps_slurms_order() {
        let a = Allocation::new(Some("42".into()), "n[2-3],n1,n2").unwrap();
        assert_eq!(a.hosts, ["n2", "n3", "n1"]);
        assert_eq!(a.describe(), "Slurm job 42 (n[2-3],n1,n2)");
    }

    #[test]
    fn the_word_slurm_names_the_shared_cluster_file() {
        assert_eq!(
            cluster_path(PathBuf::from("slurm")),
            PathBuf::from(SLURM_CLUSTER_FILE)
        );
        assert_eq!(
            cluster_path(PathBuf::from("c.toml")),
            PathBuf::from("c.toml")
        );
    }
}
