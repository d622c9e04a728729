//! Credentials: simple-mode keys, issued ones, and which handshakes they
//! allow, driven through real rustls connections in memory.

use super::ca::CaDir;
use super::*;
use rustls::pki_types::ServerName;
use xfer_proto::names::NodeName;

fn node(name: &str, role: Role) -> Identity {
    Identity {
        name: NodeName::new(name).unwrap(),
        role,
    }
}

/// Issues `name` from `ca` into `dir/name.cred` and loads it.
fn issue(ca: &CaDir, dir: &Path, name: &str, role: Role) -> Credential {
    let out = dir.join(format!("{name}.cred"));
    ca.issue(&node(name, role), 30, &out, true).unwrap();
    Credential::load(&out).unwrap()
}

/// A full TLS 1.3 handshake in memory: what each side learned of the
/// other, or the first error.
fn handshake(client: &Credential, server: &Credential) -> Result<(Peer, Peer), String> {
    let name = ServerName::try_from(SERVER_NAME).unwrap();
    let mut c = rustls::ClientConnection::new(Arc::new(client.client_config().unwrap()), name)
        .map_err(|e| e.to_string())?;
    let mut s = rustls::ServerConnection::new(Arc::new(server.server_config().unwrap()))
        .map_err(|e| e.to_string())?;
    for _ in 0..10 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        s.read_tls(&mut &buf[..]).unwrap();
        s.process_new_packets()
            .map_err(|e| format!("server: {e}"))?;
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        c.read_tls(&mut &buf[..]).unwrap();
        c.process_new_packets()
            .map_err(|e| format!("client: {e}"))?;
        if !c.is_handshaking() && !s.is_handshaking() {
            let at_server = server
                .peer(s.peer_certificates().and_then(|v| v.first()))
                .map_err(|e| e.to_string())?;
            let at_client = client
                .peer(c.peer_certificates().and_then(|v| v.first()))
                .map_err(|e| e.to_string())?;
            return Ok((at_server, at_client));
        }
    }
    Err("the handshake did not finish".into())
}

#[test]
fn keygen_then_load_gives_the_same_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k");
    let a = keygen(&p, false).unwrap();
    assert!(keygen(&p, false).is_err(), "must not overwrite silently");
    let b = Credential::load(&p).unwrap();
    assert_eq!(a.cluster_id(), b.cluster_id());
    assert_eq!(
        fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        handshake(&a, &b).unwrap(),
        (Peer::ClusterKey, Peer::ClusterKey)
    );
}

#[test]
fn junk_keys_are_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k");
    fs::write(&p, "hello").unwrap();
    let e = format!("{:#}", Credential::load(&p).unwrap_err());
    assert!(e.contains("xfer ca issue"), "{e}");
    let e = format!(
        "{:#}",
        Credential::load(&dir.path().join("missing")).unwrap_err()
    );
    // Per-node credentials are the normal mode: the fix names `xfer ca
    // issue`, not simple mode's shared key.
    assert!(
        e.contains("xfer ca issue") && !e.contains("xfer keygen"),
        "{e}"
    );
}

