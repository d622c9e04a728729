//! `xfer image push` against real Docker: one private `dockerd` per
//! network-namespace host (`tests/common/docker.rs`), test images built
//! locally (no pulls), the layers delivered as blobs through the swarm and
//! loaded by every node's agent into its own engine. Needs root and
//! Docker (`scripts/dockerd.sh install`); each test skips with a note
//! without them.

mod common;

use std::process::Command;
use std::time::Duration;

use common::docker::ImageLab;
use common::*;
use serde_json::Value;

/// The blob entry of `digest` in a push summary.
fn blob<'a>(summary: &'a Value, digest: &str) -> &'a Value {
    summary["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["digest"] == digest)
        .unwrap_or_else(|| panic!("no blob {digest} in {summary}"))
}

#[test]
fn an_image_reaches_three_nodes_runs_there_and_a_shared_layer_is_not_sent_again() {
    // 40 MiB over 400 Mbit/s links: enough chunks, and a link slow enough,
    // for the swarm to matter (a 10 MiB layer at 1 Gbit/s went from the
    // source to two nodes of three).
    let Some(mut lab) = ImageLab::up("img", 3, 400, 40) else {
        return;
    };
    for i in 1..=3 {
        lab.start_agent(i, true, &[]);
    }
    let id = lab.engines[0].image_id("xt/app:1").expect("the test image");
    let r = lab.push("xt/app:1", &[1, 2, 3]);
    r.assert_ok("image push");
    let s: Value = r.json();
    assert_eq!(s["id"], id.as_str());
    for n in s["nodes"].as_array().unwrap() {
        assert_eq!(n["ok"], true, "{n}");
        assert_eq!(n["id"], id.as_str(), "{n}");
    }
    // Every engine holds it under the same id, and a container of it runs.
    for i in 1..=3 {
        let e = &lab.engines[i];
        assert_eq!(
            e.image_id("xt/app:1").as_deref(),
            Some(id.as_str()),
            "host {i}"
        );
        let out = e.run(&[
            "run",
            "--rm",
            "--network",
            "host",
            "xt/app:1",
            "/bin/sh",
            "-c",
            "echo ran on $(hostname)",
        ]);
        assert!(
            out.success() && out.stdout.contains("ran on"),
            "host {i}: {out:?}"
        );
    }
    let total = s["bytes_total"].as_u64().unwrap();
    let sent_x = s["bytes_sent"].as_u64().unwrap() as f64 / total as f64;
    eprintln!("first image to 3 nodes: the source sent {sent_x:.2} x the image");
    assert!(
        sent_x < 1.5,
        "a swarm: the source sends about one copy, not three: {s}"
    );

    // A second image on the same base: the base layer is not sent again.
    let base = lab.engines[0].layers("xt/app:1")[0].clone();
    assert_eq!(
        lab.engines[0].layers("xt/app:2")[0],
        base,
        "the images share their base"
    );
    let r2 = lab.push("xt/app:2", &[1, 2, 3]);
    r2.assert_ok("second image push");
    let s2: Value = r2.json();
    let b = blob(&s2, &base);
    assert_eq!(b["bytes_sent"], 0, "the shared base layer went again: {s2}");
    assert_eq!(
        b["bytes_skipped"].as_u64().unwrap(),
        3 * b["size"].as_u64().unwrap(),
        "every node held it: {s2}"
    );
    assert!(s2["bytes_sent"].as_u64().unwrap() < b["size"].as_u64().unwrap());
    // Nor streamed into the engines, which hold it from xt/app:1: each
    // load carried the config and the new top layer only.
    let top2 = lab.engines[0].layers("xt/app:2")[1].clone();
    let fresh = blob(&s2, &top2)["size"].as_u64().unwrap()
        + blob(&s2, s2["id"].as_str().unwrap())["size"]
            .as_u64()
            .unwrap();
    for n in s2["nodes"].as_array().unwrap() {
        assert_eq!(n["loaded_bytes"].as_u64(), Some(fresh), "{n}");
    }
    let id2 = lab.engines[0].image_id("xt/app:2").unwrap();
    for i in 1..=3 {
        assert_eq!(
            lab.engines[i].image_id("xt/app:2").as_deref(),
            Some(id2.as_str())
        );
    }

    // The same image again: nothing is saved or sent, and it stays loaded.
    let s3: Value = lab.push("xt/app:1", &[1, 2, 3]).json();
    assert_eq!(s3["cached"], true, "{s3}");
    assert_eq!(s3["bytes_sent"], 0, "{s3}");

    // `xfer status` shows the images beside the models.
    let cluster_file = lab.tmp.path().join("cluster.toml");
    let mut toml = format!("key = \"{}\"\n", lab.key.display());
    for i in 1..=3 {
        toml.push_str(&format!(
            "\n[[node]]\nname = \"h{i}\"\nagent = \"{}:7470\"\nroot = \"{}\"\n",
            lab.c.ip(i),
            lab.root(i).display()
        ));
    }
    std::fs::write(&cluster_file, toml).unwrap();
    let st = run(
        lab.c
            .xfer(0)
            .args(["status", "--cluster"])
            .arg(&cluster_file),
        Duration::from_secs(60),
    );
    st.assert_ok("status");
    for i in 1..=3 {
        for (image, id) in [("xt/app:1", &id), ("xt/app:2", &id2)] {
            let line = st
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("h{i} ")) && l.contains(image))
                .unwrap_or_else(|| panic!("no {image} on h{i}: {}", st.stdout));
            assert!(
                line.contains(&id[7..19]) && line.contains("loaded"),
                "{line}"
            );
        }
    }
    assert!(
        !st.stdout.contains(&format!("sha256-{}", &base[7..])),
        "complete blobs show as their images, not as models: {}",
        st.stdout
    );
}

