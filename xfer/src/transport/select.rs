//! Which data plane a command uses: `--transport auto|quic|rdma`.
//!
//! `auto` takes RDMA when this node has an RDMA port that is ACTIVE and
//! this build can drive it, QUIC otherwise, and says in one line why it
//! fell back ("rdma: no device (kernel lacks RDMA support); using QUIC").
//! `rdma` refuses to start without a usable device, with the same reason.
//! The look at the hardware is sysfs only (`/sys/class/infiniband`), so it
//! is the same with or without the `rdma` feature; [`choose`] then opens
//! the device (feature `rdma`) and hands the command its [`Nic`].
//!
//! Given the interface of the node's data address (its fabric), only an
//! RDMA port on that interface will do: the data rides the fabric, so a
//! port on another network is no RDMA for it ("no active RDMA port on the
//! fabric interface eth1 (mlx5_0 port 1 is on eth0)").

use std::path::Path;
use std::sync::Arc;

use super::rdma::link::Nic;
use crate::sysinfo::rdma::{self as sysfs, LinkLayer};

pub use xfer_proto::admin::TransportChoice;

/// An RDMA port that is up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivePort {
    /// The RDMA device (`mlx5_0`).
    pub device: String,
    /// The port's number.
    pub port: u32,
    /// InfiniBand or Ethernet (RoCE); None when sysfs cannot say.
    pub link_layer: Option<LinkLayer>,
}

/// Why no RDMA port will do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoActivePort {
    /// No `/sys/class/infiniband` at all.
    #[error("no device (kernel lacks RDMA support: /sys/class/infiniband does not exist)")]
    NoKernelSupport,
    /// The folder is there but empty.
    #[error("no device (/sys/class/infiniband is empty)")]
    NoDevice,
    /// Active ports exist, but none on the fabric interface.
    #[error("no active port on the fabric interface {fabric} ({})", .ports.join(", "))]
    NotOnFabric {
        /// The fabric interface asked for.
        fabric: String,
        /// Where each port is, or that it is down.
        ports: Vec<String>,
    },
    /// No port is ACTIVE.
    #[error("no active port ({})", .down.join(", "))]
    NoneActive {
        /// Each port and its state.
        down: Vec<String>,
    },
}

/// `--transport rdma` without a usable RDMA port.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--transport rdma: {why}; use --transport quic (or auto, which falls back by itself)")]
pub struct RdmaRefused {
    /// Why there is no RDMA, in words.
    pub why: String,
}

/// A RoCE port without a GID an RDMA transport can use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{device} port {port} has no RoCE v2 GID with an IPv4 address; give its netdev an IPv4 address (xfer doctor lists the GID table)")]
pub struct NoRoceGid {
    /// The RDMA device.
    pub device: String,
    /// Its port.
    pub port: u32,
}

/// The data plane chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    /// QUIC; with `auto`, why not RDMA.
    Quic {
        /// Why not RDMA, with `auto`; None with `quic`.
        fallback: Option<String>,
    },
    /// RDMA over this port.
    Rdma(ActivePort),
}

/// The first active RDMA port under `sys` (normally `/sys`), or why there
/// is none.
pub fn active_port(sys: &Path) -> Result<ActivePort, NoActivePort> {
    active_port_on(sys, None)
}

/// The first active RDMA port whose netdev is `fabric` (any, with `None`),
/// or why there is none.
pub fn active_port_on(sys: &Path, fabric: Option<&str>) -> Result<ActivePort, NoActivePort> {
    let devices = sysfs::devices(sys).map_err(|_| NoActivePort::NoKernelSupport)?;
    if devices.is_empty() {
        return Err(NoActivePort::NoDevice);
    }
    let mut down = Vec::new();
    let mut elsewhere = Vec::new();
    for d in &devices {
        for p in sysfs::ports(sys, d) {
            if let (true, Some(want)) = (p.is_active(), fabric) {
                let on = p.netdevs();
                if !on.iter().any(|n| n == want) {
                    elsewhere.push(format!(
                        "{d} port {} is on {}",
                        p.number,
                        if on.is_empty() {
                            "no interface".to_string()
                        } else {
                            on.join(", ")
                        }
                    ));
                    continue;
                }
            }
            if p.is_active() {
                return Ok(ActivePort {
                    device: p.device,
                    port: p.number,
                    link_layer: p.link_layer,
                });
            }
            down.push(format!(
                "{d} port {} is {}",
                p.number,
                p.state_text.as_deref().unwrap_or("unreadable")
            ));
        }
    }
    if let Some(want) = fabric.filter(|_| !elsewhere.is_empty()) {
        elsewhere.extend(down);
        return Err(NoActivePort::NotOnFabric {
            fabric: want.to_string(),
            ports: elsewhere,
        });
    }
    Err(NoActivePort::NoneActive { down })
}

/// Why this build cannot move chunks over an active port (None: it can).
fn unusable(_port: &ActivePort) -> Option<String> {
    if !cfg!(feature = "rdma") {
        return Some(
            "this xfer was built without the `rdma` feature (cargo build --release --features xfer/rdma)"
                .into(),
        );
    }
    None
}

