//! `xfer ca`: the operator's certificate authority on the command line.
//! Each command says what it wrote and what to do next.

use std::process::ExitCode;

use anyhow::{anyhow, Result};

use super::args::CaCmd;
use xfer::config::auth::ca::CaDir;
use xfer::config::auth::identity::{Identity, Role};
use xfer_proto::names::NodeName;

/// Runs one `xfer ca` command.
pub fn run(cmd: CaCmd) -> Result<ExitCode> {
    match cmd {
        CaCmd::Init { dir, force } => {
            let id = CaDir::new(&dir).init(force)?;
            println!(
                "created the CA of cluster {} in {} (keep ca.key there, on no node); next: `xfer ca issue NODE --dir {} --out NODE.cred` for every node",
                id.short(),
                dir.display(),
                dir.display()
            );
        }
        CaCmd::Issue {
            name,
            dir,
            out,
            role,
            days,
            force,
        } => {
            let name = NodeName::new(&name).map_err(|e| anyhow!("{e}"))?;
            let role = Role::parse(&role).expect("clap allows only node and operator");
            let issued = CaDir::new(&dir).issue(&Identity { name, role }, days, &out, force)?;
            println!(
                "wrote {} for {}, cluster {}, valid until {} (UTC){}; copy it to that machine only (mode 0600){}",
                out.display(),
                issued.identity,
                issued.cluster.short(),
                issued.not_after.date(),
                if issued.rotating { ", trusting the old and the new CA" } else { "" },
                match role {
                    Role::Node => ", and pass it to `xfer serve --key`",
                    Role::Operator => ", and name it as the cluster file's key",
                }
            );
        }
        CaCmd::Rotate { dir, finish: false } => {
            let rotated = CaDir::new(&dir).rotate()?;
            let id = rotated.id;
            if let Some(what) = &rotated.recovered {
                println!("{what}");
            }
            println!(
                "new CA {}; the old one stays trusted. Next: reissue every credential (`xfer ca issue NAME --dir {} --out FILE --force`), reload each agent (`systemctl reload xfer-agent`, or kill -HUP), then `xfer ca rotate --finish --dir {}` and reissue once more",
                id.short(),
                dir.display(),
                dir.display()
            );
        }
        CaCmd::Rotate { dir, finish: true } => {
            let id = CaDir::new(&dir).finish()?;
            println!(
                "credentials issued from now on trust only CA {}; reissue every credential and reload each agent, and the old CA is refused everywhere",
                id.short()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