#[test]
fn a_killed_push_resumes_and_a_flipped_byte_in_the_cache_is_rebuilt() {
    // 48 MiB over 200 Mbit/s: about two seconds on the wire.
    let Some(mut lab) = ImageLab::up("imk", 2, 200, 48) else {
        return;
    };
    lab.start_agent(1, true, &[]);
    lab.start_agent(2, true, &[]);
    let id = lab.engines[0].image_id("xt/app:1").unwrap();
    let base = lab.engines[0].layers("xt/app:1")[0].clone();
    let base_model = format!("sha256-{}", &base[7..]);

    // kill -9 once host 1 holds part of the base layer.
    let p = Proc::spawn(&mut lab.push_cmd("xt/app:1", &[1]));
    let journal = lab
        .root(1)
        .join(".xfer/staging")
        .join(&base_model)
        .join("journal");
    // The operator's blob of the base layer is saved before any of it is
    // sent: its manifest reads the node's journal (chunk records, not the
    // header or a sync mark).
    let blob_dir = lab.cache.join(&base_model);
    wait_until("the base layer saved", Duration::from_secs(120), || {
        blob_dir.join("blob").exists()
    });
    let manifest = scan(&blob_dir, MIB);
    wait_until(
        "4 MiB of the base layer on host 1",
        Duration::from_secs(120),
        || journal_held_bytes(&journal, &manifest) >= 4 * MIB,
    );
    let first = p.kill9();
    assert!(!first.success());
    let held = journal_held_bytes(&journal, &manifest);
    assert!(
        held < manifest.total_bytes(),
        "the push ended before the kill"
    );
    let r = lab.push("xt/app:1", &[1]);
    r.assert_ok("the re-run");
    let s: Value = r.json();
    let b = blob(&s, &base);
    assert!(
        b["bytes_skipped"].as_u64().unwrap() >= held,
        "the re-run resumed less than the {held} bytes host 1 journaled: {s}"
    );
    assert_eq!(
        lab.engines[1].image_id("xt/app:1").as_deref(),
        Some(id.as_str())
    );

    // A byte flipped in the operator's copy of the top layer (issue 30):
    // the next push re-checks the blob whose stamp changed against its
    // sha256, says so in one line, saves the image again and delivers
    // the right bytes; the damaged copy never leaves the operator.
    let top = lab.engines[0].layers("xt/app:1")[1].clone();
    let blob_file = lab.cache.join(format!("sha256-{}", &top[7..])).join("blob");
    let mut bytes = std::fs::read(&blob_file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&blob_file, &bytes).unwrap();
    let again = lab.push("xt/app:1", &[2]);
    again.assert_ok("a push after the operator's cache was damaged");
    assert!(
        again.stderr.contains(&top[..19])
            && again.stderr.contains("no longer hashes to its digest")
            && again.stderr.contains("saving the image again"),
        "{again:?}"
    );
    assert_eq!(
        lab.engines[2].image_id("xt/app:1").as_deref(),
        Some(id.as_str())
    );
    bytes[mid] ^= 0x20;
    assert_eq!(
        std::fs::read(&blob_file).unwrap(),
        bytes,
        "rebuilt from the engine"
    );
}

