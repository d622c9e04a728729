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
use super::wait::{wait_until, Text, HANG};
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

    /// (Re)starts host `i`'s agent with its engine and `env` besides.
    pub fn start_agent_env(&mut self, i: u32, env: &[(&str, &str)]) {
        self.agents[i as usize] = None;
        let root = self.root(i);
        std::fs::create_dir_all(&root).unwrap();
        let sock = PathBuf::from(&self.engines[i as usize].sock);
        let vals: Vec<PathBuf> = env.iter().map(|(_, v)| PathBuf::from(v)).collect();
        let mut all: Vec<(&str, &Path)> = vec![("DOCKER_HOST", sock.as_path())];
        all.extend(env.iter().zip(&vals).map(|((k, _), v)| (*k, v.as_path())));
        let log = self.tmp.path().join(format!("agent{i}.log"));
        let a = start_agent_in(
            &self.c,
            i,
            &format!("{}:7470", self.c.ip(i)),
            &root,
            &self.key,
            &["--container-engine", "docker"],
            &all,
            &log,
        );
        self.agents[i as usize] = Some(a);
    }

    /// (Re)starts host `i`'s agent with podman as its container engine,
    /// podman's storage and configuration in `dir` (no daemon: the agent's
    /// `podman` commands use them through `CONTAINERS_STORAGE_CONF` and
    /// `CONTAINERS_CONF`); returns that environment, for the test's own
    /// `podman` commands.
    pub fn start_agent_podman(&mut self, i: u32, dir: &Path) -> Vec<(String, PathBuf)> {
        self.agents[i as usize] = None;
        let root = self.root(i);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let storage = dir.join("storage.conf");
        std::fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                dir.join("graph").display(),
                dir.join("run").display()
            ),
        )
        .unwrap();
        // No systemd here: cgroups by hand, events to a file. The limits
        // stay podman's defaults: the agent passes its own.
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n",
        )
        .unwrap();
        let env = vec![
            ("CONTAINERS_STORAGE_CONF".to_string(), storage),
            ("CONTAINERS_CONF".to_string(), conf),
        ];
        let pairs: Vec<(&str, &Path)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_path())).collect();
        let log = self.tmp.path().join(format!("agent{i}.log"));
        let a = start_agent_in(
            &self.c,
            i,
            &format!("{}:7470", self.c.ip(i)),
            &root,
            &self.key,
            &["--container-engine", "podman"],
            &pairs,
            &log,
        );
        self.agents[i as usize] = Some(a);
        env
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

/// A CNCF distribution registry (Debian's `docker-registry`) serving in
/// host `ns`'s namespace on `addr`: anonymous over plain HTTP, or behind
/// TLS from a test CA with an htpasswd user. Stopped on drop.
pub struct RegistryServer {
    child: std::process::Child,
    /// `IP:PORT`.
    pub addr: String,
    /// The access log (every request, with the bytes of its answer).
    pub log: PathBuf,
    /// With TLS: the CA that signed its certificate.
    pub ca: Option<PathBuf>,
}

impl RegistryServer {
    /// Starts it in `ns` on `ip:port`, its data under `dir`; with `user`,
    /// TLS and basic auth (`user`, `password`).
    pub fn start(
        dir: &Path,
        ns: &str,
        ip: &str,
        port: u16,
        user: Option<(&str, &str)>,
    ) -> RegistryServer {
        Self::start_in(dir, Some(ns), ip, port, user)
    }