#[test]
fn issued_credentials_name_their_holder_to_the_other_end() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(&dir.path().join("ca"));
    let id = ca.init(false).unwrap();
    assert!(
        ca.init(false).is_err(),
        "a second init must not replace the CA"
    );
    let a = issue(&ca, dir.path(), "a", Role::Node);
    let op = issue(&ca, dir.path(), "alice", Role::Operator);
    assert_eq!(a.cluster_id(), id);
    assert_eq!(op.cluster_id(), id);
    let (at_server, at_client) = handshake(&op, &a).unwrap();
    assert_eq!(at_server, Peer::Issued(node("alice", Role::Operator)));
    assert!(at_server.is_operator());
    assert_eq!(at_client, Peer::Issued(node("a", Role::Node)));
    let b = issue(&ca, dir.path(), "b", Role::Node);
    let (at_server, _) = handshake(&b, &a).unwrap();
    assert!(!at_server.is_operator(), "a node is not an operator");
    // The node file holds no CA key: nothing in it can sign.
    let text = fs::read_to_string(dir.path().join("a.cred")).unwrap();
    assert_eq!(text.matches("PRIVATE KEY-----").count(), 2, "{text}");
    assert_eq!(
        fs::metadata(dir.path().join("ca/ca.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

#[test]
fn a_client_checks_which_node_answered() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(&dir.path().join("ca"));
    ca.init(false).unwrap();
    let a = issue(&ca, dir.path(), "a", Role::Node);
    let op = issue(&ca, dir.path(), "op", Role::Operator);
    let leaf = |c: &Credential| c.live.now().certified.cert[0].clone();
    op.check_node(Some(&leaf(&a)), "a").unwrap();
    let e = op.check_node(Some(&leaf(&a)), "b").unwrap_err().to_string();
    assert!(e.contains("answered for b is node a"), "{e}");
    let e = op
        .check_node(Some(&leaf(&op)), "a")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not of a node"), "{e}");
}

#[test]
fn other_clusters_and_the_simple_key_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let one = CaDir::new(&dir.path().join("one"));
    let two = CaDir::new(&dir.path().join("two"));
    one.init(false).unwrap();
    two.init(false).unwrap();
    let a = issue(&one, dir.path(), "a", Role::Node);
    let b = issue(&two, dir.path(), "b", Role::Operator);
    assert!(handshake(&b, &a).is_err());
    let simple = keygen(&dir.path().join("simple"), false).unwrap();
    assert!(handshake(&simple, &a).is_err());
    assert!(handshake(&a, &simple).is_err());
}

#[test]
fn a_rotation_needs_no_flag_day() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(&dir.path().join("ca"));
    let old_id = ca.init(false).unwrap();
    let old_a = issue(&ca, dir.path(), "old-a", Role::Node);
    let old_op = issue(&ca, dir.path(), "old-op", Role::Operator);
    let new_id = ca.rotate().unwrap().id;
    assert_ne!(old_id, new_id);
    assert!(ca.rotate().is_err(), "one rotation at a time");
    let new_b = issue(&ca, dir.path(), "new-b", Role::Node);
    assert!(new_b.facts().rotating);
    // Old and new credentials meet in both directions.
    handshake(&old_op, &new_b).unwrap();
    handshake(&new_b, &old_a).unwrap();
    handshake(&old_a, &new_b).unwrap();
    ca.finish().unwrap();
    let done_c = issue(&ca, dir.path(), "done-c", Role::Node);
    assert!(!done_c.facts().rotating);
    assert_eq!(done_c.cluster_id(), new_id);
    handshake(&new_b, &done_c).unwrap();
    handshake(&done_c, &new_b).unwrap();
    // After the cut-over, a credential of the old CA is refused.
    assert!(handshake(&old_op, &done_c).is_err());
    assert!(handshake(&done_c, &old_a).is_err());
}

#[test]
fn reload_takes_a_renewed_file_and_keeps_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(&dir.path().join("ca"));
    ca.init(false).unwrap();
    let a = issue(&ca, dir.path(), "a", Role::Node);
    let path = dir.path().join("a.cred");
    let before = a.live.now().certified.cert[0].clone();
    ca.issue(&node("a", Role::Node), 5, &path, true).unwrap();
    a.reload().unwrap();
    assert_ne!(a.live.now().certified.cert[0], before);
    ca.issue(&node("z", Role::Node), 5, &path, true).unwrap();
    let e = format!("{:#}", a.reload().unwrap_err());
    assert!(e.contains("keeps its name"), "{e}");
}

#[test]
fn issue_refuses_symlinks_and_silent_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(&dir.path().join("ca"));
    ca.init(false).unwrap();
    let target = dir.path().join("target");
    fs::write(&target, "precious").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = format!(
        "{:#}",
        ca.issue(&node("a", Role::Node), 1, &link, true)
            .err()
            .unwrap()
    );
    assert!(e.contains("symlink"), "{e}");
    let e = format!(
        "{:#}",
        ca.issue(&node("a", Role::Node), 1, &target, false)
            .err()
            .unwrap()
    );
    assert!(e.contains("--force"), "{e}");
    assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    let e = format!(
        "{:#}",
        ca.issue(&node("a", Role::Node), 0, &dir.path().join("x"), false)
            .err()
            .unwrap()
    );
    assert!(e.contains("--days"), "{e}");
}