#[test]
fn bad_inputs_get_one_line_with_the_cause_and_the_fix() {
    let Some(mut lab) = ImageLab::up("imb", 2, 1000, 8) else {
        return;
    };
    // Host 1 has no engine switched on; host 2's engine has a tiny disk.
    lab.start_agent(1, false, &[]);
    let small = lab.tmp.path().join("small");
    let disk = SmallDisk::mount(&small, 24).expect("a small disk");
    let ns = format!("{}-h2", lab.c.prefix);
    lab.engines[2] = common::docker::Dockerd::start(&disk.dir.join("docker"), Some(&ns))
        .expect("a dockerd on the small disk");
    lab.start_agent(2, true, &[]);

    let missing = lab.push("xt/nothing:1", &[2]);
    assert!(!missing.success());
    assert!(
        missing.stderr.contains("does not exist locally")
            && missing.stderr.contains("build or pull it"),
        "{missing:?}"
    );

    let off = lab.push("xt/app:1", &[1]);
    assert!(!off.success());
    assert!(off.stderr.contains("--container-engine docker"), "{off:?}");

    // 8 MiB base plus the rest: docker load needs room for it twice
    // (the tar and the layer); 24 MiB of ext4 holds the blobs, not that.
    let big = lab.push("xt/standin:1", &[2]);
    assert!(!big.success(), "{big:?}");
    assert!(
        big.stderr.contains("disk is full") && big.stderr.contains("free space"),
        "{big:?}"
    );
    // The engine goes before its disk.
    lab.agents[2] = None;
    lab.engines.pop();
    drop(disk);
}

