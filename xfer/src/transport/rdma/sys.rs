//! [`Verbs`] over libibverbs (`rdma-sys`): the real RoCE / InfiniBand
//! backend (cargo feature `rdma`).
//!
//! Setting up a connection:
//!
//! 1. [`Device::open`] opens a device, allocates its protection domain and
//!    checks that the port is ACTIVE and has a GID at the chosen index.
//! 2. [`Device::create_qps`] creates N reliable-connected queue pairs on one
//!    completion queue and moves them to INIT; [`PendingQps::local`] is what
//!    the peer needs to know ([`Local`]: GID, LID, MTU, QPNs, PSNs), sent over
//!    the authenticated QUIC control connection.
//! 3. [`PendingQps::connect`] takes the peer's [`Local`], moves every queue
//!    pair to RTR then RTS and returns a [`SysVerbs`], the data plane.
//!
//! Every queue-pair set owns its completion queue, sized for every work
//! request it can have outstanding, so no completion of one connection is
//! ever seen by another (two sets on one device, as in the loopback test or
//! an agent serving several peers, stay apart) and the queue cannot overrun.
//!
//! Nothing here can run on a machine without an RDMA NIC: the hardware test
//! at the bottom is `#[ignore]`d and `scripts/rdma-selftest.sh` runs it, and
//! `ib_write_bw` as the reference, on two real hosts.

use std::ffi::CStr;
use std::fmt::Write as _;
use std::io;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use super::link::{Local, QpInfo};
use super::link::{Nic, PendingLink, SetupError};
use super::verbs::{Access, Completion, Region, Verbs, VerbsError, WcKind, WcStatus, WriteImm};
use rdma_sys::{
    ___ibv_query_port, ibv_access_flags, ibv_alloc_pd, ibv_close_device, ibv_context, ibv_cq,
    ibv_create_cq, ibv_create_qp, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_cq, ibv_destroy_qp,
    ibv_device, ibv_device_attr, ibv_free_device_list, ibv_get_device_list, ibv_get_device_name,
    ibv_gid, ibv_modify_qp, ibv_mr, ibv_mtu, ibv_open_device, ibv_pd, ibv_poll_cq, ibv_port_attr,
    ibv_port_state, ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_query_device, ibv_query_gid, ibv_recv_wr,
    ibv_reg_mr, ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc, ibv_wc_opcode, ibv_wc_status,
    ibv_wr_opcode,
};

