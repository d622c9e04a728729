//! The Hugging Face Hub side of `xfer pull` (issue 4, in progress): naming a
//! repository and building its URLs ([`repo`]), the environment conventions
//! of `huggingface_hub` ([`env`]), the JSON API and its paging and errors
//! as data ([`api`]), the on-disk cache layout that vLLM and transformers
//! read offline ([`cache`]), and checking a file against the hash the Hub
//! lists for it ([`digest`]). The HTTP client that drives them comes next.

pub mod api;
pub mod cache;
pub mod digest;
pub mod env;
pub mod repo;