/// `xfer image pull` from a registry (Debian's distribution server, in the
/// operator's namespace, the test images pushed into it by skopeo, which
/// compresses their layers): three nodes load it with the registry's id and
/// run it; the registry serves each blob about once; a second image on the
/// same base does not fetch the base again; a multi-platform index gives
/// each node its own platform (one node's agent says it is arm64).
#[test]
fn an_image_pulled_once_from_a_registry_runs_on_three_nodes() {
    use common::docker::{skopeo_push, RegistryServer};
    let Some(mut lab) = ImageLab::up("reg", 3, 400, 16) else {
        return;
    };
    for i in 1..=2 {
        lab.start_agent(i, true, &[]);
    }
    // Host 3's agent pulls images for arm64 (its engine loads any).
    lab.start_agent_env(3, &[("XFER_PLATFORM", "linux/arm64")]);
    let ns0 = format!("{}-h0", lab.c.prefix);
    let reg = RegistryServer::start(
        &lab.tmp.path().join("registry"),
        &ns0,
        &lab.c.ip(0),
        5000,
        None,
    );
    let sock = lab.engines[0].sock.clone();
    for tag in ["1", "2"] {
        skopeo_push(
            &ns0,
            &sock,
            &format!("xt/app:{tag}"),
            &format!("docker://{}/xt/app:{tag}", reg.addr),
            None,
            None,
        );
    }
    let pull_on = |on: u32, reference: &str, hosts: &[u32], more: &[&str]| {
        let to: Vec<String> = hosts
            .iter()
            .map(|i| format!("{}:7470", lab.c.ip(*i)))
            .collect();
        let mut cmd = lab.c.xfer(on);
        cmd.args(["image", "pull", reference, "--insecure", "--json", "--to"])
            .arg(to.join(","))
            .arg("--key")
            .arg(&lab.key)
            .arg("--cache")
            .arg(lab.tmp.path().join("pull-cache"))
            .args(more);
        run(&mut cmd, Duration::from_secs(300))
    };
    let pull = |reference: &str, hosts: &[u32], more: &[&str]| pull_on(0, reference, hosts, more);
    let id1 = lab.engines[0].image_id("xt/app:1").unwrap();
    let name1 = format!("{}/xt/app:1", reg.addr);
    // Run on host 1, itself a destination: its own agent gets every
    // layer from here, not from its peers over the link the registry's
    // bytes come in on.
    let r = pull_on(1, &name1, &[1, 2], &[]);
    r.assert_ok("image pull");
    let s: Value = r.json();
    let here = format!("{}:7470", lab.c.ip(1));
    let node1 = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == here.as_str())
        .unwrap_or_else(|| panic!("no {here}: {s}"));
    // (The config, a push of its own after the layers, may come from a
    // peer.)
    let config = blob(&s, s["id"].as_str().unwrap())["size"]
        .as_u64()
        .unwrap();
    assert!(
        node1["from_peers"].as_u64().unwrap() <= config,
        "host 1 took layers from its peers: {s}"
    );
    assert_eq!(
        s["id"],
        id1.as_str(),
        "the registry's config is the image's id: {s}"
    );
    for i in 1..=2 {
        let e = &lab.engines[i];
        assert_eq!(
            e.image_id(&name1).as_deref(),
            Some(id1.as_str()),
            "host {i}"
        );
        let out = e.run(&[
            "run",
            "--rm",
            "--network",
            "host",
            &name1,
            "/bin/sh",
            "-c",
            "echo ran",
        ]);
        assert!(
            out.success() && out.stdout.contains("ran"),
            "host {i}: {out:?}"
        );
    }
    // skopeo compressed the layers: the nodes loaded gzip blobs, whose
    // digests are not the engine's diff_ids.
    let diff_ids = lab.engines[0].layers("xt/app:1");
    assert!(
        s["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["digest"] != id1.as_str())
            .all(|b| !diff_ids.contains(&b["digest"].as_str().unwrap().to_string())),
        "the registry's layers are compressed: {s}"
    );
    // The registry served the image about once (its blobs are compressed).
    let total = s["bytes_total"].as_u64().unwrap();
    // The registry logs each answer as it ends: wait for the last line.
    let fetched = s["registry"]["bytes_fetched"].as_u64().unwrap();
    wait_until("the registry to log what it served", HANG, || {
        let served = reg.blob_bytes(None);
        if served >= fetched {
            Ok(())
        } else {
            Err(format!("{served} bytes logged, {fetched} fetched"))
        }
    });
    let served = reg.blob_bytes(None);
    eprintln!("registry egress: {served} bytes for a {total}-byte image to 2 nodes");
    assert!(
        served as f64 <= 1.05 * total as f64,
        "the registry served {served} bytes of a {total}-byte image"
    );
    assert_eq!(fetched, served, "{s}");
    // Each layer streamed while it downloaded, and the push after each
    // stream moved nothing more: the nodes got the image about once each.
    let sent = s["bytes_sent"].as_u64().unwrap();
    assert!(
        sent as f64 <= 1.1 * 2.0 * total as f64,
        "{sent} bytes sent for a {total}-byte image to 2 nodes: {s}"
    );

    // xt/app:2 shares the base layer: the registry does not serve it again.
    let name2 = format!("{}/xt/app:2", reg.addr);
    let before = reg.blob_bytes(None);
    let r2 = pull(&name2, &[1, 2], &[]);
    r2.assert_ok("second image pull");
    let s2: Value = r2.json();
    let base = s2["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|b| b["size"].as_u64())
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(s["blobs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["digest"] == base.as_str()));
    let fetched2 = s2["registry"]["bytes_fetched"].as_u64().unwrap();
    wait_until("the registry to log what it served again", HANG, || {
        let served = reg.blob_bytes(None);
        if served >= before + fetched2 {
            Ok(())
        } else {
            Err(format!(
                "{served} bytes logged, {before} before + {fetched2} fetched"
            ))
        }
    });
    let again = reg.blob_bytes(None) - before;
    let base_size = blob(&s2, &base)["size"].as_u64().unwrap();
    assert!(
        again < base_size,
        "the shared base ({base_size} bytes) came from the registry again: {again} bytes"
    );
    assert_eq!(
        blob(&s2, &base)["bytes_sent"],
        0,
        "nor went to the nodes again: {s2}"
    );

    // A multi-platform index: xt/app:1 for amd64, xt/app:2 for arm64.
    let m1 = manifest_of(&ns0, &reg.addr, "xt/app", "1");
    let m2 = manifest_of(&ns0, &reg.addr, "xt/app", "2");
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": m1.0, "digest": m1.1, "size": m1.2, "platform": {"os": "linux", "architecture": "amd64"}},
            {"mediaType": m2.0, "digest": m2.1, "size": m2.2, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        ]
    });
    let put = Command::new("ip")
        .args(["netns", "exec", &ns0, "curl", "-sf", "-X", "PUT", "-H"])
        .arg("content-type: application/vnd.oci.image.index.v1+json")
        .arg("--data-binary")
        .arg(index.to_string())
        .arg(format!("http://{}/v2/xt/app/manifests/multi", reg.addr))
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let multi = format!("{}/xt/app:multi", reg.addr);
    let r3 = pull(&multi, &[1, 3], &[]);
    r3.assert_ok("multi-platform pull");
    let s3: Value = r3.json();
    let ids: Vec<&str> = s3["platforms"]
        .as_array()
        .unwrap_or_else(|| panic!("one pull per platform: {s3}"))
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    let id2 = lab.engines[0].image_id("xt/app:2").unwrap();
    assert_eq!(ids, [id1.as_str(), id2.as_str()], "{s3}");
    assert_eq!(
        lab.engines[1].image_id(&multi).as_deref(),
        Some(id1.as_str())
    );
    assert_eq!(
        lab.engines[3].image_id(&multi).as_deref(),
        Some(id2.as_str()),
        "the arm64 node"
    );

    // Bad input, one line each: no such tag; no image for the platform.
    let r = pull(&format!("{}/xt/app:nope", reg.addr), &[1], &[]);
    assert!(!r.success());
    assert!(
        r.stderr.contains("has no manifest of") && r.stderr.contains("check the name and tag"),
        "{}",
        r.stderr
    );
    let r = pull(&multi, &[1], &["--platform", "linux/s390x"]);
    assert!(!r.success());
    assert!(
        r.stderr
            .contains("has no image for linux/s390x (it has linux/amd64, linux/arm64/v8)"),
        "{}",
        r.stderr
    );
}

/// (media type, digest, size) of `repo:tag`'s manifest in the registry.
fn manifest_of(ns: &str, addr: &str, repo: &str, tag: &str) -> (String, String, u64) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sfI", "-H"])
        .arg("accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
        .arg(format!("http://{addr}/v2/{repo}/manifests/{tag}"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let get = |k: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}: ")))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {k} in {head}"))
    };
    (
        get("content-type"),
        get("docker-content-digest"),
        get("content-length").parse().unwrap(),
    )
}

