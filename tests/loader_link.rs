//! The loader link (issue 52): a real `xfer serve` answers its node's
//! ranks on a Unix socket under its root, one JSON line each way; nothing
//! else may ask it. Each test performs what it defends against: an
//! oversized or malformed request, another user connecting (through the
//! file's mode, and, with the mode opened, through the agent's own check of
//! the caller), a second agent on the same root.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use common::agents::Agent;
use common::push::push_ok;
use common::trees::gen_model;
use common::*;

/// One request line and the reply line (empty when the agent closed).
fn ask(sock: &Path, line: &[u8]) -> String {
    let mut c = UnixStream::connect(sock).expect("connect to the loader link");
    c.write_all(line).unwrap();
    let mut reply = String::new();
    BufReader::new(c).read_line(&mut reply).unwrap();
    reply
}

fn started(t: &tempfile::TempDir, ip: &str) -> (Agent, std::path::PathBuf) {
    let key = t.path().join("key");
    if !key.exists() {
        keygen(&key);
    }
    let root = t.path().join(format!("root-{ip}"));
    let a = Agent::start(&format!("{ip}:0"), &root, &key);
    a.wait_log("loader link on");
    (a, root.join(".xfer/agent.sock"))
}

#[test]
fn a_rank_asks_its_agent_about_a_model_and_nothing_else() {
    let t = tempdir("loader-link");
    let (a, sock) = started(&t, "127.0.0.91");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is the agent user's alone");

    let src = t.path().join("tiny");
    gen_model(&src, 2 * MIB, 7);
    let pushed = push_ok(&src, &[a.addr.as_str()], &t.path().join("key"), &[]);

    let reply: serde_json::Value =
        serde_json::from_str(&ask(&sock, b"{\"ask\":\"model\",\"name\":\"tiny\"}\n")).unwrap();
    assert_eq!(reply["answer"], "model", "{reply}");
    assert_eq!(reply["model"]["state"], "complete", "{reply}");
    assert_eq!(reply["model"]["root"], pushed.root.to_hex(), "{reply}");

    let none: serde_json::Value =
        serde_json::from_str(&ask(&sock, b"{\"ask\":\"model\",\"name\":\"other\"}\n")).unwrap();
    assert_eq!(none["answer"], "model");
    assert!(none["model"].is_null(), "{none}");

    // Two questions on one connection are both answered.
    let mut c = UnixStream::connect(&sock).unwrap();
    c.write_all(b"{\"ask\":\"model\",\"name\":\"tiny\"}\n{\"ask\":\"model\",\"name\":\"tiny\"}\n")
        .unwrap();
    let mut lines = BufReader::new(c.try_clone().unwrap()).lines();
    for _ in 0..2 {
        let l = lines.next().unwrap().unwrap();
        assert!(l.starts_with("{\"answer\":\"model\""), "{l}");
    }

    // Anything else is refused in one line, and the connection closed.
    for (bad, said) in [
        (
            &b"{\"ask\":\"rm\",\"name\":\"tiny\"}\n"[..],
            "not a request of the loader link",
        ),
        (
            b"{\"ask\":\"model\",\"name\":\"tiny\",\"force\":true}\n",
            "not a request",
        ),
        (b"GET / HTTP/1.1\r\n\r\n", "not a request"),
    ] {
        let mut c = UnixStream::connect(&sock).unwrap();
        c.write_all(bad).unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert!(all.starts_with("{\"answer\":\"refused\""), "{all}");
        assert!(all.contains(said), "{all}");
        assert_eq!(all.matches('\n').count(), 1, "one line, then closed: {all}");
    }
    // An endless line: the agent reads at most 4 KiB of it.
    let mut c = UnixStream::connect(&sock).unwrap();
    let _ = c.write_all(&vec![b'x'; 64 << 10]);
    let mut all = String::new();
    let _ = c.read_to_string(&mut all);
    assert!(all.contains("a request over 4096 bytes"), "{all}");
    assert!(a.model_dir("tiny").exists(), "nothing was touched");
}

/// `nobody` (uid 65534) connecting, through folders every user may enter.
fn as_nobody_connect(sock: &Path) -> std::process::Output {
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\nexcept OSError as e:\n    print('refused', e.errno)\n    raise SystemExit\ntry:\n    s.sendall(b'{{\"ask\":\"model\",\"name\":\"tiny\"}}\\n')\n    got = s.recv(4096)\nexcept OSError:\n    got = b''\nprint('answered' if got else 'closed', repr(got))\n",
        sock.display().to_string()
    );
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &script,
        ])
        .output()
        .expect("setpriv runs")
}

#[test]
fn another_user_cannot_ask_even_with_the_sockets_mode_opened() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let t = tempdir("loader-link-user");
    let (a, sock) = started(&t, "127.0.0.92");
    for dir in [
        t.path(),
        sock.parent().unwrap().parent().unwrap(),
        sock.parent().unwrap(),
    ] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // The file's mode stops it.
    let out = as_nobody_connect(&sock);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("refused 13"),
        "EACCES expected: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // With the mode opened by mistake, the agent's own check of the caller.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody_connect(&sock);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("closed b''"),
        "closed unanswered: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.wait_log("refused a loader-link connection from user 65534");
}

#[test]
fn a_restarted_agent_replaces_its_stale_socket() {
    let t = tempdir("loader-link-restart");
    let (mut a, sock) = started(&t, "127.0.0.93");
    a.kill9();
    assert!(sock.exists(), "kill -9 leaves the socket file");
    let (_b, sock) = started(&t, "127.0.0.93");
    let reply = ask(&sock, b"{\"ask\":\"model\",\"name\":\"tiny\"}\n");
    assert!(reply.starts_with("{\"answer\":\"model\""), "{reply}");
}
