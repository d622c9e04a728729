//! The Hugging Face Hub side of `xfer pull`: naming a repository and
//! building its URLs (`xfer_proto::repo`), the environment conventions of
//! `huggingface_hub` ([`env`]), the JSON API and its paging and errors as
//! data ([`api`]), when to retry ([`retry`]), the HTTP client ([`http`]),
//! ranged parallel downloads with a resume record ([`download`], [`parts`]),
//! checking a file against the hash the Hub lists for it ([`digest`]), and
//! the on-disk cache layout that vLLM and transformers read offline
//! ([`cache`]).

pub mod announce;
pub mod api;
pub mod cache;
pub mod digest;
pub mod download;
pub mod env;
pub mod hold;
pub mod http;
pub mod intake;
pub mod leftovers;
pub mod parts;
pub mod pull;
pub mod ranges;
pub mod retry;
pub mod tree_cache;