/// A registry behind TLS from a test CA and a password: without
/// credentials, with a wrong password, or without the CA, the pull fails
/// in one line naming the fix; with `XFER_REGISTRY_USERNAME`/`PASSWORD`,
/// or docker's `config.json`, and `--ca-file`, it loads on the node.
#[test]
fn a_registry_with_a_password_and_a_private_ca_is_pulled_with_its_credentials() {
    use common::docker::{skopeo_push, RegistryServer};
    let Some(mut lab) = ImageLab::up("rga", 1, 1000, 4) else {
        return;
    };
    lab.start_agent(1, true, &[]);
    let ns0 = format!("{}-h0", lab.c.prefix);
    let reg = RegistryServer::start(
        &lab.tmp.path().join("registry"),
        &ns0,
        &lab.c.ip(0),
        5443,
        Some(("alice", "s3cret")),
    );
    let ca = reg.ca.clone().unwrap();
    skopeo_push(
        &ns0,
        &lab.engines[0].sock,
        "xt/app:1",
        &format!("docker://{}/xt/app:1", reg.addr),
        Some("alice:s3cret"),
        Some(&ca),
    );
    let name = format!("{}/xt/app:1", reg.addr);
    let pull = |env: &[(&str, &str)], more: &[&str]| {
        let mut cmd = lab.c.xfer(0);
        cmd.env_remove("XFER_REGISTRY_USERNAME")
            .env_remove("XFER_REGISTRY_PASSWORD")
            .env("DOCKER_CONFIG", lab.tmp.path().join("no-docker-config"))
            .envs(env.iter().copied())
            .args(["image", "pull", &name, "--json", "--to"])
            .arg(format!("{}:7470", lab.c.ip(1)))
            .arg("--key")
            .arg(&lab.key)
            .arg("--cache")
            .arg(lab.tmp.path().join("pull-cache"))
            .args(more);
        run(&mut cmd, Duration::from_secs(300))
    };
    let ca_arg = ["--ca-file", ca.to_str().unwrap()];
    let one_line = |r: &Run, words: &[&str]| {
        assert!(!r.success(), "{r:?}");
        let last = r
            .stderr
            .trim()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        for w in words {
            assert!(last.contains(w), "`{w}` not in: {}", r.stderr);
        }
    };
    // No CA: the certificate is not trusted, and --ca-file is the fix.
    one_line(
        &pull(&[], &[]),
        &["TLS certificate is not trusted", "--ca-file"],
    );
    // No credentials, then a wrong password: `docker login` is the fix.
    one_line(
        &pull(&[], &ca_arg),
        &["asks for a user name and password", "docker login"],
    );
    let wrong = [
        ("XFER_REGISTRY_USERNAME", "alice"),
        ("XFER_REGISTRY_PASSWORD", "nope"),
    ];
    one_line(&pull(&wrong, &ca_arg), &["HTTP 401", "docker login"]);
    assert!(lab.engines[1].image_id(&name).is_none(), "nothing loaded");
    // The right password from the environment.
    let right = [
        ("XFER_REGISTRY_USERNAME", "alice"),
        ("XFER_REGISTRY_PASSWORD", "s3cret"),
    ];
    let r = pull(&right, &ca_arg);
    r.assert_ok("pull with credentials");
    let id = lab.engines[0].image_id("xt/app:1").unwrap();
    assert_eq!(lab.engines[1].image_id(&name).as_deref(), Some(id.as_str()));
    // And from docker's config.json, as `docker login` writes it.
    let cfg = lab.tmp.path().join("docker-config");
    std::fs::create_dir_all(&cfg).unwrap();
    let auth = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("alice:s3cret")
    };
    std::fs::write(
        cfg.join("config.json"),
        format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, reg.addr),
    )
    .unwrap();
    assert!(lab.engines[1].run(&["rmi", &name]).success());
    std::fs::remove_dir_all(lab.tmp.path().join("pull-cache")).unwrap();
    let r = pull(&[("DOCKER_CONFIG", cfg.to_str().unwrap())], &ca_arg);
    r.assert_ok("pull with docker's config");
    assert_eq!(lab.engines[1].image_id(&name).as_deref(), Some(id.as_str()));
}

