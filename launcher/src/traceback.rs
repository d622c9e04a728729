//! The root cause of a failed rank, in one line: the last line of the
//! first Python traceback in its log (the exception that started it; what
//! follows is the engine dying of it, e.g. vLLM's "EngineCore encountered
//! an issue. See stack trace (above) for the root cause").
//!
//! Engines prefix every line of a logged traceback the same way, with the
//! process (`(EngineCore pid=16072) `) and the logger's fields (`ERROR
//! 12-02 04:06:01 [core.py:1512] `), and other processes' lines may be
//! interleaved. So the prefix is whatever precedes `Traceback (most recent
//! call last):` on its line; the traceback goes on over the lines with
//! that prefix; its frames are indented, and its first line that is not
//! is the exception.

const HEADER: &str = "Traceback (most recent call last):";

/// Lines of a traceback looked at, at most, before giving up on it.
const MAX_LINES: usize = 2_000;

/// The exception line of the first traceback in `log`, if one ends there.
pub fn root_cause(log: &str) -> Option<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut from = 0;
    while let Some(at) = lines[from..].iter().position(|l| l.contains(HEADER)) {
        let start = from + at;
        if let Some(line) = exception_after(&lines, start) {
            return Some(line);
        }
        from = start + 1;
    }
    None
}

/// The exception line of the traceback whose header is `lines[start]`.
fn exception_after(lines: &[&str], start: usize) -> Option<String> {
    let header = lines[start];
    let prefix = &header[..header.find(HEADER)?];
    let mut frames = 0;
    for line in lines.iter().skip(start + 1).take(MAX_LINES) {
        let Some(body) = line.strip_prefix(prefix) else {
            continue; // another process's line
        };
        if body.trim().is_empty() {
            continue;
        }
        if body.starts_with(' ') || body.starts_with('\t') {
            frames += 1;
            continue;
        }
        // A traceback has frames before its exception; a header followed
        // at once by another unindented line is not one.
        return (frames > 0).then(|| crate::signatures::clip(body.trim_end(), 300));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What vLLM 0.32 (CPU build, pipeline parallelism 2) wrote on the head
    /// when the first completion failed, cut short.
    const VLLM_PP2_HEAD: &str = "\
(APIServer pid=16032) INFO:     127.0.0.1:50080 - \"GET /health HTTP/1.1\" 200 OK
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512]   File \"/v/vllm/v1/engine/core.py\", line 1496, in run_engine_core
(Worker_PP0 pid=16100) INFO 12-02 04:06:01 [multiproc_executor.py:843] interleaved
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512]     engine_core.run_busy_loop()
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512]   File \"/v/vllm/v1/core/sched/scheduler.py\", line 2105, in update_from_output
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512]     req_index = model_runner_output.req_id_to_index[req_id]
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512]                 ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^
(EngineCore pid=16072) ERROR 12-02 04:06:01 [core.py:1512] KeyError: 'cmpl-91f57b731288f343-0-8be159b9'
(APIServer pid=16032) ERROR 12-02 04:06:01 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=16032) ERROR 12-02 04:06:01 [async_llm.py:906] Traceback (most recent call last):
(APIServer pid=16032) ERROR 12-02 04:06:01 [async_llm.py:906]   File \"/v/vllm/v1/engine/async_llm.py\", line 849, in output_handler
(APIServer pid=16032) ERROR 12-02 04:06:01 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
";

    #[test]
    fn the_first_traceback_names_the_root_cause() {
        assert_eq!(
            root_cause(VLLM_PP2_HEAD).as_deref(),
            Some("KeyError: 'cmpl-91f57b731288f343-0-8be159b9'")
        );
    }

    #[test]
    fn a_plain_traceback_and_a_chained_one() {
        let plain = "starting\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    f()\nAssertionError\nThe above exception was the direct cause of the following exception:\n\nTraceback (most recent call last):\n  File \"y.py\", line 2\nRuntimeError: later\n";
        assert_eq!(root_cause(plain).as_deref(), Some("AssertionError"));
    }

    #[test]
    fn no_traceback_or_an_unfinished_one_has_no_root_cause() {
        assert_eq!(root_cause("INFO all well\n"), None);
        assert_eq!(
            root_cause("Traceback (most recent call last):\n  File \"x.py\", line 1\n"),
            None
        );
        // A mention of the header in prose, then a real one.
        let log = "log: Traceback (most recent call last): is printed below\nnot a frame\nTraceback (most recent call last):\n  File \"z.py\"\nValueError: bad\n";
        assert_eq!(root_cause(log).as_deref(), Some("ValueError: bad"));
    }
}