/// `IBV_LINK_LAYER_*` (an anonymous enum in verbs.h, not in the bindings).
const LINK_LAYER_INFINIBAND: u8 = 1;
const LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_WC_WITH_IMM` of `ibv_wc_flags`.
const WC_WITH_IMM: u32 = 1 << 1;
/// The smallest completion queue made (or the device's `max_cqe` if lower);
/// [`Device::create_qps`] sizes it up for its queue pairs, within `max_cqe`.
const CQ_MIN_DEPTH: u32 = 4096;

/// The names of the RDMA devices present (`ibv_get_device_list`).
pub fn devices() -> Result<Vec<String>, SetupError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below and the
    // names are copied out before that.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let err = io::Error::last_os_error();
        return Err(SetupError::Unusable(format!(
            "no RDMA device: ibv_get_device_list failed: {err} (kernel lacks RDMA support? \
             load the NIC's RDMA driver, e.g. mlx5_ib, irdma or rdma_rxe)"
        )));
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        names.push(device_name(dev));
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(SetupError::Unusable(
            "no RDMA device: ibv_get_device_list found none (kernel lacks RDMA \
                    support? load the NIC's RDMA driver, e.g. mlx5_ib, irdma or rdma_rxe)"
                .to_string(),
        ));
    }
    Ok(names)
}

fn device_name(dev: *mut ibv_device) -> String {
    // SAFETY: `dev` is a live entry of a device list; the name is a
    // NUL-terminated string owned by it, copied out at once.
    unsafe {
        let name = ibv_get_device_name(dev);
        if name.is_null() {
            String::from("?")
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

/// The verb, what it said, and what usually causes it.
fn verb_error(verb: &str, err: io::Error, hint: &'static str) -> SetupError {
    SetupError::Verb {
        verb: verb.to_string(),
        err,
        hint,
    }
}

/// [`verb_error`]'s line, for a data-path verb.
fn verb_error_text(verb: &str, err: io::Error, hint: &'static str) -> String {
    verb_error(verb, err, hint).to_string()
}

/// Verbs that return 0 or an errno value (some providers return -1 and set
/// errno instead: both are handled).
fn check(ret: c_int, verb: &str, hint: &'static str) -> Result<(), SetupError> {
    match ret {
        0 => Ok(()),
        e if e > 0 => Err(verb_error(verb, io::Error::from_raw_os_error(e), hint)),
        _ => Err(verb_error(verb, io::Error::last_os_error(), hint)),
    }
}

/// `ibv_mtu` value to bytes (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5).
fn mtu_bytes(mtu: ibv_mtu::Type) -> Option<u32> {
    (ibv_mtu::IBV_MTU_256..=ibv_mtu::IBV_MTU_4096)
        .contains(&mtu)
        .then(|| 128u32 << mtu)
}

/// Bytes to `ibv_mtu` (the inverse of [`mtu_bytes`]).
fn mtu_enum(bytes: u32) -> Option<ibv_mtu::Type> {
    match bytes {
        256 => Some(ibv_mtu::IBV_MTU_256),
        512 => Some(ibv_mtu::IBV_MTU_512),
        1024 => Some(ibv_mtu::IBV_MTU_1024),
        2048 => Some(ibv_mtu::IBV_MTU_2048),
        4096 => Some(ibv_mtu::IBV_MTU_4096),
        _ => None,
    }
}

fn port_state_name(state: ibv_port_state::Type) -> String {
    match state {
        ibv_port_state::IBV_PORT_NOP => "NOP".into(),
        ibv_port_state::IBV_PORT_DOWN => "DOWN".into(),
        ibv_port_state::IBV_PORT_INIT => "INIT".into(),
        ibv_port_state::IBV_PORT_ARMED => "ARMED".into(),
        ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE".into(),
        ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER".into(),
        n => format!("state {n}"),
    }
}

/// The link layer of a port: the one type sysfs's reader parses too.
pub use crate::sysinfo::rdma::LinkLayer;

/// What an old driver that reports no link layer is shown as (InfiniBand
/// in practice).
fn unspecified() -> LinkLayer {
    LinkLayer::Other("unspecified".into())
}

/// An open device: its context, protection domain and the port in use.
/// Freed when the last [`Device`], [`PendingQps`] or [`SysVerbs`] made from
/// it is dropped (PD deallocated, then the device closed).
struct Context {
    name: String,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    port: u8,
    gid: [u8; 16],
    gid_index: u32,
    lid: u16,
    mtu: ibv_mtu::Type,
    link_layer: LinkLayer,
    max_cqe: u32,
    max_qp_wr: u32,
}

// SAFETY: the context and PD are only used through libibverbs calls, which
// are thread safe (rdma-core documents every verb as callable from any
// thread; providers lock their queues internally). Nothing else is mutated
// after construction.
unsafe impl Send for Context {}
// SAFETY: as for Send: shared use goes through thread-safe verbs only.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every QP, CQ and MR made from this PD and context belongs
        // to a QpSet or SysVerbs holding an Arc of this Context, so all of
        // them are gone by now; the PD goes before the device is closed.
        unsafe {
            let ret = ibv_dealloc_pd(self.pd);
            if ret != 0 {
                tracing::warn!(device = %self.name, "ibv_dealloc_pd failed: {}", io::Error::from_raw_os_error(ret.abs()));
            }
            if ibv_close_device(self.ctx) != 0 {
                tracing::warn!(device = %self.name, "ibv_close_device failed: {}", io::Error::last_os_error());
            }
        }
    }
}

/// An open RDMA device, ready to create queue pairs on one port.
pub struct Device {
    inner: Arc<Context>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.inner.name)
            .field("port", &self.inner.port)
            .field("gid_index", &self.inner.gid_index)
            .field("mtu", &self.mtu())
            .field("link_layer", &self.inner.link_layer)
            .finish()
    }
}

impl Device {
    /// Opens device `name` (as listed by [`devices`]), checks that `port` is
    /// ACTIVE and reads the GID at `gid_index` (RoCE v2 needs the index of
    /// an IPv4 or IPv6 GID: see `show_gids`).
    pub fn open(name: &str, port: u8, gid_index: u32) -> Result<Device, SetupError> {
        let ctx = open_context(name)?;
        // From here on `ctx` must be closed on every error path: the
        // Context's Drop does that once the PD exists.
        // SAFETY: `ctx` is an open device context.
        let pd = unsafe { ibv_alloc_pd(ctx) };
        if pd.is_null() {
            let err = io::Error::last_os_error();
            // SAFETY: `ctx` is open and nothing was created on it.
            unsafe { ibv_close_device(ctx) };
            return Err(verb_error(
                &format!("ibv_alloc_pd({name})"),
                err,
                "the device is out of resources or its driver is unhealthy (dmesg)",
            ));
        }
        let mut context = Context {
            name: name.to_string(),
            ctx,
            pd,
            port,
            gid: [0; 16],
            gid_index,
            lid: 0,
            mtu: ibv_mtu::IBV_MTU_1024,
            link_layer: unspecified(),
            max_cqe: 0,
            max_qp_wr: 0,
        };

        // SAFETY: ibv_device_attr is plain data (integers and arrays), for
        // which all-zero is valid; ibv_query_device fills it.
        let mut dev_attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `dev_attr` a valid out-pointer.
        let ret = unsafe { ibv_query_device(ctx, &mut dev_attr) };
        check(
            ret,
            &format!("ibv_query_device({name})"),
            "the driver is unhealthy (dmesg)",
        )?;
        context.max_cqe = u32::try_from(dev_attr.max_cqe).unwrap_or(0);
        context.max_qp_wr = u32::try_from(dev_attr.max_qp_wr).unwrap_or(0);

        // SAFETY: ibv_port_attr is plain data; all-zero is valid.
        let mut port_attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open and `port_attr` a valid out-pointer of the
        // full, current struct size (what ___ibv_query_port passes on).
        let ret = unsafe { ___ibv_query_port(ctx, port, &mut port_attr) };
        check(
            ret,
            &format!("ibv_query_port({name}, port {port})"),
            "does the device have this port? (ibv_devinfo lists them, from 1)",
        )?;
        if port_attr.state != ibv_port_state::IBV_PORT_ACTIVE {
            return Err(SetupError::Unusable(format!(
                "port {port} of {name} is {}, not ACTIVE; check the cable and the link \
                 (ibv_devinfo, ip link), or choose another port or device",
                port_state_name(port_attr.state)
            )));
        }
        context.mtu = port_attr.active_mtu;
        if mtu_bytes(context.mtu).is_none() {
            return Err(SetupError::Unusable(format!(
                "port {port} of {name} reports an unknown active MTU ({}); the driver is \
                 newer than these bindings?",
                port_attr.active_mtu
            )));
        }
        context.lid = port_attr.lid;
        context.link_layer = match port_attr.link_layer {
            LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => unspecified(),
        };

        let index = c_int::try_from(gid_index)
            .map_err(|_| SetupError::Unusable(format!("GID index {gid_index} is out of range")))?;
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: `ctx` is open and `gid` a valid out-pointer.
        let ret = unsafe { ibv_query_gid(ctx, port, index, &mut gid) };
        check(
            ret,
            &format!("ibv_query_gid({name}, port {port}, index {gid_index})"),
            "is the GID index within the port's table? (show_gids, ibv_devinfo -v)",
        )?;
        // SAFETY: both union members are plain bytes of the same size.
        context.gid = unsafe { gid.raw };
        if context.gid == [0; 16] {
            return Err(SetupError::Unusable(format!(
                "GID {gid_index} of {name} port {port} is empty; pick the index of a \
                 configured GID (RoCE v2: an IPv4 or IPv6 address on the netdev; see show_gids)"
            )));
        }
        Ok(Device {
            inner: Arc::new(context),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The port's active MTU in bytes.
    pub fn mtu(&self) -> u32 {
        mtu_bytes(self.inner.mtu).unwrap_or(0)
    }

    /// The port's link layer.
    pub fn link_layer(&self) -> &LinkLayer {
        &self.inner.link_layer
    }

    /// The GID in use.
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid
    }

    /// Creates `n` RC queue pairs sharing one completion queue, moves them to
    /// INIT (remote write allowed) and gives each a random 24-bit PSN.
    pub fn create_qps(
        &self,
        n: u32,
        send_depth: u32,
        recv_depth: u32,
    ) -> Result<PendingQps, SetupError> {
        let c = &self.inner;
        if n == 0 || send_depth == 0 || recv_depth == 0 {
            return Err(SetupError::Unusable(format!(
                "create_qps: need at least one queue pair and one WR each way \
                 (n {n}, send {send_depth}, recv {recv_depth})"
            )));
        }
        if c.max_qp_wr != 0 && send_depth.max(recv_depth) > c.max_qp_wr {
            return Err(SetupError::Unusable(format!(
                "create_qps: queue depth {} above {}'s max_qp_wr {}; use smaller queues",
                send_depth.max(recv_depth),
                c.name,
                c.max_qp_wr
            )));
        }
        // Every WR of every QP may complete (a failed unsignalled write
        // does), so the CQ holds them all and cannot overrun.
        let want = u64::from(n) * (u64::from(send_depth) + u64::from(recv_depth));
        let depth = want.max(u64::from(CQ_MIN_DEPTH).min(u64::from(c.max_cqe.max(1))));
        if c.max_cqe != 0 && depth > u64::from(c.max_cqe) {
            return Err(SetupError::Unusable(format!(
                "create_qps: {n} queue pairs x ({send_depth} + {recv_depth}) WRs need a \
                 completion queue of {depth}, above {}'s max_cqe {}; use fewer or smaller queues",
                c.name, c.max_cqe
            )));
        }
        let depth = c_int::try_from(depth).map_err(|_| {
            SetupError::Unusable(format!(
                "create_qps: completion queue depth {depth} is too large"
            ))
        })?;
        // SAFETY: the context is open; no channel, no vector, no user context.
        let cq = unsafe { ibv_create_cq(c.ctx, depth, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(verb_error(
                &format!("ibv_create_cq({}, depth {depth})", c.name),
                io::Error::last_os_error(),
                "locked memory limit too low (ulimit -l; set memlock unlimited) or the \
                 device is out of CQs",
            ));
        }
        let mut set = QpSet {
            ctx: Arc::clone(&self.inner),
            cq,
            qps: Vec::with_capacity(n as usize),
            psns: Vec::with_capacity(n as usize),
            send_depth,
        };
        for _ in 0..n {
            // SAFETY: ibv_qp_init_attr is plain data (pointers and
            // integers); all-zero (null pointers) is valid.
            let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = ibv_qp_type::IBV_QPT_RC;
            init.sq_sig_all = 0;
            init.cap.max_send_wr = send_depth;
            init.cap.max_recv_wr = recv_depth;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            // SAFETY: the PD is live and `init` names our live CQ.
            let qp = unsafe { ibv_create_qp(c.pd, &mut init) };
            if qp.is_null() {
                return Err(verb_error(
                    &format!(
                        "ibv_create_qp({}, RC, send {send_depth}, recv {recv_depth})",
                        c.name
                    ),
                    io::Error::last_os_error(),
                    "queue depths above the device limits (ibv_devinfo -v) or locked memory \
                     limit too low (ulimit -l)",
                ));
            }
            set.qps.push(qp);
            set.psns.push(rand::random::<u32>() & 0x00ff_ffff);

            // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
            let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
            attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
            attr.pkey_index = 0;
            attr.port_num = c.port;
            attr.qp_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ibv_qp_attr_mask::IBV_QP_PORT
                | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
            // SAFETY: `qp` is live and `attr` is valid for the fields in `mask`.
            let ret = unsafe { ibv_modify_qp(qp, &mut attr, mask.0 as c_int) };
            check(
                ret,
                &format!("ibv_modify_qp(INIT, {} port {})", c.name, c.port),
                "wrong port number or P_Key index 0 not valid on this port",
            )?;
        }
        Ok(PendingQps { set })
    }
}

fn open_context(name: &str) -> Result<*mut ibv_context, SetupError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below, after
    // the device was opened (an open context stays valid).
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(SetupError::Unusable(format!(
            "no RDMA device: ibv_get_device_list failed: {} (kernel lacks RDMA support?)",
            io::Error::last_os_error()
        )));
    }
    let mut found = None;
    let mut names = String::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        let dev_name = device_name(dev);
        if dev_name == name {
            found = Some(dev);
        }
        let _ = write!(
            names,
            "{}{dev_name}",
            if names.is_empty() { "" } else { ", " }
        );
    }
    let result = match found {
        None if names.is_empty() => Err(SetupError::Unusable(format!(
            "no RDMA device: ibv_get_device_list found none, so not {name} (kernel lacks RDMA support?)"
        ))),
        None => Err(SetupError::Unusable(format!("no RDMA device named {name}; present: {names}"))),
        Some(dev) => {
            // SAFETY: `dev` is an entry of the live list.
            let ctx = unsafe { ibv_open_device(dev) };
            if ctx.is_null() {
                Err(verb_error(
                    &format!("ibv_open_device({name})"),
                    io::Error::last_os_error(),
                    "is /dev/infiniband/uverbs* accessible to this user?",
                ))
            } else {
                Ok(ctx)
            }
        }
    };
    // SAFETY: freed once; opened contexts do not depend on the list.
    unsafe { ibv_free_device_list(list) };
    result
}

/// Queue pairs and the completion queue they share; destroyed in that order.
struct QpSet {
    ctx: Arc<Context>,
    cq: *mut ibv_cq,
    qps: Vec<*mut ibv_qp>,
    psns: Vec<u32>,
    send_depth: u32,
}

// SAFETY: the QPs and CQ are used only through libibverbs' thread-safe
// verbs (post_send, post_recv, poll_cq lock inside the provider); the Vecs
// are not mutated after construction except in Drop, which has `&mut self`.
unsafe impl Send for QpSet {}
// SAFETY: as for Send.
unsafe impl Sync for QpSet {}

impl QpSet {
    /// The QP numbers, in our 0-based order.
    fn qpns(&self) -> Vec<u32> {
        self.qps
            .iter()
            .map(|&qp| {
                // SAFETY: `qp` is live (destroyed only with `&mut self`);
                // qp_num is set at creation and never changes.
                unsafe { (*qp).qp_num }
            })
            .collect()
    }

    fn destroy_qps(&mut self) {
        for qp in self.qps.drain(..) {
            // SAFETY: `qp` is live and destroyed once (drained).
            let ret = unsafe { ibv_destroy_qp(qp) };
            if ret != 0 {
                tracing::warn!(device = %self.ctx.name, "ibv_destroy_qp failed: {}", io::Error::from_raw_os_error(ret.abs()));
            }
        }
    }
}

impl Drop for QpSet {
    fn drop(&mut self) {
        self.destroy_qps();
        // SAFETY: no QP uses the CQ any more; destroyed once. The context
        // (PD, device) outlives this through `ctx`.
        let ret = unsafe { ibv_destroy_cq(self.cq) };
        if ret != 0 {
            tracing::warn!(device = %self.ctx.name, "ibv_destroy_cq failed: {}", io::Error::from_raw_os_error(ret.abs()));
        }
    }
}

/// Queue pairs in INIT, waiting for the peer's [`Local`].
pub struct PendingQps {
    set: QpSet,
}

impl PendingQps {
    /// What to send to the peer.
    pub fn local(&self) -> Local {
        let c = &self.set.ctx;
        Local {
            gid: c.gid,
            gid_index: c.gid_index,
            mtu: mtu_bytes(c.mtu).unwrap_or(256),
            port: c.port,
            lid: c.lid,
            qps: self
                .set
                .qpns()
                .into_iter()
                .zip(&self.set.psns)
                .map(|(qpn, &psn)| QpInfo { qpn, psn })
                .collect(),
        }
    }

    /// Connects queue pair i to the peer's queue pair i (INIT -> RTR -> RTS).
    pub fn connect(self, remote: &Local) -> Result<SysVerbs, SetupError> {
        let c = Arc::clone(&self.set.ctx);
        if remote.qps.len() != self.set.qps.len() {
            return Err(SetupError::Unusable(format!(
                "the peer has {} queue pairs and we have {}: both ends must create as many",
                remote.qps.len(),
                self.set.qps.len()
            )));
        }
        let Some(remote_mtu) = mtu_enum(remote.mtu) else {
            return Err(SetupError::Unusable(format!(
                "the peer sent MTU {}, not one of 256, 512, 1024, 2048, 4096",
                remote.mtu
            )));
        };
        let path_mtu = c.mtu.min(remote_mtu);
        let sgid_index = u8::try_from(c.gid_index).map_err(|_| {
            SetupError::Unusable(format!(
                "GID index {} does not fit the address vector (max 255)",
                c.gid_index
            ))
        })?;
        for (i, (&qp, peer)) in self.set.qps.iter().zip(&remote.qps).enumerate() {
            // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
            let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
            attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
            attr.path_mtu = path_mtu;
            attr.dest_qp_num = peer.qpn;
            attr.rq_psn = peer.psn & 0x00ff_ffff;
            attr.max_dest_rd_atomic = 1;
            attr.min_rnr_timer = 12;
            attr.ah_attr.is_global = 1;
            attr.ah_attr.dlid = remote.lid;
            attr.ah_attr.sl = 0;
            attr.ah_attr.src_path_bits = 0;
            attr.ah_attr.port_num = c.port;
            attr.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.sgid_index = sgid_index;
            attr.ah_attr.grh.hop_limit = 64;
            attr.ah_attr.grh.flow_label = 0;
            attr.ah_attr.grh.traffic_class = 0;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_AV
                | ibv_qp_attr_mask::IBV_QP_PATH_MTU
                | ibv_qp_attr_mask::IBV_QP_DEST_QPN
                | ibv_qp_attr_mask::IBV_QP_RQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
            // SAFETY: `qp` is live (in INIT) and `attr` is valid for `mask`.
            let ret = unsafe { ibv_modify_qp(qp, &mut attr, mask.0 as c_int) };
            check(
                ret,
                &format!(
                    "ibv_modify_qp(RTR, {} QP {i} -> peer QPN {})",
                    c.name, peer.qpn
                ),
                "wrong GID index (RoCE v2 needs an IPv4/IPv6 GID, see show_gids), peer \
                 GID not reachable from this port, or MTU above the port's",
            )?;

            // SAFETY: ibv_qp_attr is plain data; all-zero is valid.
            let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
            attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
            attr.timeout = 14;
            attr.retry_cnt = 7;
            attr.rnr_retry = 7;
            attr.sq_psn = self.set.psns[i];
            attr.max_rd_atomic = 1;
            let mask = ibv_qp_attr_mask::IBV_QP_STATE
                | ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ibv_qp_attr_mask::IBV_QP_SQ_PSN
                | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
            // SAFETY: `qp` is live (in RTR) and `attr` is valid for `mask`.
            let ret = unsafe { ibv_modify_qp(qp, &mut attr, mask.0 as c_int) };
            check(
                ret,
                &format!("ibv_modify_qp(RTS, {} QP {i})", c.name),
                "the driver refused the retry/timeout settings (dmesg)",
            )?;
        }
        let qpns = self.set.qpns();
        let errored = self
            .set
            .qps
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        Ok(SysVerbs {
            mrs: Mutex::new(Vec::new()),
            qpns,
            errored,
            set: self.set,
        })
    }
}

/// Send and receive queue depth of every queue pair a [`SysNic`] makes:
/// above the ring's slots per queue pair, so neither queue ever fills.
const LINK_DEPTH: u32 = 256;

/// One device and port, making queue pairs for the connections of a node
/// (the [`Nic`] of the queue-pair exchange).
#[derive(Debug)]
pub struct SysNic {
    device: Device,
}

impl SysNic {
    /// Opens device `name` ([`Device::open`]).
    pub fn open(name: &str, port: u8, gid_index: u32) -> Result<SysNic, SetupError> {
        Ok(SysNic {
            device: Device::open(name, port, gid_index)?,
        })
    }
}

impl Nic for SysNic {
    fn prepare(&self, qps: u32) -> Result<Box<dyn PendingLink>, SetupError> {
        Ok(Box::new(
            self.device.create_qps(qps, LINK_DEPTH, LINK_DEPTH)?,
        ))
    }
}

impl PendingLink for PendingQps {
    fn local(&self) -> Local {
        PendingQps::local(self)
    }

    fn connect(self: Box<Self>, remote: &Local) -> Result<Arc<dyn Verbs>, SetupError> {
        Ok(Arc::new(PendingQps::connect(*self, remote)?))
    }
}

/// A registered memory region, deregistered when the [`SysVerbs`] drops.
struct Mr(*mut ibv_mr);

// SAFETY: an ibv_mr handle is only passed to ibv_dereg_mr, once, from Drop
// of the owning SysVerbs; it carries no thread affinity.
unsafe impl Send for Mr {}

/// The data plane of one connected set of queue pairs.
///
/// `Send + Sync`: `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and
/// `ibv_reg_mr` are thread safe in libibverbs (providers take their own
/// per-queue locks), and our own state is a `Mutex` (the MR list) and
/// atomics (which QPs saw an error).
///
/// Dropping it destroys the queue pairs, deregisters the memory regions,
/// destroys the completion queue and, with the last user of the device,
/// deallocates the protection domain and closes the device.
pub struct SysVerbs {
    mrs: Mutex<Vec<Mr>>,
    /// The QPN of each of our queue pairs, by 0-based index.
    qpns: Vec<u32>,
    /// Queue pairs that completed a work request with an error (and so are
    /// in the error state: every later WR is flushed).
    errored: Vec<AtomicBool>,
    set: QpSet,
}