/// A registry (behind a front that needs a password and sends blobs to a
/// "CDN" on another port) that serves the largest layer corrupted once,
/// then cut half-way once: the corrupt copy is caught by its digest and
/// fetched again, the cut one resumes with a range request, the node loads
/// the right image, and the CDN never sees the registry's credentials.
#[test]
fn a_corrupt_or_cut_blob_is_fetched_again_and_credentials_stay_with_the_registry() {
    let Some((lab, reg)) = one_node_and_a_registry("rgf") else {
        return;
    };
    let (ns0, ip0) = (format!("{}-h0", lab.c.prefix), lab.c.ip(0));
    let (big, _) = biggest_layer(&ns0, &reg.addr);
    let (mut proxy, port) = front(
        &ns0,
        &ip0,
        &reg.addr,
        &[
            format!("corrupt-once:{big}"),
            format!("cut-once:{big}"),
            "basic:bob:pw".to_string(),
        ],
        true,
    );
    let front = format!("{ip0}:{port}");
    let name = format!("{front}/xt/app:1");
    let mut cmd = lab.c.xfer(0);
    cmd.env("XFER_REGISTRY_USERNAME", "bob")
        .env("XFER_REGISTRY_PASSWORD", "pw")
        .args(["image", "pull", &name, "--insecure", "--json", "--to"])
        .arg(format!("{}:7470", lab.c.ip(1)))
        .arg("--key")
        .arg(&lab.key)
        .arg("--cache")
        .arg(lab.tmp.path().join("pull-cache"));
    let r = run(&mut cmd, Duration::from_secs(300));
    let seen = Command::new("ip")
        .args(["netns", "exec", &ns0, "curl", "-sf"])
        .arg(format!("http://{front}/_seen"))
        .output()
        .unwrap();
    let _ = proxy.kill();
    let _ = proxy.wait();
    r.assert_ok("pull through a faulty front");
    let s: Value = r.json();
    let id = lab.engines[0].image_id("xt/app:1").unwrap();
    assert_eq!(lab.engines[1].image_id(&name).as_deref(), Some(id.as_str()));
    let seen: Value = serde_json::from_slice(&seen.stdout).unwrap();
    assert_eq!(
        seen["cdn_auth"],
        serde_json::json!([]),
        "the CDN got credentials: {seen}"
    );
    // The big layer: whole and corrupt, half, then the other half.
    let size = blob(&s, &big)["size"].as_u64().unwrap();
    let fetched = s["registry"]["bytes_fetched"].as_u64().unwrap();
    assert!(
        fetched >= 2 * size && fetched < 2 * size + size / 2 + (1 << 20),
        "{fetched} bytes fetched for a {size}-byte layer ({big}) fetched 1 + 1/2 + 1/2 times: {s}; the front saw {seen}; {}",
        r.stderr
    );
}

