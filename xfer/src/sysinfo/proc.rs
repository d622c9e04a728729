//! Who a process is: this machine's boot id and a process's start time,
//! read from `/proc`. A pid alone names a process only until it exits and
//! the number is handed out again (and every pid starts over at a
//! reboot); the pair (boot id, start time of that pid) names one process
//! for good. The agent records the pair for every process it starts and
//! signals a recorded process group only while the pair still matches
//! ([`crate::agent::ranks::supervisor`]).

use std::io;

/// This boot's id (`/proc/sys/kernel/random/boot_id`): a new random UUID
/// at every boot.
pub fn boot_id() -> io::Result<String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let id = text.trim();
    if id.is_empty() || id.len() > 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/sys/kernel/random/boot_id holds {id:?}, not a boot id"),
        ));
    }
    Ok(id.to_string())
}

/// The fields of `/proc/PID/stat` the agent reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `Z` (zombie), ...
    pub state: char,
    /// Field 5: the process group.
    pub pgrp: u32,
    /// Field 22: when the process started, in clock ticks since boot.
    pub start_ticks: u64,
}

/// Parses the text of `/proc/PID/stat`. Field 2 is the command name in
/// parentheses, and the name may itself hold spaces and `)`, so the other
/// fields are counted from after the LAST `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (head, rest) = text.rsplit_once(')')?;
    head.split_once(" (")?.0.trim().parse::<u32>().ok()?;
    // After the ')': field 3 (state) onwards.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| f.get(n - 3).copied();
    let mut state = field(3)?.chars();
    let (Some(state), None) = (state.next(), state.next()) else {
        return None;
    };
    Some(Stat {
        state,
        pgrp: field(5)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
    })
}

/// `/proc/PID/stat` of a process: `Ok(None)` once no process has that
/// pid.
pub fn stat(pid: u32) -> io::Result<Option<Stat>> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).map(Some).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("cannot parse /proc/{pid}/stat"),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The start time of `pid` (clock ticks since boot), `None` once no
/// process has that pid.
pub fn start_ticks(pid: u32) -> io::Result<Option<u64>> {
    Ok(stat(pid)?.map(|s| s.start_ticks))
}

/// The pids in `/proc`.
pub fn pids() -> io::Result<impl Iterator<Item = u32>> {
    Ok(std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line as the kernel writes it, with `comm` in the parentheses.
    fn line(comm: &str, state: char, pgrp: u32, start: u64) -> String {
        format!(
            "4242 ({comm}) {state} 1 {pgrp} {pgrp} 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
             {start} 123456 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
        )
    }

    #[test]
    fn parses_state_group_and_start_time() {
        let s = parse_stat(&line("sleep", 'S', 4242, 987654)).unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                pgrp: 4242,
                start_ticks: 987654
            }
        );
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_skipped_whole() {
        for comm in ["a b", "x) 1 2 3 (", "))", ") R 9 9 9", "tmux: server", "("] {
            let s = parse_stat(&line(comm, 'Z', 77, 31337)).unwrap();
            assert_eq!(
                (s.state, s.pgrp, s.start_ticks),
                ('Z', 77, 31337),
                "{comm:?}"
            );
        }
    }

    #[test]
    fn refuses_what_is_not_a_stat_line() {
        for bad in [
            "",
            "4242 sleep S 1 2",
            "4242 (sleep)",
            "4242 (sleep) S 1 x 4242",
            "pid (sleep) S 1 2 2 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0 5",
            "4242 (sleep) SS 1 2 2 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0 5",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
        // Field 22 is the last one needed.
        assert!(parse_stat("1 (a) S 1 2 2 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0 5").is_some());
        assert!(parse_stat("1 (a) S 1 2 2 0 -1 0 0 0 0 0 0 0 0 0 0 0 1 0").is_none());
    }

    #[test]
    fn reads_this_process_and_this_boot() {
        let me = std::process::id();
        let s = stat(me).unwrap().unwrap();
        // SAFETY: getpgrp has no preconditions.
        assert_eq!(s.pgrp, unsafe { libc::getpgrp() } as u32);
        assert_eq!(start_ticks(me).unwrap(), Some(s.start_ticks));
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(boot_id().unwrap(), id);
        assert!(pids().unwrap().any(|p| p == me));
    }

    #[test]
    fn a_pid_with_no_process_reads_as_gone() {
        // Beyond the largest pid_max Linux allows (4194304).
        assert_eq!(stat(4_194_305).unwrap(), None);
    }
}