impl Drop for SysVerbs {
    fn drop(&mut self) {
        // QPs first (nothing can use an MR after that), then the MRs; the
        // CQ goes with `set`, the PD and device with the last Arc<Context>.
        self.set.destroy_qps();
        let mrs = std::mem::take(self.mrs.get_mut().unwrap_or_else(|e| e.into_inner()));
        for Mr(mr) in mrs {
            // SAFETY: `mr` came from ibv_reg_mr and is deregistered once.
            let ret = unsafe { ibv_dereg_mr(mr) };
            if ret != 0 {
                tracing::warn!(device = %self.set.ctx.name, "ibv_dereg_mr failed: {}", io::Error::from_raw_os_error(ret.abs()));
            }
        }
    }
}

impl SysVerbs {
    fn qp(&self, qp: u32) -> Result<*mut ibv_qp, VerbsError> {
        let ptr = *self.set.qps.get(qp as usize).ok_or(VerbsError::NoQp(qp))?;
        if self.errored[qp as usize].load(Ordering::Acquire) {
            return Err(VerbsError::QpError(qp));
        }
        Ok(ptr)
    }

    fn post_error(&self, verb: &str, qp: u32, ret: c_int) -> VerbsError {
        let errno = if ret > 0 {
            ret
        } else {
            io::Error::last_os_error().raw_os_error().unwrap_or(0)
        };
        if errno == libc::ENOMEM {
            return VerbsError::QueueFull(qp);
        }
        if self.errored[qp as usize].load(Ordering::Acquire) {
            return VerbsError::QpError(qp);
        }
        VerbsError::Os(verb_error_text(
            &format!("{verb}({} QP {qp})", self.set.ctx.name),
            io::Error::from_raw_os_error(errno),
            "the queue pair is not in RTS, or the WR exceeds its limits",
        ))
    }