/// `kill -9` of `xfer image pull` while the registry is half-way through
/// the largest layer (the front holds the rest), once the node holds
/// verified chunks of that layer (it streams while it downloads): the
/// same command again fetches only what is missing (the cache keeps the
/// verified blobs and the partial one), and the node loads the image.
#[test]
fn a_pull_killed_mid_layer_resumes_from_what_it_fetched() {
    let Some((lab, reg)) = one_node_and_a_registry("rgk") else {
        return;
    };
    let (ns0, ip0) = (format!("{}-h0", lab.c.prefix), lab.c.ip(0));
    let (big, size) = biggest_layer(&ns0, &reg.addr);
    let gate = lab.tmp.path().join("release");
    let (mut proxy, port) = front(
        &ns0,
        &ip0,
        &reg.addr,
        &[format!("hold-once:{big}:{}", gate.display())],
        false,
    );
    let name = format!("{ip0}:{port}/xt/app:1");
    let cache = lab.tmp.path().join("pull-cache");
    let cmd = || {
        let mut c = lab.c.xfer(0);
        c.args(["image", "pull", &name, "--insecure", "--json", "--to"])
            .arg(format!("{}:7470", lab.c.ip(1)))
            .arg("--key")
            .arg(&lab.key)
            .arg("--cache")
            .arg(&cache);
        c
    };
    let mut first = cmd()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once half the layer is in its partial file, and the node
    // holds verified chunks of it: the layer streams while it downloads.
    let part = cache
        .join(".incoming")
        .join(format!("sha256-{}.part", &big[7..]));
    let held = || held_on_node(&lab, 1, &format!("sha256-{}", &big[7..]));
    wait_until(
        &format!("the pull to reach the hold with chunks of {big} on the node"),
        HANG,
        || {
            assert!(
                first.try_wait().unwrap().is_none(),
                "the pull ended before the hold"
            );
            let (part_len, on_node) = (std::fs::metadata(&part).map_or(0, |m| m.len()), held());
            if part_len >= size / 2 && on_node > 0 {
                Ok(())
            } else {
                Err(format!(
                    "partial file {part_len} bytes, node holds {on_node} bytes"
                ))
            }
        },
    );
    let streamed = held();
    assert!(
        streamed > 0 && streamed <= size / 2 + (4 << 20),
        "the node holds {streamed} bytes of the {size}-byte layer while half is fetched"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    std::fs::write(&gate, b"").unwrap();
    let r = run(&mut cmd(), Duration::from_secs(300));
    let _ = proxy.kill();
    let _ = proxy.wait();
    r.assert_ok("the pull again");
    let s: Value = r.json();
    let id = lab.engines[0].image_id("xt/app:1").unwrap();
    assert_eq!(lab.engines[1].image_id(&name).as_deref(), Some(id.as_str()));
    let fetched = s["registry"]["bytes_fetched"].as_u64().unwrap();
    assert!(
        fetched <= size / 2 + (2 << 20),
        "the rerun fetched {fetched} bytes; half of the {size}-byte layer was in already: {s}"
    );
}

/// Podman, for real: an image pulled from the registry to a node whose
/// agent runs `--container-engine podman` (podman's own storage for that
/// node, no daemon) loads there with the config's digest as its id, and a
/// container runs from it with the command line the agent builds for a
/// rank. Podman's default limits (nofile 1048576, nproc 4194304) exceed
/// this host's hard limits; the agent's `--ulimit`s at its own limits are
/// what let the container start.
#[test]
fn an_image_pulled_from_a_registry_loads_and_runs_under_podman() {
    assert!(
        Command::new("podman")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "podman is not installed: scripts/test.sh installs it (apt-get install podman catatonit)"
    );
    let Some((mut lab, reg)) = one_node_and_a_registry("rgp") else {
        return;
    };
    let ns1 = format!("{}-h1", lab.c.prefix);
    let env = lab.start_agent_podman(1, &lab.tmp.path().join("podman1"));
    let name = format!("{}/xt/app:1", reg.addr);
    let r = run(
        lab.c
            .xfer(0)
            .args(["image", "pull", &name, "--insecure", "--json", "--to"])
            .arg(format!("{}:7470", lab.c.ip(1)))
            .arg("--key")
            .arg(&lab.key)
            .arg("--cache")
            .arg(lab.tmp.path().join("pull-cache")),
        Duration::from_secs(300),
    );
    r.assert_ok("image pull to a podman node");
    let s: Value = r.json();
    let id = s["id"].as_str().unwrap().to_string();
    assert_eq!(s["nodes"][0]["id"].as_str(), Some(id.as_str()), "{s}");
    // In host 1's network, with the host's mounts (`ip netns exec`
    // remounts /sys without the cgroup mounts podman's runtime needs).
    let podman = |args: &[&str]| {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{ns1}"))
            .arg("podman")
            .args(args);
        for (k, v) in &env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let inspect = podman(&["image", "inspect", "--format", "{{.Id}}", &name]);
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    assert_eq!(
        format!("sha256:{}", String::from_utf8_lossy(&inspect.stdout).trim()),
        id,
        "podman's id of the loaded image"
    );
    // A rank's command line, as the agent builds it for podman.
    let spec = xfer_proto::launch::RankSpec {
        run: "pod1".into(),
        node: xfer_proto::names::NodeName::new("h1").unwrap(),
        rank: 0,
        env: Default::default(),
        procs: vec![xfer_proto::launch::ProcSpec {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo ran in $(cat /etc/hostname)".into(),
            ],
            wait_tcp: None,
        }],
        on_stop: vec![],
        group: vec![],
        wait_timeout_ms: 1,
        grace_ms: 1,
        weights: None,
        evict_page_cache: false,
        container: None,
        caches: None,
        held: false,
        rendezvous: None,
    };
    let c = xfer_proto::launch::ContainerSpec {
        image: name.clone(),
        image_id: None,
        gpus: xfer_proto::launch::GpuAccess::None,
        shm_bytes: None,
    };
    let engine = xfer::image::runtime::Runtime::new(xfer_proto::image::ContainerRuntime::Podman);
    let wrapped = xfer::agent::containers::wrap(spec, &c, engine, &lab.root(1)).unwrap();
    let argv = &wrapped.procs[0].argv;
    assert!(argv.iter().any(|a| a == "--ulimit"), "{argv:?}");
    let ran = podman(&argv[1..].iter().map(String::as_str).collect::<Vec<_>>());
    let (out, err) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr),
    );
    assert!(
        ran.status.success() && out.contains("ran in"),
        "podman {argv:?}: {out}{err}"
    );
}

