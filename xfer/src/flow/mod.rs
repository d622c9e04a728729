//! Transfers end to end, over the transport: the receiving side of an
//! accepted offer ([`receiver`]: swarm, policy, fetcher, peer links, the
//! control loop), one transfer into the store ([`receive`]), its links to
//! the other receivers ([`swarm`]), the source's side ([`push`]),
//! fetching a complete model from a peer ([`fetch`]), a Hub pull fanned
//! out to agents while it downloads ([`pull_fanout`]), a container image
//! delivered to nodes ([`image`]), the feed of its draft's events
//! ([`feed`]), and a source node's own copy placed from its disk, outside
//! the swarm ([`local`]).

pub mod artifact_stream;
pub mod coordinator;
pub mod feed;
pub mod fetch;
pub mod image;
pub mod image_pull;
pub mod intake;
pub mod layer_stream;
pub mod local;
pub mod pull_fanout;
pub mod push;
pub mod receive;
pub mod receiver;
pub mod route;
pub mod stream;
pub mod swarm;
pub mod timeline;