    /// [`RegistryServer::start`] in namespace `ns`, or in this one.
    pub fn start_in(
        dir: &Path,
        ns: Option<&str>,
        ip: &str,
        port: u16,
        user: Option<(&str, &str)>,
    ) -> RegistryServer {
        let in_ns = |prog: &str| {
            let mut c = match ns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns, prog]);
                    c
                }
                None => Command::new(prog),
            };
            c.stdin(std::process::Stdio::null());
            c
        };
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let addr = format!("{ip}:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.join("data").display()
        );
        let mut ca = None;
        if let Some((u, p)) = user {
            let (ca_pem, cert, key) = test_ca(dir, ip);
            config += &format!(
                "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: xfer-test\n    path: {}\n",
                cert.display(),
                key.display(),
                dir.join("htpasswd").display()
            );
            let h = run(
                Command::new("htpasswd").args(["-Bbn", u, p]),
                Duration::from_secs(30),
            );
            assert!(h.success(), "htpasswd: {h:?}");
            std::fs::write(dir.join("htpasswd"), h.stdout).unwrap();
            ca = Some(ca_pem);
        }
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let log = dir.join("registry.log");
        let child = in_ns("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("registry.err")).unwrap())
            .spawn()
            .expect("docker-registry (scripts/dockerd.sh install puts it there)");
        let r = RegistryServer {
            child,
            addr,
            log,
            ca,
        };
        // Up once /v2/ answers (401 behind auth).
        let scheme = if r.ca.is_some() { "https" } else { "http" };
        wait_until("the registry to answer /v2/", HANG, || {
            let out = in_ns("curl")
                .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
                .arg(format!("{scheme}://{}/v2/", r.addr))
                .output()
                .unwrap();
            let code = String::from_utf8_lossy(&out.stdout).to_string();
            if code == "200" || code == "401" {
                Ok(())
            } else {
                Err(Text(format!(
                    "HTTP {code:?}; its log: {}",
                    std::fs::read_to_string(dir.join("registry.err")).unwrap_or_default()
                )))
            }
        });
        r
    }

    /// Bytes the registry sent in answers to GETs of blob `digest` (all,
    /// with None), from its access log.
    pub fn blob_bytes(&self, digest: Option<&str>) -> u64 {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(self.log.with_file_name("registry.err")).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains("/blobs/"))
            .filter(|l| digest.is_none_or(|d| l.contains(d)))
            .filter_map(|l| {
                // `"GET ... HTTP/1.1" 200 1234 "-" "agent"`
                let after = l.split("HTTP/1.1\" ").nth(1)?;
                let mut it = after.split_whitespace();
                let _status = it.next()?;
                it.next()?.parse::<u64>().ok()
            })
            .sum()
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test CA and a certificate for `ip` signed by it, under `dir`: (CA,
/// certificate, key) as PEM files.
pub fn test_ca(dir: &Path, ip: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (ca_key, ca) = (dir.join("ca.key"), dir.join("ca.pem"));
    let (key, csr, cert) = (
        dir.join("reg.key"),
        dir.join("reg.csr"),
        dir.join("reg.pem"),
    );
    let ext = dir.join("ext.cnf");
    std::fs::write(&ext, format!("subjectAltName=IP:{ip}\n")).unwrap();
    let steps: Vec<Vec<String>> = vec![
        format!(
            "req -x509 -newkey rsa:2048 -nodes -keyout {} -out {} -days 2 -subj /CN=xfer-test-ca",
            ca_key.display(),
            ca.display()
        ),
        format!(
            "req -newkey rsa:2048 -nodes -keyout {} -out {} -subj /CN={ip}",
            key.display(),
            csr.display()
        ),
        format!(
            "x509 -req -in {} -CA {} -CAkey {} -CAcreateserial -out {} -days 2 -extfile {}",
            csr.display(),
            ca.display(),
            ca_key.display(),
            cert.display(),
            ext.display()
        ),
    ]
    .into_iter()
    .map(|s| s.split(' ').map(String::from).collect())
    .collect();
    for args in steps {
        let r = run(Command::new("openssl").args(&args), Duration::from_secs(60));
        assert!(r.success(), "openssl {args:?}: {r:?}");
    }
    (ca, cert, key)
}

/// `skopeo copy`, in namespace `ns`, of `image` from the engine at `sock`
/// into the registry at `dest` (`docker://ADDR/NAME:TAG`), with `creds`
/// when it asks (and the registry's CA, `ca`, when it has TLS).
pub fn skopeo_push(
    ns: &str,
    sock: &str,
    image: &str,
    dest: &str,
    creds: Option<&str>,
    ca: Option<&Path>,
) {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        "skopeo",
        "copy",
        "--quiet",
        "--src-daemon-host",
        sock,
    ]);
    match ca {
        Some(ca) => {
            let certs = ca.parent().unwrap().join("skopeo-certs");
            std::fs::create_dir_all(&certs).unwrap();
            std::fs::copy(ca, certs.join("ca.crt")).unwrap();
            c.arg("--dest-cert-dir").arg(&certs);
        }
        None => {
            c.arg("--dest-tls-verify=false");
        }
    }
    if let Some(cr) = creds {
        c.args(["--dest-creds", cr]);
    }
    c.arg(format!("docker-daemon:{image}")).arg(dest);
    let r = run(&mut c, Duration::from_secs(300));
    assert!(r.success(), "skopeo copy {image} {dest}: {r:?}");
}