/// The bytes node `i`'s agent holds verified of model `name` (0 when it
/// does not list it), by `xfer status --json` from the operator's host.
fn held_on_node(lab: &ImageLab, i: u32, name: &str) -> u64 {
    let file = lab.tmp.path().join(format!("status-{i}.toml"));
    std::fs::write(
        &file,
        format!(
            "key = \"{}\"\n\n[[node]]\nname = \"h{i}\"\nagent = \"{}:7470\"\nroot = \"{}\"\n",
            lab.key.display(),
            lab.c.ip(i),
            lab.root(i).display()
        ),
    )
    .unwrap();
    let r = run(
        lab.c
            .xfer(0)
            .args(["status", "--json", "--cluster"])
            .arg(&file),
        Duration::from_secs(20),
    );
    let Ok(v) = serde_json::from_str::<Value>(&r.stdout) else {
        return 0;
    };
    v[0]["status"]["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .and_then(|m| m["bytes_held"].as_u64())
        .unwrap_or(0)
}

/// One node with its engine and agent, and a registry in the operator's
/// namespace holding `xt/app:1` (skopeo-pushed, gzip layers).
fn one_node_and_a_registry(tag: &str) -> Option<(ImageLab, common::docker::RegistryServer)> {
    use common::docker::{skopeo_push, RegistryServer};
    let mut lab = ImageLab::up(tag, 1, 1000, 8)?;
    lab.start_agent(1, true, &[]);
    let ns0 = format!("{}-h0", lab.c.prefix);
    let reg = RegistryServer::start(
        &lab.tmp.path().join("registry"),
        &ns0,
        &lab.c.ip(0),
        5000,
        None,
    );
    skopeo_push(
        &ns0,
        &lab.engines[0].sock,
        "xt/app:1",
        &format!("docker://{}/xt/app:1", reg.addr),
        None,
        None,
    );
    Some((lab, reg))
}

/// The digest and size of `xt/app:1`'s largest layer in the registry.
fn biggest_layer(ns: &str, addr: &str) -> (String, u64) {
    let manifest = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sf", "-H"])
        .arg("accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
        .arg(format!("http://{addr}/v2/xt/app/manifests/1"))
        .output()
        .unwrap();
    let manifest: Value = serde_json::from_slice(&manifest.stdout).unwrap();
    let big = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .max_by_key(|l| l["size"].as_u64())
        .unwrap();
    (
        big["digest"].as_str().unwrap().to_string(),
        big["size"].as_u64().unwrap(),
    )
}

/// `tests/registry_proxy.py` in front of the registry at `upstream`, in
/// `ns` on `ip`, with these faults (and the CDN redirect): the child and
/// its port.
fn front(
    ns: &str,
    ip: &str,
    upstream: &str,
    faults: &[String],
    cdn: bool,
) -> (std::process::Child, String) {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "python3"])
        .arg(common::hub::workspace_root().join("tests/registry_proxy.py"))
        .args(["--host", ip, "--upstream", upstream]);
    if cdn {
        c.arg("--cdn");
    }
    for f in faults {
        c.arg("--fault").arg(f);
    }
    let mut proxy = c.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(proxy.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line
        .split_whitespace()
        .nth(1)
        .expect("READY PORT CDN")
        .to_string();
    (proxy, port)
}
