//! The integration tests on clusters of network namespaces joined by
//! shaped links (`scripts/netcluster.sh`): fan-out at a link's rate,
//! packet loss, partitions and the crash loop, and the data riding the
//! fabric of hosts with two networks. One binary of their own, so that the
//! rest of the suite does not share the machine with their rate
//! measurements. Needs root; each test skips with a note without it.

mod common;

mod fabric;
mod netns;
mod slurm;
mod torture_net;
