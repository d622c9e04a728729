//! The vLLM loader plugin's own unit tests (`launcher/python/xfer_vllm_loader/tests`),
//! run with the system's `python3`: its wait logic imports no vLLM. What
//! it does inside real vLLM is in `engines.rs`.

use std::path::Path;
use std::process::Command;

#[test]
fn the_loader_plugins_python_unit_tests_pass() {
    let pkg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../launcher/python/xfer_vllm_loader");
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s", "tests"])
        .current_dir(&pkg)
        .env("PYTHONPATH", &pkg)
        .output()
        .expect("python3 runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Every test class ran, the held rank's wait among them, and the
    // attacks of shard names out of the model (issue 53, finding 9).
    for name in [
        "test_shards_come_in_arrival_order_and_only_once_verified",
        "test_a_held_rank_waits_for_the_file_then_goes_on",
        "test_a_rank_never_released_gives_up_naming_the_file",
        "test_an_index_naming_a_path_out_of_the_model_is_refused",
        "test_loader_shard_names_refuses_an_index_naming_a_path_out_of_the_model",
        "test_a_link_in_the_model_folder_leading_out_of_it_is_refused",
        "test_a_hub_snapshots_links_into_its_blobs_are_accepted_and_no_other",
        "test_ready_refuses_a_path_out_of_the_model_whatever_the_agent_says",
    ] {
        assert!(err.contains(name), "{name} did not run: {err}");
    }
}
