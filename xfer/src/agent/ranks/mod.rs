//! Ranks: the engine processes an agent starts, watches and stops for the
//! launcher.
//!
//! The launcher sends each node's agent a [`RankSpec`]: the processes of
//! that node's rank (in order, each optionally waiting until an address
//! accepts TCP, e.g. `vllm serve` after `ray start --head`), the
//! environment, and the agents of the other ranks. The agent
//! ([`supervisor`]) starts them in their own process groups with stdout
//! and stderr in one log per rank, and owns them from then on: when one
//! exits on its own, it stops the rest of its rank and tells every other
//! agent of the group to stop theirs, so a group never limps on without a
//! rank, whether or not the launcher is still attached. Stopping is
//! SIGTERM to each process group, SIGKILL after a grace period (SGLang's
//! workers ignore SIGTERM), then the rank's `on_stop` commands (`ray stop`).
//! A report carries facts only (state, exits, the log's size and last
//! lines); the launcher reads the log for the known ways engines hang or
//! die.
//!
//! These types travel in postcard frames, which cannot carry serde's
//! tagged or flattened forms, so they use none.

mod adopt;
mod records;
mod signals;
mod spawn;
pub mod supervisor;

pub use xfer_proto::launch::*;

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::names::NodeName;

    #[test]
    fn run_ids_are_safe_folder_names() {
        for ok in ["a", "run-1", "0123abcd-20261201t031500"] {
            assert!(check_run_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "../x", "A", "a/b", "a b", &"a".repeat(65)] {
            assert!(check_run_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reports_round_trip_through_postcard_and_json() {
        let r = RankReport {
            run: "r1".into(),
            node: NodeName::new("a").unwrap(),
            rank: 1,
            started_unix: 5,
            state: RunState::Failed("x".into()),
            failed_ms: Some(7),
            procs: vec![ProcReport {
                argv: vec!["vllm".into()],
                state: ProcState::Exited {
                    pid: 3,
                    code: Some(17),
                    signal: None,
                },
            }],
            log: "/l".into(),
            log_bytes: 9,
            tail: vec!["t".into()],
        };
        let bytes = postcard::to_stdvec(&r).unwrap();
        assert_eq!(postcard::from_bytes::<RankReport>(&bytes).unwrap(), r);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RankReport>(&json).unwrap(), r);
    }
}
