//! The container keys of `[launch]`: `image`, `gpus` and `shm_size`, and
//! the rule that the last two only come with an image.

use toml::de::DeValue;
use xfer::config::toml_reader::{did_you_mean, int_value, Val};
use xfer_proto::launch::GpuAccess;
use xfer_proto::launch_rules;

use super::launch::Launch;
use super::{ContainerConfig, LaunchError, Parser};

impl Parser<'_> {
    /// `image = "NAME:TAG"`, a reference `docker images` would list.
    pub(super) fn image(&self, v: &Val) -> Result<String, LaunchError> {
        let s = self
            .r
            .string("image", v, "\"nvcr.io/nvidia/vllm:25.09-py3\"")?;
        xfer_proto::image::check_reference(s).map_err(|e| {
            self.err(
                v.span().start,
                format!("image: {e}; write the reference the image has in `docker images` on the operator's machine, like image = \"nvcr.io/nvidia/vllm:25.09-py3\""),
            )
        })?;
        Ok(s.to_string())
    }

    /// `gpus = "all" | "none" | ["DEVICE", ...]`.
    pub(super) fn gpus(&self, v: &Val) -> Result<GpuAccess, LaunchError> {
        let at = v.span().start;
        const FORMS: &str = "gpus = \"all\" (--gpus all, the NVIDIA runtime), gpus = \"none\", or a list of devices, like gpus = [\"nvidia.com/gpu=all\"] or [\"/dev/nvidia0\"]";
        match v.get_ref() {
            DeValue::String(s) => match s.as_ref() {
                "all" => Ok(GpuAccess::All),
                "none" => Ok(GpuAccess::None),
                other => {
                    let hint = did_you_mean(
                        other,
                        &["all", "none"],
                        &[
                            ("yes", "all"),
                            ("no", "none"),
                            ("true", "all"),
                            ("false", "none"),
                        ],
                    )
                    .map(|h| format!("{h} "))
                    .unwrap_or_default();
                    Err(self.err(
                        at,
                        format!("gpus = {other:?} is not a choice; {hint}write {FORMS}"),
                    ))
                }
            },
            DeValue::Array(items) => {
                if items.is_empty() {
                    return Err(self.err(
                        at,
                        "gpus is an empty list; write gpus = \"none\" for no GPU, or list the devices",
                    ));
                }
                let mut devices = Vec::with_capacity(items.len());
                for item in items.iter() {
                    let d = self
                        .r
                        .string("a device in gpus", item, "\"/dev/nvidia0\"")?;
                    if d.is_empty()
                        || d.starts_with('-')
                        || d.contains(|c: char| c.is_whitespace() || c == '\0')
                    {
                        return Err(self.err(
                            item.span().start,
                            format!("gpus lists {d:?}, which is not a device; write a CDI name or a path, like \"nvidia.com/gpu=all\" or \"/dev/nvidia0\""),
                        ));
                    }
                    launch_rules::check_device(d)
                        .map_err(|e| self.err(item.span().start, e.to_string()))?;
                    devices.push(d.to_string());
                }
                Ok(GpuAccess::Devices(devices))
            }
            _ => Err(self
                .r
                .wrong_kind("gpus", v, &format!("write {FORMS}"))
                .into()),
        }
    }

    /// `shm_size = "16GiB"` (or a number of bytes).
    pub(super) fn shm_size(&self, v: &Val) -> Result<u64, LaunchError> {
        let at = v.span().start;
        let n = match v.get_ref() {
            DeValue::String(s) => xfer_proto::units::parse_size(s)
                .map_err(|e| self.err(at, format!("shm_size: {e}")))?,
            DeValue::Integer(i) => u64::try_from(int_value(i)).map_err(|_| {
                self.err(
                    at,
                    "shm_size is negative; write a size, like shm_size = \"16GiB\"",
                )
            })?,
            _ => {
                let fix = "write a size, like shm_size = \"16GiB\"";
                return Err(self.r.wrong_kind("shm_size", v, fix).into());
            }
        };
        if n == 0 {
            return Err(self.err(
                at,
                "shm_size is 0; write a size, like shm_size = \"16GiB\", or remove shm_size for the engine's default",
            ));
        }
        Ok(n)
    }

    /// The container settings: `gpus` and `shm_size` only with `image`.
    pub(super) fn container(&self, l: &Launch) -> Result<Option<ContainerConfig>, LaunchError> {
        let Some(image) = &l.image else {
            if let Some(s) = &l.shm_size {
                return Err(self.err(
                    s.at,
                    "shm_size only applies to the ranks' containers, but [launch] has no image; add image = \"NAME:TAG\", or remove shm_size",
                ));
            }
            if let Some(g) = &l.gpus {
                return Err(self.err(
                    g.at,
                    "gpus only applies to the ranks' containers, but [launch] has no image (on the host every rank sees every GPU); add image = \"NAME:TAG\", or remove gpus",
                ));
            }
            return Ok(None);
        };
        Ok(Some(ContainerConfig {
            image: image.v.clone(),
            gpus: l.gpus.as_ref().map_or(GpuAccess::All, |g| g.v.clone()),
            shm_bytes: l.shm_size.as_ref().map(|s| s.v),
        }))
    }
}
