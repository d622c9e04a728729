//! `[launch.env]`: the environment every rank gets, refused where the
//! launcher sets a variable itself or where every agent would refuse it
//! ([`xfer_proto::launch_rules`]).

use std::collections::BTreeMap;

use toml::de::DeValue;
use xfer::config::toml_reader::{entries, int_value, Val};
use xfer_proto::launch_rules;

use super::{LaunchError, Parser};

/// Environment variables the launcher sets per node from the cluster file.
const RESERVED_ENV: &[(&str, &str)] = &[
    ("VLLM_HOST_IP", "fabric_ip of each [[node]]"),
    ("SGLANG_HOST_IP", "fabric_ip of each [[node]]"),
    ("NCCL_SOCKET_IFNAME", "fabric_if of each [[node]]"),
    ("GLOO_SOCKET_IFNAME", "fabric_if of each [[node]]"),
    ("NCCL_IB_HCA", "rdma_device of each [[node]]"),
    ("NCCL_IB_GID_INDEX", "gid_index of each [[node]]"),
    (
        "HF_HUB_OFFLINE",
        "the launcher (always 1: the model is already on every node)",
    ),
    (
        "RAY_memory_monitor_refresh_ms",
        "the launcher (always 0 with vllm-ray)",
    ),
];

impl Parser<'_> {
    /// `[launch.env]`: names, values, and what the launcher or every agent
    /// refuses.
    pub(super) fn env(&self, v: &Val) -> Result<BTreeMap<String, String>, LaunchError> {
        let t = self.r.table(
            "env",
            v,
            "write a table of NAME = \"value\", e.g. env = { NCCL_DEBUG = \"INFO\" }",
        )?;
        let mut env = BTreeMap::new();
        for entry in entries(t) {
            let (name, v, at) = (entry.key, entry.value, entry.key_at);
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(self.err(
                    at,
                    format!("env name {name:?} is not a variable name; use letters, digits and '_', not starting with a digit"),
                ));
            }
            if let Some((_, from)) = RESERVED_ENV.iter().find(|(n, _)| *n == name) {
                return Err(self.err(
                    at,
                    format!(
                        "env sets {name}, which xfer-launch sets itself from the {from}; drop it from [launch.env]"
                    ),
                ));
            }
            let value = match v.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(i) => int_value(i).to_string(),
                _ => {
                    let fix = format!("write it as a string, like {name} = \"1\"");
                    return Err(self.r.wrong_kind(&format!("env {name}"), v, &fix).into());
                }
            };
            if value.contains('\0') {
                return Err(self.err(
                    v.span().start,
                    format!("env {name} holds a NUL character, which no environment can carry"),
                ));
            }
            // What every agent refuses too (its check is the boundary).
            launch_rules::check_env(name, &value).map_err(|e| self.err(at, e.to_string()))?;
            env.insert(name.to_string(), value);
        }
        Ok(env)
    }
}