#[test]
fn an_issued_key_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CaDir::new(&dir.path().join("ca"));
    ca.init(false).unwrap();
    issue(&ca, dir.path(), "a", Role::Node);
    let path = dir.path().join("a.cred");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let e = format!("{:#}", Credential::load(&path).unwrap_err());
    assert!(e.contains("chmod 600"), "{e}");
}

/// Regression (issue 30, finding 10): `rotate` replaced `ca.crt` before it
/// renamed the new key in, so a crash between them lost the key and the
/// retry was refused. Now a crash after any of its writes leaves a CA
/// whose key is never lost; the next `rotate` finishes the rotation, says
/// so, and old and new credentials meet as in a whole rotation.
#[test]
fn a_rotation_crashed_after_any_write_is_finished_by_the_next() {
    for writes in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaDir::new(&dir.path().join("ca"));
        let old_id = ca.init(false).unwrap();
        let old_a = issue(&ca, dir.path(), "old-a", Role::Node);
        super::ca::crash_after(Some(writes));
        let e = ca.rotate().unwrap_err().to_string();
        super::ca::crash_after(None);
        assert!(e.contains("crash"), "{e}");
        // Whatever the crash left, some CA key is readable and issues.
        issue(&ca, dir.path(), "mid", Role::Node);

        let r = ca.rotate().unwrap();
        let what = r.recovered.expect("the retry says what it did");
        assert!(
            what.starts_with("finished the rotation"),
            "{writes}: {what}"
        );
        assert!(what.contains(&r.id.short()), "{what}");
        assert_ne!(r.id, old_id);
        assert!(ca.rotate().is_err(), "{writes}: one rotation at a time");
        let new_b = issue(&ca, dir.path(), "new-b", Role::Node);
        assert_eq!(new_b.cluster_id(), r.id, "{writes}");
        assert!(new_b.facts().rotating);
        handshake(&old_a, &new_b).unwrap();
        handshake(&new_b, &old_a).unwrap();
        ca.finish().unwrap();
        let done = issue(&ca, dir.path(), "done", Role::Node);
        handshake(&new_b, &done).unwrap();
        assert!(handshake(&done, &old_a).is_err());
        let left: Vec<String> = fs::read_dir(dir.path().join("ca"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut left = left;
        left.sort();
        assert_eq!(left, ["ca.crt", "ca.key"], "{writes}");
    }
}

/// What an older xfer left when it crashed between writing the new
/// `ca.crt` and keeping the new key: the old key in `ca.key`, a `ca.crt`
/// of a key that is gone. The next `rotate` undoes that and begins a whole
/// rotation; credentials of the old CA keep working with new ones.
#[test]
fn a_rotation_whose_new_key_was_lost_is_undone_and_begun_again() {
    let dir = tempfile::tempdir().unwrap();
    let cadir = dir.path().join("ca");
    let ca = CaDir::new(&cadir);
    let old_id = ca.init(false).unwrap();
    let old_a = issue(&ca, dir.path(), "old-a", Role::Node);
    // The older rotation's first writes: previous, cross, then ca.crt.
    let old_crt = fs::read(cadir.join("ca.crt")).unwrap();
    let lost = {
        let other = tempfile::tempdir().unwrap();
        let o = CaDir::new(other.path());
        o.init(false).unwrap();
        fs::read(other.path().join("ca.crt")).unwrap()
    };
    fs::write(cadir.join("previous.crt"), &old_crt).unwrap();
    fs::write(cadir.join("cross.crt"), &lost).unwrap();
    fs::write(cadir.join("ca.crt"), &lost).unwrap();

    let r = ca.rotate().unwrap();
    let what = r.recovered.unwrap();
    assert!(what.starts_with("undid a rotation"), "{what}");
    assert!(
        what.contains(&old_id.short()) && what.contains(&r.id.short()),
        "{what}"
    );
    let new_b = issue(&ca, dir.path(), "new-b", Role::Node);
    assert_eq!(new_b.cluster_id(), r.id);
    handshake(&old_a, &new_b).unwrap();
    handshake(&new_b, &old_a).unwrap();
}
