//! Container engines for the image tests: one private `dockerd` per
//! network-namespace host (`scripts/dockerd.sh start DIR NETNS`: its own
//! data root, exec root, pidfile and socket, `--iptables=false
//! --bridge=none`, so the host's firewall is left alone), and an
//! [`ImageLab`]: a cluster whose host 0 is the operator (its engine holds
//! the test images, built locally by `scripts/dockerd.sh images`) and
//! whose hosts 1..=n each run an agent that talks to its own engine.
//! Without root, namespaces or Docker, [`ImageLab::up`] returns `None`
//! with a note.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::netns::{start_agent_in, Cluster, HostAgent};
use super::{keygen, run, Run};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/dockerd.sh")
}

/// One private dockerd, stopped on drop.
pub struct Dockerd {
    pub dir: PathBuf,
    /// `unix://DIR/docker.sock`.
    pub sock: String,
}

impl Dockerd {
    /// Starts a dockerd for `dir`, inside `netns` (root namespace: None).
    pub fn start(dir: &Path, netns: Option<&str>) -> Result<Dockerd, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(script());
        cmd.arg("start").arg(dir);
        if let Some(ns) = netns {
            cmd.arg(ns);
        }
        let r = run(&mut cmd, Duration::from_secs(120));
        if !r.success() {
            return Err(format!("dockerd.sh start: {}{}", r.stdout, r.stderr));
        }
        let sock = r
            .stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("unix://"))
            .ok_or_else(|| format!("dockerd.sh start printed no socket: {r:?}"))?
            .to_string();
        Ok(Dockerd {
            dir: dir.to_path_buf(),
            sock,
        })
    }

    /// `docker -H SOCK ...`.
    pub fn docker(&self) -> Command {
        let mut c = Command::new("docker");
        c.env("DOCKER_HOST", &self.sock)
            .stdin(std::process::Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Run {
        run(self.docker().args(args), Duration::from_secs(120))
    }

    /// The id of `reference` here, if it holds it.
    pub fn image_id(&self, reference: &str) -> Option<String> {
        let r = self.run(&["image", "inspect", "--format", "{{.Id}}", reference]);
        r.success().then(|| r.stdout.trim().to_string())
    }

    /// Every container here, running or not.
    pub fn containers(&self) -> Vec<String> {
        let r = self.run(&["ps", "-aq"]);
        assert!(r.success(), "docker ps: {r:?}");
        r.stdout.split_whitespace().map(String::from).collect()
    }

    /// The layer digests (diff_ids) of `reference`.
    pub fn layers(&self, reference: &str) -> Vec<String> {
        let r = self.run(&[
            "image",
            "inspect",
            "--format",
            "{{json .RootFS.Layers}}",
            reference,
        ]);
        assert!(r.success(), "docker image inspect: {r:?}");
        serde_json::from_str(r.stdout.trim()).expect("a JSON list")
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let _ = run(
            Command::new(script()).arg("stop").arg(&self.dir),
            Duration::from_secs(120),
        );
    }
}

/// Hosts 0..=n of a namespace cluster, each with its own engine; agents
/// on 1..=n. Fields drop in order: agents, then engines, then the cluster.
pub struct ImageLab {
    pub agents: Vec<Option<HostAgent>>,
    pub engines: Vec<Dockerd>,
    pub c: Cluster,
    pub key: PathBuf,
    /// The operator's blob cache (`xfer image push --cache`).
    pub cache: PathBuf,
    pub tmp: tempfile::TempDir,
}

impl ImageLab {
    /// `n` nodes on links of `rate_mbit`; the operator's engine gets the
    /// test images with a base layer of `base_mib` MiB.
    pub fn up(tag: &str, n: u32, rate_mbit: u32, base_mib: u32) -> Option<ImageLab> {
        let install = run(
            Command::new(script()).arg("install"),
            Duration::from_secs(600),
        );
        if !install.success() {
            eprintln!("skipping: cannot install Docker: {}", install.stderr);
            return None;
        }
        let c = super::netns::cluster(tag, n, rate_mbit)?;
        let tmp = super::tempdir(tag);
        let key = tmp.path().join("key");
        keygen(&key);
        let mut engines = Vec::new();
        for i in 0..=n {
            let ns = format!("{}-h{i}", c.prefix);
            match Dockerd::start(&tmp.path().join(format!("docker{i}")), Some(&ns)) {
                Ok(d) => engines.push(d),
                Err(e) => panic!("host {i}: {e}"),
            }
        }
        let built = run(
            Command::new(script())
                .arg("images")
                .arg(&engines[0].sock)
                .arg(base_mib.to_string()),
            Duration::from_secs(300),
        );
        assert!(built.success(), "dockerd.sh images: {built:?}");
        let cache = tmp.path().join("cache");
        Some(ImageLab {
            agents: (0..=n).map(|_| None).collect(),
            engines,
            c,
            key,
            cache,
            tmp,
        })
    }

    pub fn root(&self, i: u32) -> PathBuf {
        self.tmp.path().join(format!("root{i}"))
    }

    pub fn agent_log(&self, i: u32) -> String {
        std::fs::read_to_string(self.tmp.path().join(format!("agent{i}.log"))).unwrap_or_default()
    }

    /// (Re)starts host `i`'s agent, with its engine unless `engine` is false.
    pub fn start_agent(&mut self, i: u32, engine: bool, extra: &[&str]) {
        self.agents[i as usize] = None;
        let root = self.root(i);
        std::fs::create_dir_all(&root).unwrap();
        let mut args: Vec<&str> = extra.to_vec();
        if engine {
            args.extend(["--container-engine", "docker"]);
        }
        let sock = PathBuf::from(&self.engines[i as usize].sock);
        let log = self.tmp.path().join(format!("agent{i}.log"));
        let a = start_agent_in(
            &self.c,
            i,
            &format!("{}:7470", self.c.ip(i)),
            &root,
            &self.key,
            &args,
            &[("DOCKER_HOST", &sock)],
            &log,
        );
        self.agents[i as usize] = Some(a);
    }

    /// `xfer image push IMAGE --to HOSTS --json` from host 0, as a command.
    pub fn push_cmd(&self, image: &str, hosts: &[u32]) -> Command {
        let to: Vec<String> = hosts
            .iter()
            .map(|i| format!("{}:7470", self.c.ip(*i)))
            .collect();
        let mut cmd = self.c.xfer(0);
        cmd.env("DOCKER_HOST", &self.engines[0].sock)
            .args([
                "image",
                "push",
                image,
                "--json",
                "--chunk-size",
                "1MiB",
                "--to",
            ])
            .arg(to.join(","))
            .arg("--key")
            .arg(&self.key)
            .arg("--cache")
            .arg(&self.cache);
        cmd
    }

    pub fn push(&self, image: &str, hosts: &[u32]) -> Run {
        run(&mut self.push_cmd(image, hosts), Duration::from_secs(300))
    }
}