    fn completion(&self, wc: &ibv_wc) -> Option<Completion> {
        let Some(qp) = self.qpns.iter().position(|&n| n == wc.qp_num) else {
            tracing::warn!(
                qpn = wc.qp_num,
                "completion for a queue pair not of this connection"
            );
            return None;
        };
        let status = match wc.status {
            ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
            ibv_wc_status::IBV_WC_LOC_PROT_ERR => WcStatus::LocalProtection,
            ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::ReceiverNotReady,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
            ibv_wc_status::IBV_WC_RETRY_EXC_ERR => WcStatus::Transport,
            n => WcStatus::Other(n),
        };
        if status != WcStatus::Success {
            self.errored[qp].store(true, Ordering::Release);
        }
        // On a failed WR the verbs spec leaves `opcode` undefined; receive
        // opcodes carry the IBV_WC_RECV bit, so that is the best guess.
        let kind = if wc.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
            || (status != WcStatus::Success && wc.opcode & ibv_wc_opcode::IBV_WC_RECV != 0)
        {
            let imm = if status == WcStatus::Success && wc.wc_flags & WC_WITH_IMM != 0 {
                // SAFETY: both union members are u32; with IBV_WC_WITH_IMM
                // set, imm_data is the one written.
                u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
            } else {
                0
            };
            let byte_len = if status == WcStatus::Success {
                wc.byte_len
            } else {
                0
            };
            WcKind::RecvImm { imm, byte_len }
        } else {
            if status == WcStatus::Success && wc.opcode != ibv_wc_opcode::IBV_WC_RDMA_WRITE {
                tracing::warn!(opcode = wc.opcode, "unexpected completion opcode");
            }
            WcKind::Write
        };
        Some(Completion {
            qp: qp as u32,
            wr_id: wc.wr_id,
            status,
            kind,
        })
    }
}

