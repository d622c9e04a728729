//! Background sync owned by the agents: `xfer sync` hands a job to every
//! node's agent and returns; the agents persist it, the source node drives
//! it to completion through restarts, and every agent reports where it
//! stands. [`job`] is the job and its record on disk, [`life`] its states
//! and budget as a state machine with no I/O, [`runner`] the agent's side
//! (rounds, cancel, periodic verify and repair, driving [`life`]),
//! [`round_clock`] where a round's seconds went,
//! [`cause`] what a failed round means (fail now or retry), [`status`] what an agent
//! reports, and [`source`] the source agent's answer to whether a SOURCE
//! is a folder there. The commands that talk to the agents (`xfer sync`,
//! `status`, `cancel`, `rm`, `prune`) are the operator's: `crate::client`.

pub mod cause;
pub mod job;
pub mod life;
#[cfg(test)]
mod life_check;
pub mod round_clock;
pub mod runner;
pub mod source;
pub mod status;