/// Picks the data plane for `choice`, looking at the hardware under `sys`.
pub fn select(choice: TransportChoice, sys: &Path) -> Result<Selected, RdmaRefused> {
    select_on(choice, sys, None)
}

/// [`select`] for a node whose data address is on interface `fabric`.
pub fn select_on(
    choice: TransportChoice,
    sys: &Path,
    fabric: Option<&str>,
) -> Result<Selected, RdmaRefused> {
    if choice == TransportChoice::Quic {
        return Ok(Selected::Quic { fallback: None });
    }
    let why = match active_port_on(sys, fabric) {
        Ok(p) => match unusable(&p) {
            None => return Ok(Selected::Rdma(p)),
            Some(w) => format!("{} port {} is active, but {w}", p.device, p.port),
        },
        Err(w) => w.to_string(),
    };
    without_rdma(choice, why)
}

/// No RDMA, for `why`: `rdma` refuses, `auto` falls back and says why.
fn without_rdma(choice: TransportChoice, why: String) -> Result<Selected, RdmaRefused> {
    match choice {
        TransportChoice::Rdma => Err(RdmaRefused { why }),
        _ => Ok(Selected::Quic {
            fallback: Some(format!("rdma: {why}; using QUIC")),
        }),
    }
}

/// Whether the operator asked about the data plane (`--transport` given on
/// the command line, or `--log`): then a fallback to QUIC is one line on
/// stderr; else only an info log line (what `serve` shows, once).
static SAY_FALLBACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes [`choose`] print its fallback line on stderr (`true`: the
/// operator asked for a transport or for logs) or only log it.
pub fn say_fallback(on: bool) {
    SAY_FALLBACK.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// [`select`] for a command, and the NIC it then uses: `None` means QUIC.
/// With `auto`, says why it falls back: one line on stderr when the
/// operator asked ([`say_fallback`]), else an info log line; with `rdma`,
/// returns why it cannot.
pub fn choose(choice: TransportChoice) -> anyhow::Result<Option<Arc<dyn Nic>>> {
    choose_on(choice, None)
}

/// [`choose`] for a node whose data address is on interface `fabric`: only
/// an RDMA port on it is taken.
pub fn choose_on(
    choice: TransportChoice,
    fabric: Option<&str>,
) -> anyhow::Result<Option<Arc<dyn Nic>>> {
    let sys = Path::new("/sys");
    let mut selected = select_on(choice, sys, fabric)?;
    if let Selected::Rdma(port) = &selected {
        match open_nic(sys, port) {
            Ok(nic) => {
                tracing::info!(
                    "rdma: {} port {} ({})",
                    port.device,
                    port.port,
                    port.link_layer.as_ref().map_or("", LinkLayer::as_str)
                );
                return Ok(Some(nic));
            }
            Err(why) => selected = without_rdma(choice, why.to_string())?,
        }
    }
    if let Selected::Quic {
        fallback: Some(why),
    } = &selected
    {
        if SAY_FALLBACK.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{why}");
        } else {
            tracing::info!("{why}");
        }
    }
    Ok(None)
}

/// The GID index to use on `port`: the first RoCE v2 GID with an IPv4
/// address on Ethernet (what `show_gids` marks), 0 on InfiniBand.
pub fn gid_index(sys: &Path, port: &ActivePort) -> Result<u32, NoRoceGid> {
    if port.link_layer == Some(LinkLayer::InfiniBand) {
        return Ok(0);
    }
    sysfs::ports(sys, &port.device)
        .iter()
        .find(|p| p.number == port.port)
        .and_then(sysfs::SysPort::roce_v2_ipv4_gid_index)
        .ok_or_else(|| NoRoceGid {
            device: port.device.clone(),
            port: port.port,
        })
}

/// Why the selected RDMA port's NIC did not open: the reason of the
/// fallback's line (or of `--transport rdma`'s refusal).
#[derive(Debug, thiserror::Error)]
pub enum OpenNicError {
    /// An override variable that is not a number.
    #[error("{name}={value} is not a number")]
    NotANumber {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// No RoCE v2 GID to use.
    #[error(transparent)]
    NoGid(#[from] NoRoceGid),
    /// A port number beyond what verbs take.
    #[error("port {0} out of range")]
    PortRange(u32),
    /// The device did not open.
    #[error(transparent)]
    Open(#[from] super::rdma::link::SetupError),
    /// This build cannot drive RDMA.
    #[error("this xfer was built without the `rdma` feature")]
    NoFeature,
}

/// Opens the NIC of `port`, or of `XFER_RDMA_DEVICE` / `XFER_RDMA_PORT`
/// when set; the GID index is `XFER_RDMA_GID_INDEX` or [`gid_index`].
#[cfg(feature = "rdma")]
fn open_nic(sys: &Path, port: &ActivePort) -> Result<Arc<dyn Nic>, OpenNicError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let parsed = |name: &'static str| -> Result<Option<u32>, OpenNicError> {
        env(name)
            .map(|value| {
                value
                    .parse()
                    .map_err(|_| OpenNicError::NotANumber { name, value })
            })
            .transpose()
    };
    let mut port = port.clone();
    if let Some(device) = env("XFER_RDMA_DEVICE") {
        port.device = device;
    }
    if let Some(n) = parsed("XFER_RDMA_PORT")? {
        port.port = n;
    }
    let index = match parsed("XFER_RDMA_GID_INDEX")? {
        Some(i) => i,
        None => gid_index(sys, &port)?,
    };
    let number = u8::try_from(port.port).map_err(|_| OpenNicError::PortRange(port.port))?;
    let nic = super::rdma::sys::SysNic::open(&port.device, number, index)?;
    Ok(Arc::new(nic))
}

#[cfg(not(feature = "rdma"))]
fn open_nic(_sys: &Path, _port: &ActivePort) -> Result<Arc<dyn Nic>, OpenNicError> {
    // `select` never picks RDMA in a build without the backend.
    Err(OpenNicError::NoFeature)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(sys: &Path, dev: &str, n: u32, state: &str) {
        let p = sys
            .join("class/infiniband")
            .join(dev)
            .join("ports")
            .join(n.to_string());
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("state"), format!("{state}\n")).unwrap();
        std::fs::write(p.join("link_layer"), "Ethernet\n").unwrap();
    }

    /// Binds GID 0 of `dev` port `n` to netdev `iface` (RoCE).
    fn bound(sys: &Path, dev: &str, n: u32, iface: &str) {
        let d = sys
            .join("class/infiniband")
            .join(dev)
            .join("ports")
            .join(n.to_string())
            .join("gid_attrs/ndevs");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("0"), format!("{iface}\n")).unwrap();
    }

    #[test]
    fn the_port_on_the_fabric_interface_is_chosen_and_no_other() {
        let sys = tempfile::tempdir().unwrap();
        // mlx5_0 sits on the management network, mlx5_1 on the fabric.
        port(sys.path(), "mlx5_0", 1, "4: ACTIVE");
        bound(sys.path(), "mlx5_0", 1, "eno1");
        port(sys.path(), "mlx5_1", 1, "4: ACTIVE");
        bound(sys.path(), "mlx5_1", 1, "enp1s0f1np1");
        assert_eq!(active_port(sys.path()).unwrap().device, "mlx5_0");
        let p = active_port_on(sys.path(), Some("enp1s0f1np1")).unwrap();
        assert_eq!((p.device.as_str(), p.port), ("mlx5_1", 1));
        // A fabric with no RDMA port: named, with where the ports are.
        let e = active_port_on(sys.path(), Some("eth9"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "no active port on the fabric interface eth9 (mlx5_0 port 1 is on eno1, mlx5_1 port 1 is on enp1s0f1np1)"
        );
        match select_on(TransportChoice::Auto, sys.path(), Some("eth9")).unwrap() {
            Selected::Quic { fallback: Some(w) } => {
                assert!(
                    w.starts_with("rdma: no active port on the fabric interface eth9"),
                    "{w}"
                )
            }
            other => panic!("{other:?}"),
        }
        let e = select_on(TransportChoice::Rdma, sys.path(), Some("eth9"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--transport rdma: no active port on the fabric interface eth9"),
            "{e}"
        );
    }

    #[test]
    fn no_kernel_support_falls_back_or_refuses_with_the_reason() {
        let sys = tempfile::tempdir().unwrap();
        let s = select(TransportChoice::Auto, sys.path()).unwrap();
        assert_eq!(
            s,
            Selected::Quic {
                fallback: Some(
                    "rdma: no device (kernel lacks RDMA support: /sys/class/infiniband does not exist); using QUIC".into()
                )
            }
        );
        let e = select(TransportChoice::Rdma, sys.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--transport rdma: no device (kernel lacks RDMA support"),
            "{e}"
        );
        assert!(
            e.ends_with("use --transport quic (or auto, which falls back by itself)"),
            "{e}"
        );
        assert_eq!(
            select(TransportChoice::Quic, sys.path()).unwrap(),
            Selected::Quic { fallback: None }
        );
    }

    #[test]
    fn ports_that_are_down_are_named() {
        let sys = tempfile::tempdir().unwrap();
        port(sys.path(), "mlx5_0", 1, "1: DOWN");
        let e = active_port(sys.path()).unwrap_err().to_string();
        assert_eq!(e, "no active port (mlx5_0 port 1 is 1: DOWN)");
        port(sys.path(), "mlx5_1", 1, "4: ACTIVE");
        let p = active_port(sys.path()).unwrap();
        assert_eq!((p.device.as_str(), p.port), ("mlx5_1", 1));
        // Without the backend, auto says why it cannot use the port.
        match select(TransportChoice::Auto, sys.path()).unwrap() {
            Selected::Quic { fallback: Some(w) } if !cfg!(feature = "rdma") => {
                assert!(w.starts_with("rdma: mlx5_1 port 1 is active, but "), "{w}")
            }
            Selected::Rdma(p) if cfg!(feature = "rdma") => assert_eq!(p.device, "mlx5_1"),
            other => panic!("{other:?}"),
        }
    }
}
