//! Readers of the host: `/sys`, `/proc` and a few system calls. Disk,
//! memory and GPUs ([`host`]), interfaces, routes and ports ([`net`]),
//! RDMA ports ([`rdma`]), who a process is ([`proc`]: boot id and start
//! time) and the `xfer doctor` inventory ([`doctor`]).
//! They report facts in the launch service's types and judge nothing.

pub mod doctor;
pub mod host;
pub mod net;
pub mod pagecache;
pub mod proc;
pub mod rdma;