impl Verbs for SysVerbs {
    fn register(&self, addr: u64, len: u64, access: Access) -> Result<Region, VerbsError> {
        let flags = match access {
            // No flags at all: local read only, the one registration that
            // works on a read-only MAP_SHARED file mapping (Linux >= 6.5).
            Access::LocalRead => 0,
            Access::RemoteWrite => {
                (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                    | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
                    .0
            }
        };
        let length = usize::try_from(len)
            .map_err(|_| VerbsError::Os(format!("ibv_reg_mr: length {len} too large")))?;
        // SAFETY: registration only pins and maps the pages; the caller
        // keeps `addr..addr+len` mapped while the region is in use (the
        // Verbs contract), and a bad range makes ibv_reg_mr fail (EFAULT),
        // not touch memory.
        let mr = unsafe {
            ibv_reg_mr(
                self.set.ctx.pd,
                addr as *mut libc::c_void,
                length,
                flags as c_int,
            )
        };
        if mr.is_null() {
            let err = io::Error::last_os_error();
            let hint = match (access, err.raw_os_error()) {
                (Access::RemoteWrite, Some(libc::EFAULT)) => {
                    "a writable registration of a MAP_SHARED file mapping fails since Linux 6.5: \
                     register anonymous or hugepage memory"
                }
                (_, Some(libc::ENOMEM)) | (_, Some(libc::EPERM)) => {
                    "locked memory limit too low (ulimit -l; set memlock unlimited)"
                }
                _ => "is the whole range mapped?",
            };
            return Err(VerbsError::Os(verb_error_text(
                &format!("ibv_reg_mr({}, {len} bytes, {access:?})", self.set.ctx.name),
                err,
                hint,
            )));
        }
        // SAFETY: `mr` is a live registration; lkey and rkey are set by
        // ibv_reg_mr and never change.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        self.mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Mr(mr));
        Ok(Region {
            addr,
            len,
            lkey,
            rkey,
        })
    }

    fn post_write_imm(&self, qp: u32, wr: WriteImm) -> Result<(), VerbsError> {
        let ptr = self.qp(qp)?;
        let mut sge = ibv_sge {
            addr: wr.local_addr,
            length: wr.len,
            lkey: wr.lkey,
        };
        // SAFETY: ibv_send_wr is plain data (pointers, integers, unions of
        // them); all-zero (null `next`, no flags) is valid.
        let mut send: ibv_send_wr = unsafe { std::mem::zeroed() };
        send.wr_id = wr.wr_id;
        send.next = ptr::null_mut();
        send.sg_list = &mut sge;
        send.num_sge = if wr.len == 0 { 0 } else { 1 };
        send.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
        send.send_flags = if wr.signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        send.imm_data_invalidated_rkey_union.imm_data = wr.imm.to_be();
        send.wr.rdma.remote_addr = wr.remote_addr;
        send.wr.rdma.rkey = wr.rkey;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: `ptr` is a live QP of ours; `send` and `sge` outlive the
        // call (the provider copies the WR into its queue before returning).
        let ret = unsafe { ibv_post_send(ptr, &mut send, &mut bad) };
        if ret != 0 {
            return Err(self.post_error("ibv_post_send", qp, ret));
        }
        Ok(())
    }

    fn post_recv(&self, qp: u32, wr_id: u64) -> Result<(), VerbsError> {
        let ptr = self.qp(qp)?;
        // A WRITE_WITH_IMM consumes a receive WR but writes no byte into
        // it, so the WR has no scatter entries.
        let mut recv = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: `ptr` is a live QP of ours; `recv` outlives the call.
        let ret = unsafe { ibv_post_recv(ptr, &mut recv, &mut bad) };
        if ret != 0 {
            return Err(self.post_error("ibv_post_recv", qp, ret));
        }
        Ok(())
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) {
        const BATCH: usize = 32;
        let mut wcs = MaybeUninit::<[ibv_wc; BATCH]>::uninit();
        let base = wcs.as_mut_ptr().cast::<ibv_wc>();
        let mut left = max;
        while left > 0 {
            let want = left.min(BATCH);
            // SAFETY: the CQ is live and `base` has room for `want` entries.
            let got = unsafe { ibv_poll_cq(self.set.cq, want as c_int, base) };
            if got < 0 {
                tracing::warn!(device = %self.set.ctx.name, "ibv_poll_cq failed ({got}); the completion queue is in error");
                return;
            }
            let got = got as usize;
            for i in 0..got {
                // SAFETY: ibv_poll_cq initialised the first `got` entries.
                let wc = unsafe { &*base.add(i) };
                if let Some(c) = self.completion(wc) {
                    out.push(c);
                }
            }
            left -= got;
            if got < want {
                break;
            }
        }
    }

    fn send_depth(&self) -> u32 {
        self.set.send_depth
    }

    fn qps(&self) -> u32 {
        self.set.qps.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    #[test]
    fn mtu_round_trips() {
        for bytes in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_enum(bytes).unwrap()), Some(bytes));
        }
        assert_eq!(mtu_enum(1500), None);
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
    }

    #[test]
    fn local_travels_as_postcard_and_json() {
        let local = Local {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            gid_index: 3,
            mtu: 4096,
            port: 1,
            lid: 0,
            qps: vec![
                QpInfo {
                    qpn: 0x11,
                    psn: 0xab_cdef,
                },
                QpInfo { qpn: 0x12, psn: 1 },
            ],
        };
        let bytes = postcard::to_stdvec(&local).unwrap();
        assert_eq!(postcard::from_bytes::<Local>(&bytes).unwrap(), local);
        let json = serde_json::to_string(&local).unwrap();
        assert_eq!(serde_json::from_str::<Local>(&json).unwrap(), local);
    }

    /// Errors are one line naming the verb; without a device, that is what
    /// a caller falling back to QUIC gets to print.
    #[test]
    fn missing_device_is_one_clear_line() {
        match devices() {
            Ok(names) => assert!(!names.is_empty()),
            Err(e) => {
                let e = e.to_string();
                assert!(e.starts_with("no RDMA device"), "{e}");
                assert!(!e.contains('\n'), "{e}");
            }
        }
        if devices().is_err() {
            let e = Device::open("nosuchdev0", 1, 0).unwrap_err().to_string();
            assert!(e.starts_with("no RDMA device"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
        match std::env::var(key) {
            Ok(v) => v
                .parse()
                .unwrap_or_else(|_| panic!("{key}={v} is not valid")),
            Err(_) => default,
        }
    }

    /// Two queue-pair sets on one device, connected to each other: four
    /// WRITE_WITH_IMM of a read-only file mapping into a 16 MiB ring, each
    /// chunk to another slot, with the slot as the immediate value.
    #[test]
    #[ignore = "needs an RDMA device (RoCE or InfiniBand); run scripts/rdma-selftest.sh"]
    fn loopback_write_imm() {
        const MIB: usize = 1 << 20;
        const SLOT: usize = 4 * MIB;
        const QPS: u32 = 4;
        let name = match std::env::var("XFER_RDMA_DEVICE") {
            Ok(n) => n,
            Err(_) => devices().expect("an RDMA device").remove(0),
        };
        let port: u8 = env_or("XFER_RDMA_PORT", 1);
        let gid_index: u32 = env_or("XFER_RDMA_GID_INDEX", 0);
        let dev = Device::open(&name, port, gid_index).expect("open the device");
        eprintln!("loopback over {dev:?}");

        let a = dev.create_qps(QPS, 16, 16).expect("sender QPs");
        let b = dev.create_qps(QPS, 16, 16).expect("receiver QPs");
        let (la, lb) = (a.local(), b.local());
        assert_eq!(la.qps.len(), QPS as usize);
        assert!(la.qps.iter().all(|q| q.psn <= 0x00ff_ffff));
        let sender = a.connect(&lb).expect("connect the sender");
        let receiver = b.connect(&la).expect("connect the receiver");
        assert_eq!((sender.qps(), sender.send_depth()), (QPS, 16));

        // The source as in production: a read-only shared file mapping.
        let mut file = tempfile::tempfile().unwrap();
        let pattern: Vec<u8> = (0..SLOT)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        file.write_all(&pattern).unwrap();
        // SAFETY: the temporary file is ours alone and not changed while mapped.
        let src = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let src_mr = sender
            .register(src.as_ptr() as u64, SLOT as u64, Access::LocalRead)
            .expect("register the read-only source");
        // The ring: anonymous memory, written by the peer.
        let ring = memmap2::MmapMut::map_anon(4 * SLOT).unwrap();
        let ring_mr = receiver
            .register(ring.as_ptr() as u64, ring.len() as u64, Access::RemoteWrite)
            .expect("register the ring");

        for qp in 0..QPS {
            for k in 0..4 {
                receiver.post_recv(qp, u64::from(qp * 100 + k)).unwrap();
            }
        }
        // Chunk i: 1 MiB minus a little, from source offset i MiB, to slot
        // 3 - i, on QP i; only chunks 1 and 3 ask for a completion.
        let chunk = |i: usize| (i * MIB, MIB - 4099 * i, 3 - i);
        for i in 0..4 {
            let (off, len, slot) = chunk(i);
            sender
                .post_write_imm(
                    i as u32 % QPS,
                    WriteImm {
                        wr_id: 1000 + i as u64,
                        local_addr: src_mr.addr + off as u64,
                        len: len as u32,
                        lkey: src_mr.lkey,
                        remote_addr: ring_mr.addr + (slot * SLOT) as u64,
                        rkey: ring_mr.rkey,
                        imm: slot as u32,
                        signaled: i % 2 == 1,
                    },
                )
                .unwrap();
        }

        let (mut sent, mut landed) = (Vec::new(), Vec::new());
        let deadline = Instant::now() + Duration::from_secs(10);
        while (sent.len() < 2 || landed.len() < 4) && Instant::now() < deadline {
            sender.poll(&mut sent, 16);
            receiver.poll(&mut landed, 16);
        }
        for c in sent.iter().chain(&landed) {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
        let mut sent_ids: Vec<u64> = sent.iter().map(|c| c.wr_id).collect();
        sent_ids.sort_unstable();
        assert_eq!(sent_ids, [1001, 1003], "signalled writes only: {sent:?}");
        assert!(sent.iter().all(|c| c.kind == WcKind::Write));
        assert_eq!(landed.len(), 4, "receive completions: {landed:?}");
        std::sync::atomic::fence(Ordering::SeqCst);
        for c in &landed {
            let WcKind::RecvImm { imm, byte_len } = c.kind else {
                panic!("not a receive: {c:?}");
            };
            let i = 3 - imm as usize;
            let (off, len, slot) = chunk(i);
            assert_eq!(c.qp, i as u32 % QPS, "{c:?}");
            assert_eq!(
                c.wr_id,
                u64::from(c.qp * 100),
                "first receive of its QP: {c:?}"
            );
            assert_eq!(byte_len as usize, len, "{c:?}");
            let dst = &ring[slot * SLOT..(slot + 1) * SLOT];
            assert!(
                dst[..len] == pattern[off..off + len],
                "slot {slot}: bytes differ"
            );
            assert!(
                dst[len..].iter().all(|&b| b == 0),
                "slot {slot}: written past the chunk"
            );
        }
        let mut imms: Vec<u32> = landed
            .iter()
            .map(|c| match c.kind {
                WcKind::RecvImm { imm, .. } => imm,
                WcKind::Write => u32::MAX,
            })
            .collect();
        imms.sort_unstable();
        assert_eq!(imms, [0, 1, 2, 3]);
        // Queue pairs and registrations go before the memory they cover.
        drop((sender, receiver));
        drop((src, ring));
    }
}
