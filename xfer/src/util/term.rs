//! The width of the terminal a stream writes to, read with `TIOCGWINSZ`:
//! `None` when the stream is not a terminal (then lines are not cut to a
//! width, for scripts and pipes).

use std::io::IsTerminal;
use std::os::fd::AsRawFd;

/// The narrowest width output is fitted to, even on a smaller terminal.
pub const MIN_WIDTH: usize = 40;

fn width_of(fd: i32) -> Option<usize> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills a winsize we own; a failure leaves it zero.
    let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then(|| usize::from(ws.ws_col).max(MIN_WIDTH))
}

/// The columns of the terminal stdout writes to, if it is one.
pub fn stdout_width() -> Option<usize> {
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    width_of(out.as_raw_fd())
}

/// The columns of the terminal stderr writes to, if it is one.
pub fn stderr_width() -> Option<usize> {
    let err = std::io::stderr();
    if !err.is_terminal() {
        return None;
    }
    width_of(err.as_raw_fd())
}
