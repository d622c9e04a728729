#!/usr/bin/env python3
"""A stand-in for vLLM, Ray and SGLang in launcher tests (Python 3 stdlib only).

It takes the command lines `xfer-launch` runs, checks them against the plan
(STANDIN_PLAN), forms its group over the real network (a TCP rendezvous
between the ranks, like torch.distributed's store), and serves an
OpenAI-compatible API on the head once every rank has joined. See README.md
next to this file for the modes and the STANDIN_* knobs.

    engine.py vllm serve MODEL ... | vllm --version
    engine.py ray start --head ... | ray start --address H:P ... | ray stop | ray status
    engine.py sglang --model-path MODEL ...   (what `python -m sglang.launch_server` runs)
    engine.py custom --rank R --nnodes N --head-ip H --port P --api-port A [--model M]
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VLLM_VERSION = os.environ.get("STANDIN_VERSION") or "0.11.0"
SGLANG_VERSION = os.environ.get("STANDIN_VERSION") or "0.5.4"
RAY_VERSION = "2.49.0"
MISMATCH_EXIT = 3
CRASH_EXIT = 17
HEARTBEAT_SECS = 1.0
ENV_PREFIXES = ("VLLM_", "SGLANG_", "NCCL_", "GLOO_", "HF_", "RAY_", "CUDA_")
# Flags that never take a value (so they do not swallow the next word).
BOOL_FLAGS = {
    "--headless", "--block", "--head", "--force", "--trust-remote-code",
    "--enforce-eager", "--disable-log-requests", "--disable-log-stats",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--verbose",
    "--enable-chunked-prefill", "--disable-custom-all-reduce", "--version",
    "--disable-usage-stats", "--include-dashboard", "--help", "-h", "-v",
}

MODE = "?"
T0 = time.monotonic()


# ----------------------------------------------------------------- output

def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def err(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def stamp():
    return time.strftime("%m-%d %H:%M:%S")


def log_line(level, where, msg):
    """A log line in the engine's own format."""
    if MODE == "sglang":
        return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}"
    if MODE == "ray":
        return msg
    return f"{level} {stamp()} [{where}] {msg}"


def info(where, msg):
    out(log_line("INFO", where, msg))


def error(where, msg):
    err(log_line("ERROR", where, msg))


def die(msg, code=1, where="core.py:0"):
    if "lost" in msg and os.environ.get("STANDIN_HANG_ON_LOSS") == "1":
        # Like NCCL: a rank whose peer died often just waits forever.
        error(where, msg.replace("RuntimeError: ", "NCCL WARN ") + " (waiting)")
        while True:
            time.sleep(3600)
    error(where, msg)
    os._exit(code)


def env_float(name, default):
    v = os.environ.get(name, "")
    try:
        return float(v) if v != "" else default
    except ValueError:
        err(f"standin: {name}={v!r} is not a number; using {default}")
        return default


def env_rank(name):
    v = os.environ.get(name, "")
    return int(v) if v.strip().lstrip("-").isdigit() else None


INIT_TIMEOUT = env_float("STANDIN_INIT_TIMEOUT", 60.0)
PEER_TIMEOUT = env_float("STANDIN_PEER_TIMEOUT", 10.0)
LOAD_SECS = env_float("STANDIN_LOAD_SECS", 0.0)
TOKEN_SECS = env_float("STANDIN_TOKEN_MS", 5.0) / 1000.0


# ------------------------------------------------------------ arguments

class Args:
    """A lenient parser: `--k v`, `--k=v`, bare flags, positionals; unknown
    options are kept, not refused (extra_args pass through to the engine)."""

    def __init__(self, words):
        self.words = list(words)
        self.opts = {}
        self.multi = {}
        self.pos = []
        i = 0
        while i < len(words):
            w = words[i]
            if w.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", w) and w != "-":
                if "=" in w:
                    k, v = w.split("=", 1)
                    self.opts[k] = v
                    self.multi.setdefault(k, []).append(v)
                elif w in BOOL_FLAGS or i + 1 >= len(words) or (
                    words[i + 1].startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", words[i + 1])
                ):
                    self.opts[w] = True
                else:
                    vals = [words[i + 1]]
                    i += 1
                    # --served-model-name takes one or more names.
                    if w == "--served-model-name":
                        while i + 1 < len(words) and not words[i + 1].startswith("-"):
                            vals.append(words[i + 1])
                            i += 1
                    self.opts[w] = vals[0]
                    self.multi.setdefault(w, []).extend(vals)
            else:
                self.pos.append(w)
            i += 1

    def get(self, *names, default=None):
        for n in names:
            if n in self.opts:
                return self.opts[n]
        return default

    def int(self, *names, default):
        v = self.get(*names)
        if v is None or v is True:
            return default
        try:
            return int(v)
        except ValueError:
            die(f"argument {names[0]}: invalid int value: {v!r}", 2)

    def flag(self, name):
        return self.opts.get(name) is True


def split_host_port(s, default_port=None):
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d+)", s)
    if m:
        return m.group(1), int(m.group(2))
    if s.count(":") == 1:
        h, p = s.split(":")
        return h, int(p)
    if default_port is not None:
        return s, default_port
    die(f"invalid address {s!r} (want HOST:PORT)", 2)


def family(ip):
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


# ------------------------------------------------------------ interfaces

def interfaces():
    """{ifname: [addresses]} of this network namespace."""
    try:
        data = json.loads(subprocess.run(
            ["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True
        ).stdout or "[]")
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        err(f"standin: cannot list interfaces with `ip -j addr`: {e}")
        return {}
    return {
        i.get("ifname", "?"): [a.get("local") for a in i.get("addr_info", []) if a.get("local")]
        for i in data
    }


def is_local(ip):
    return any(ip in addrs for addrs in interfaces().values())


# ------------------------------------------------------------ the plan

def host_ip():
    return os.environ.get("VLLM_HOST_IP") or os.environ.get("SGLANG_HOST_IP") or ""


def load_plan():
    path = os.environ.get("STANDIN_PLAN")
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"_error": f"cannot read STANDIN_PLAN {path}: {e}"}


def plan_rank(plan):
    ip = host_ip()
    if not plan or "_error" in plan or not ip:
        return None
    for r in plan.get("ranks", []):
        env = r.get("env", {})
        if ip in (env.get("VLLM_HOST_IP"), env.get("SGLANG_HOST_IP")):
            return r
    return None


def normalize_plan_argv(a):
    """The plan's argv as this process sees itself: the program's basename,
    `python -m X` as is, `python SCRIPT` as the script's basename."""
    a = list(a)
    if not a:
        return a
    if re.fullmatch(r"python[0-9.]*", os.path.basename(a[0])):
        if len(a) > 1 and a[1] == "-m":
            return ["python"] + a[1:]
        a = a[1:]
        if not a:
            return a
    return [os.path.basename(a[0])] + a[1:]


def word_matches(plan_word, ours):
    pat = re.escape(plan_word).replace(re.escape("<COMMIT>"), "[0-9a-f]{40}")
    return re.fullmatch(pat, ours) is not None


def argv_matches(plan_argv, ours):
    p = normalize_plan_argv(plan_argv)
    # `ray start` runs the same with or without --block (the launcher
    # supervises it as a long-lived process either way).
    if p[:2] == ["ray", "start"] and ours[:2] == ["ray", "start"]:
        p = [w for w in p if w != "--block"]
        ours = [w for w in ours if w != "--block"]
    return len(p) == len(ours) and all(word_matches(a, b) for a, b in zip(p, ours))


def validate(plan, ours, model):
    """The mismatches between this process and its rank of the plan."""
    if "_error" in plan:
        return [plan["_error"]]
    ip = host_ip()
    if not ip:
        return ["neither VLLM_HOST_IP nor SGLANG_HOST_IP is set"]
    r = plan_rank(plan)
    if r is None:
        return [f"no rank of the plan has VLLM_HOST_IP or SGLANG_HOST_IP = {ip}"]
    who = f"rank {r.get('rank')} ({r.get('node')})"
    problems = []
    cands = [c for c in [r.get("argv", [])] + list(r.get("pre", [])) if c]
    if not any(argv_matches(c, ours) for c in cands):
        problems.append(
            f"argv {json.dumps(ours)} is neither the argv nor a pre command of {who}: "
            + " | ".join(json.dumps(normalize_plan_argv(c)) for c in cands)
        )
    for k, v in sorted(r.get("env", {}).items()):
        have = os.environ.get(k)
        if have != v:
            problems.append(f"env {k}={have!r}, the plan says {v!r}")
    nccl = os.environ.get("NCCL_SOCKET_IFNAME")
    gloo = os.environ.get("GLOO_SOCKET_IFNAME")
    ifs = interfaces()
    if nccl is None:
        problems.append("NCCL_SOCKET_IFNAME is not set")
    elif not nccl.startswith("=") or nccl.startswith("=="):
        problems.append(f"NCCL_SOCKET_IFNAME={nccl!r} is not '=' and one exact interface name")
    else:
        name = nccl[1:]
        if name not in ifs:
            problems.append(f"NCCL_SOCKET_IFNAME names {name!r}, which does not exist here (have {', '.join(sorted(ifs))})")
        elif ip not in ifs[name]:
            on = [n for n, a in ifs.items() if ip in a]
            problems.append(
                f"the fabric IP {ip} is not on {name} ({name} has {', '.join(ifs[name]) or 'no address'}"
                + (f"; {ip} is on {on[0]})" if on else f"; {ip} is on no interface)")
            )
        if gloo != name:
            problems.append(f"GLOO_SOCKET_IFNAME={gloo!r}, want {name!r} (the NCCL interface, no '=')")
    if model is None:
        problems.append("no model path in argv")
    elif not os.path.isdir(model):
        problems.append(f"model path {model} is not a directory")
    return problems


def node_name(plan):
    r = plan_rank(plan)
    if r is not None:
        return r.get("node", "node")
    return os.environ.get("STANDIN_NODE") or host_ip() or socket.gethostname()


def compile_cache():
    """Like vLLM's torch.compile under VLLM_CACHE_ROOT: reuse the compiled
    artifact when the cache holds it, or build it (STANDIN_COMPILE_SECS)
    and write it there. Says which, and what the artifact held."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    if not root:
        return None
    path = os.path.join(root, "torch_compile_cache", "standin", "graph.bin")
    try:
        with open(path, "rb") as f:
            data = f.read()
        return {"warm": True, "path": path, "bytes": len(data), "head": data[:32].decode("latin-1")}
    except OSError:
        pass
    time.sleep(env_float("STANDIN_COMPILE_SECS", 0.0))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(b"standin compiled graph v1\n" * 64)
    os.replace(path + ".tmp", path)
    return {"warm": False, "path": path}


def record(plan, ours, ok, problems):
    d = os.environ.get("STANDIN_OUT")
    if not d:
        return
    cache = compile_cache() if MODE == "vllm" and ok else None
    doc = {
        "compile_cache": cache,
        "argv": ours,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "pid": os.getpid(),
        "ok": ok,
        "mode": MODE,
        "node": node_name(plan),
        "mismatch": problems,
    }
    try:
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{node_name(plan)}-{MODE}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)
    except OSError as e:
        err(f"standin: cannot write to STANDIN_OUT {d}: {e}")


def check_and_record(ours, model, validate_it=True):
    """Validate against STANDIN_PLAN (exit 3 on a mismatch) and record."""
    plan = load_plan()
    problems = validate(plan, ours, model) if (plan is not None and validate_it) else []
    record(plan, ours, not problems, problems)
    if problems:
        err("standin: MISMATCH: " + "; ".join(problems))
        os._exit(MISMATCH_EXIT)
    return plan


# ------------------------------------------------------------ faults, signals

def on_term(signum, _frame):
    name = signal.Signals(signum).name
    if MODE == "ray":
        out(f"Received {name}, stopping.")
    else:
        info("launcher.py:80", f"Received {name}; shutting down.")
    os._exit(0)


def setup_signals(ignore_term=False):
    signal.signal(signal.SIGINT, on_term)
    if ignore_term or os.environ.get("STANDIN_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)


def maybe_hang(rank):
    if rank is not None and env_rank("STANDIN_HANG_RANK") == rank:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        out(f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>")
        while True:
            time.sleep(3600)


def arm_crash(rank):
    """STANDIN_CRASH_RANK: that rank dies STANDIN_CRASH_AFTER seconds after it joined."""
    if rank is None or env_rank("STANDIN_CRASH_RANK") != rank:
        return
    secs = env_float("STANDIN_CRASH_AFTER", 1.0)

    def crash():
        err("Traceback (most recent call last):")
        err('  File "/usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py", line 2806, in all_reduce')
        err("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
        os._exit(CRASH_EXIT)

    t = threading.Timer(secs, crash)
    t.daemon = True
    t.start()


# ------------------------------------------------------------ line sockets

class Conn:
    """A TCP connection carrying newline-terminated messages."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.why = ""
        self.lock = threading.Lock()
        self.peer = "%s:%s" % sock.getpeername()[:2]

    def send(self, line):
        try:
            with self.lock:
                self.sock.sendall((line + "\n").encode())
            return True
        except OSError:
            return False

    def recv(self, timeout):
        """The next message other than a heartbeat; None when the peer is
        gone or silent for `timeout` seconds."""
        while True:
            while b"\n" not in self.buf:
                self.sock.settimeout(timeout)
                try:
                    chunk = self.sock.recv(4096)
                except socket.timeout:
                    self.why = f"silent for {timeout:g}s"
                    return None
                except OSError as e:
                    self.why = f"failed: {e}"
                    return None
                if not chunk:
                    self.why = "closed"
                    return None
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.decode(errors="replace").strip()
            if line != "HB":
                return line

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def heartbeat(conns_fn):
    def loop():
        while True:
            for c in conns_fn():
                c.send("HB")
            time.sleep(HEARTBEAT_SECS)
    threading.Thread(target=loop, daemon=True).start()


def listen(ip, port, what):
    try:
        return socket.create_server((ip, port), family=family(ip), backlog=64)
    except OSError as e:
        die(f"RuntimeError: The server socket has failed to bind to {ip}:{port} ({what}) "
            f"(errno: {e.errno} - {e.strerror}).")


def connect(ip, port, what, source_ip=None, deadline=None):
    """Connect with retries until `deadline`; bind the fabric IP as source when local."""
    src = (source_ip, 0) if source_ip and is_local(source_ip) else None
    deadline = deadline if deadline is not None else time.monotonic() + INIT_TIMEOUT
    last = None
    while time.monotonic() < deadline:
        try:
            s = socket.create_connection((ip, port), timeout=2.0, source_address=src)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Conn(s)
        except OSError as e:
            last = e
            time.sleep(0.5)
    return last


# ------------------------------------------------------------ rendezvous (mp, sglang, custom)

class Head:
    """Rank 0: the store every other rank joins."""

    def __init__(self, ip, port, nnodes):
        self.nnodes = nnodes
        self.members = {}  # rank -> Conn
        self.formed = threading.Event()
        self.lock = threading.Lock()
        self.sock = listen(ip, port, "rendezvous")
        threading.Thread(target=self.accept_loop, daemon=True).start()
        heartbeat(lambda: list(self.members.values()))

    def accept_loop(self):
        while True:
            try:
                s, _ = self.sock.accept()
            except OSError:
                continue
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self.handle, args=(Conn(s),), daemon=True).start()

    def handle(self, c):
        hello = c.recv(10.0)
        m = re.fullmatch(r"JOIN (\d+) (\S+)", hello or "")
        if not m:
            c.close()
            return
        rank, ip = int(m.group(1)), m.group(2)
        with self.lock:
            why = None
            if self.formed.is_set():
                why = "the group is already formed"
            elif not 1 <= rank < self.nnodes:
                why = f"node rank {rank} is out of range for --nnodes {self.nnodes}"
            elif rank in self.members:
                why = f"node rank {rank} has already joined"
            if why:
                c.send("REJECT " + why)
                error("parallel_state.py:1100", f"refused {ip} ({c.peer}): {why}")
                c.close()
                return
            self.members[rank] = c
            c.send("OK")
            info("parallel_state.py:1165", f"node rank {rank} joined from {ip} ({c.peer}); "
                 f"{len(self.members) + 1}/{self.nnodes} ranks")
            if len(self.members) == self.nnodes - 1:
                for w in self.members.values():
                    w.send("START")
                self.formed.set()
        while True:
            if c.recv(PEER_TIMEOUT) is None:
                break
        with self.lock:
            if self.formed.is_set():
                die(f"RuntimeError: lost node rank {rank} ({ip}): its connection {c.why}; "
                    f"shutting down the group.",
                    where="multiproc_executor.py:152")
            self.members.pop(rank, None)
            error("parallel_state.py:1170", f"node rank {rank} ({ip}) left before the group formed")


def form_group(rank, nnodes, head_ip, port):
    """Join (or, on rank 0, host) the rendezvous at head_ip:port; returns when
    every rank is in. Workers keep watching the head from a thread."""
    maybe_hang(rank)
    me = host_ip() or "?"
    info("parallel_state.py:1000", f"world_size={nnodes} rank={rank} local_rank=0 "
         f"distributed_init_method=tcp://{head_ip}:{port} backend=nccl")
    if rank == 0:
        head = Head(head_ip, port, nnodes)
        if nnodes > 1:
            info("parallel_state.py:1010", f"waiting for {nnodes - 1} more node(s) on {head_ip}:{port}")
        if nnodes > 1:
            head.formed.wait()
        head.formed.set()
        info("parallel_state.py:1020", f"all {nnodes} ranks joined; NCCL communicator ready")
        arm_crash(rank)
        return
    c = connect(head_ip, port, "rendezvous", source_ip=me)
    if not isinstance(c, Conn):
        die(f"torch.distributed.DistNetworkError: The client socket has timed out after "
            f"{int(INIT_TIMEOUT * 1000)}ms while trying to connect to ({head_ip}, {port}): {c}")
    c.send(f"JOIN {rank} {me}")
    reply = c.recv(None)
    if reply is None:
        die(f"lost the head {head_ip}:{port} before joining")
    if reply.startswith("REJECT"):
        die(f"RuntimeError: the head {head_ip}:{port} refused node rank {rank}: {reply[7:]}")
    info("parallel_state.py:1030", f"joined the head {head_ip}:{port} from {me}; waiting for the other ranks")
    heartbeat(lambda: [c])
    reply = c.recv(PEER_TIMEOUT)
    if reply != "START":
        die(f"lost the head {head_ip}:{port} while the group was forming")
    info("parallel_state.py:1020", f"all {nnodes} ranks joined; NCCL communicator ready")
    arm_crash(rank)

    def watch():
        while c.recv(PEER_TIMEOUT) is not None:
            pass
        die(f"RuntimeError: lost the head {head_ip}:{port}: its connection {c.why}.",
            where="multiproc_executor.py:152")
    threading.Thread(target=watch, daemon=True).start()


# ------------------------------------------------------------ HTTP API

WORDS = "the quick brown fox jumps over a lazy dog while stand in engines talk".split()


def serve_api(host, port, served, model_path, owner, ready_lines):
    created = int(time.time())

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def reply(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            phrase = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(code, "")
            out(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - '
                f'"{self.command} {self.path} HTTP/1.1" {code} {phrase}')

        def not_found(self):
            self.reply(404, {"detail": "Not Found"})

        def do_GET(self):
            if self.path == "/health":
                self.reply(200, b"", "text/plain")
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [
                    {"id": n, "object": "model", "created": created, "owned_by": owner,
                     "root": model_path, "parent": None, "max_model_len": 32768}
                    for n in served]})
            elif self.path == "/version":
                self.reply(200, {"version": VLLM_VERSION if owner == "vllm" else SGLANG_VERSION})
            else:
                self.not_found()

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(n) or b"{}")
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                return self.reply(400, {"error": {"message": f"invalid JSON body: {e}",
                                                  "type": "BadRequestError", "param": None, "code": 400}})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.not_found()
            model = req.get("model") or served[0]
            if model not in served:
                return self.reply(404, {"error": {"message": f"The model `{model}` does not exist.",
                                                  "type": "NotFoundError", "param": "model", "code": 404}})
            try:
                max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
            except (TypeError, ValueError):
                max_tokens = 16
            max_tokens = max(0, min(max_tokens, 100000))
            chat = self.path.endswith("/chat/completions")
            if chat:
                prompt = " ".join(str(m.get("content", "")) for m in req.get("messages", []) if isinstance(m, dict))
            else:
                prompt = req.get("prompt", "")
                prompt = prompt[0] if isinstance(prompt, list) and prompt else prompt
                prompt = str(prompt)
            ptoks = max(1, len(prompt.split()))
            time.sleep(TOKEN_SECS * max_tokens)
            text = "".join(" " + WORDS[i % len(WORDS)] for i in range(max_tokens))
            rid = ("chatcmpl-" if chat else "cmpl-") + os.urandom(16).hex()
            choice = {"index": 0, "finish_reason": "length", "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            self.reply(200, {
                "id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model, "choices": [choice],
                "usage": {"prompt_tokens": ptoks, "completion_tokens": max_tokens,
                          "total_tokens": ptoks + max_tokens},
            })

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = family(host or "0.0.0.0")

    if LOAD_SECS > 0:
        info("gpu_model_runner.py:2000", f"Loading weights took {LOAD_SECS:.2f} seconds")
        time.sleep(LOAD_SECS)
    info("api_server.py:1900", f"Starting vLLM API server 0 on http://{host}:{port}" if owner == "vllm"
         else f"Starting HTTP server on {host}:{port}")
    out(f"INFO:     Started server process [{os.getpid()}]")
    out("INFO:     Waiting for application startup.")
    try:
        httpd = Server((host, port), H)
    except OSError as e:
        err(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): {e.strerror.lower()}")
        os._exit(1)
    out("INFO:     Application startup complete.")
    out(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
    for line in ready_lines:
        out(line)
    httpd.serve_forever()


# ------------------------------------------------------------ vLLM

def wait_for_release():
    """A rank `xfer-launch up` started held (`XFER_HOLD_FILE`, set by the
    agent) waits, as the real loader plugin does in vLLM's `register()`,
    before it reads the model or binds a port; once released, it meets the
    preflight's rendezvous (`meet_rendezvous`), as the plugin's worker does."""
    hold = os.environ.get("XFER_HOLD_FILE")
    if not hold:
        return
    if not os.path.exists(hold):
        out(f"standin: held until {hold} exists")
        while not os.path.exists(hold):
            time.sleep(0.02)
        out("standin: released")
    meet_rendezvous()


def meet_rendezvous():
    """The preflight's rendezvous (`XFER_RENDEZVOUS`: MASTER RANK WORLD
    TIMEOUT_S), met over real sockets where the plugin's worker runs a
    Gloo all-reduce: rank 0 listens at MASTER, every other rank connects
    and sends its rank, rank 0 answers the sum. The outcome goes to
    `XFER_RENDEZVOUS_FILE` as the plugin writes it; a failed meeting ends
    the rank, as the plugin's raise ends vLLM's worker.
    `STANDIN_RENDEZVOUS=refuse` (from `[launch.env]`) fails it here."""
    spec, report = os.environ.get("XFER_RENDEZVOUS"), os.environ.get("XFER_RENDEZVOUS_FILE")
    if not spec or not report:
        return
    master, rank, world, timeout_s = spec.split()
    rank, world, deadline = int(rank), int(world), time.monotonic() + float(timeout_s)
    host, port = master.rsplit(":", 1)
    out(f"standin: meeting the rendezvous {spec}")
    t0 = time.monotonic()
    try:
        if os.environ.get("STANDIN_RENDEZVOUS") == "refuse":
            raise ConnectionRefusedError(f"[Errno 111] Connection refused (the test's fault) at {master}")
        want = world * (world - 1) // 2
        if rank == 0:
            srv = socket.create_server((host, int(port)))
            srv.settimeout(float(timeout_s))
            peers = [srv.accept()[0] for _ in range(world - 1)]
            got = sum(int(p.recv(16).decode()) for p in peers)
            for p in peers:
                p.sendall(str(got).encode())
                p.close()
            srv.close()
        else:
            while True:
                try:
                    c = socket.create_connection((host, int(port)), timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            c.sendall(str(rank).encode())
            got = int(c.recv(16).decode())
            c.close()
        if got != want:
            raise RuntimeError(f"the sum was {got}, not {want}")
        line = f"ok {int((time.monotonic() - t0) * 1000)}"
    except Exception as e:  # noqa: BLE001 - reported as the plugin does
        line = "failed " + " ".join(f"{type(e).__name__}: {e}".split())
    with open(report + ".tmp", "w") as f:
        f.write(line + "\n")
    os.rename(report + ".tmp", report)
    out(f"standin: rendezvous {line}")
    if line.startswith("failed"):
        os._exit(1)


def vllm_main(words):
    if words and words[0] in ("--version", "-v"):
        out(VLLM_VERSION)
        return 0
    if not words or words[0] != "serve":
        err("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...")
        return 2
    a = Args(words[1:])
    if a.flag("--help") or a.flag("-h"):
        out("usage: vllm serve [model_tag] [options]")
        return 0
    model = a.pos[0] if a.pos else a.get("--model")
    if model is None:
        die("ValueError: vllm serve needs a model (vllm serve MODEL ...)", 2)
    wait_for_release()
    ours = ["vllm"] + words
    check_and_record(ours, model)
    setup_signals()
    served = a.multi.get("--served-model-name") or [model]
    host = a.get("--host") or "0.0.0.0"
    api_port = a.int("--port", default=8000)
    tp = a.int("--tensor-parallel-size", "-tp", default=1)
    pp = a.int("--pipeline-parallel-size", "-pp", default=1)
    info("api_server.py:1800", f"vLLM API server version {VLLM_VERSION}")
    info("utils.py:300", f"non-default args: {{'model': {model!r}, 'tensor_parallel_size': {tp}, "
         f"'pipeline_parallel_size': {pp}}}")
    if a.get("--distributed-executor-backend") == "ray":
        return vllm_ray(model, served, host, api_port, pp)
    nnodes = a.int("--nnodes", default=1)
    rank = a.int("--node-rank", default=0)
    master = a.get("--master-addr") or "127.0.0.1"
    mport = a.int("--master-port", default=29500)
    headless = a.flag("--headless")
    if rank == 0 and headless:
        die("ValueError: --headless is for node ranks > 0 (node rank 0 serves the API)", 2)
    form_group(rank, nnodes, master, mport)
    if rank > 0:
        info("core.py:700", f"headless node rank {rank}: engine workers running; no API server here")
        while True:
            time.sleep(3600)
    serve_api(host, api_port, served, model, "vllm", [])
    return 0


def ray_address_for_vllm():
    addr = os.environ.get("RAY_ADDRESS", "")
    addr = re.sub(r"^ray://", "", addr)
    port = int(env_float("STANDIN_RAY_PORT", 6379))
    if addr and addr != "auto":
        return split_host_port(addr, port)
    return (host_ip() or "127.0.0.1"), port


def vllm_ray(model, served, host, api_port, pp):
    maybe_hang(0)
    ip, port = ray_address_for_vllm()
    info("worker.py:1800", f"Connecting to existing Ray cluster at address: {ip}:{port}...")
    c = connect(ip, port, "ray", source_ip=None)
    if not isinstance(c, Conn):
        die("ConnectionError: Could not find any running Ray instance. Please specify the one to "
            "connect to by setting `--address` flag or `RAY_ADDRESS` environment variable.")
    c.send("WATCH")
    heartbeat(lambda: [c])
    need = max(pp - 1, 0)
    info("ray_utils.py:300", f"Connected to Ray cluster; waiting for {need} worker node(s) "
         f"(--pipeline-parallel-size {pp})")
    have = -1
    while True:
        msg = c.recv(PEER_TIMEOUT)
        if msg is None:
            die(f"ray.exceptions.RaySystemError: lost the Ray head at {ip}:{port}")
        m = re.fullmatch(r"WORKERS (\d+).*", msg)
        if not m:
            continue
        n = int(m.group(1))
        if n != have:
            info("ray_utils.py:320", f"Ray cluster has {n + 1} node(s); need {need + 1}")
            have = n
        if n >= need:
            break
    arm_crash(0)

    def watch():
        while True:
            msg = c.recv(PEER_TIMEOUT)
            if msg is None:
                die(f"ray.exceptions.RaySystemError: lost the Ray head at {ip}:{port}")
            m = re.fullmatch(r"WORKERS (\d+).*", msg)
            if m and int(m.group(1)) < need:
                die("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing "
                    "this task (a Ray worker node was lost).", where="ray_distributed_executor.py:500")
    threading.Thread(target=watch, daemon=True).start()
    serve_api(host, api_port, served, model, "vllm", [])
    return 0


# ------------------------------------------------------------ Ray

class RayHead:
    def __init__(self, ip, port):
        self.workers = {}   # Conn -> (rank, ip)
        self.watchers = []
        self.lock = threading.Lock()
        self.sock = listen(ip, port, "ray gcs")
        self.next_rank = 1
        heartbeat(lambda: list(self.workers) + list(self.watchers))
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            try:
                s, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self.handle, args=(Conn(s),), daemon=True).start()

    def summary(self):
        return f"WORKERS {len(self.workers)} " + " ".join(ip for _, ip in self.workers.values())

    def notify(self):
        s = self.summary()
        for w in list(self.watchers):
            w.send(s)

    def handle(self, c):
        hello = c.recv(10.0) or ""
        if hello == "QUERY":
            with self.lock:
                c.send(self.summary())
            c.close()
            return
        if hello == "WATCH":
            with self.lock:
                self.watchers.append(c)
                c.send(self.summary())
            while c.recv(PEER_TIMEOUT) is not None:
                pass
            with self.lock:
                self.watchers.remove(c)
            return
        m = re.fullmatch(r"JOIN (\S+) (\S+)", hello)
        if not m:
            c.close()
            return
        with self.lock:
            if m.group(1).isdigit():
                rank = int(m.group(1))
            else:
                rank = self.next_rank
            self.next_rank = max(self.next_rank, rank + 1)
            self.workers[c] = (rank, m.group(2))
            c.send(f"OK {rank}")
            out(f"Node joined: {m.group(2)} ({c.peer}); {len(self.workers) + 1} node(s) alive")
            self.notify()
        while c.recv(PEER_TIMEOUT) is not None:
            pass
        with self.lock:
            self.workers.pop(c, None)
            err(f"WARNING: The node with address {m.group(2)} has been marked dead because the "
                f"detector has missed too many heartbeats from it.")
            self.notify()


def ray_query(ip, port):
    c = connect(ip, port, "ray", deadline=time.monotonic() + 3)
    if not isinstance(c, Conn):
        return None
    c.send("QUERY")
    return c.recv(5.0)


def same_netns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def ray_processes():
    """`ray start` stand-ins in this network namespace (this "machine")."""
    me = os.path.realpath(__file__)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in cmd if w]
        for i, w in enumerate(words[:-2]):
            if os.path.basename(w) == "engine.py" and os.path.realpath(w) == me \
                    and words[i + 1:i + 3] == ["ray", "start"]:
                if same_netns(d):
                    found.append(int(d))
                break
    return found


def ray_stop(a):
    sig = signal.SIGKILL if a.flag("--force") else signal.SIGTERM
    pids = ray_processes()
    if not pids:
        out("Did not find any active Ray processes.")
        return 0
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
    deadline = time.monotonic() + env_float("STANDIN_RAY_STOP_GRACE", 10.0)
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") and not zombie(p) for p in pids):
        time.sleep(0.1)
    for p in pids:
        if os.path.exists(f"/proc/{p}") and not zombie(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    out(f"Stopped all {len(pids)} Ray processes.")
    return 0


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def ray_main(words):
    if words and words[0] == "--version":
        out(f"ray, version {RAY_VERSION}")
        return 0
    if not words or words[0] not in ("start", "stop", "status"):
        err("Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.")
        return 2
    a = Args(words[1:])
    ours = ["ray"] + words
    if words[0] == "stop":
        check_and_record(ours, None, validate_it=False)
        return ray_stop(a)
    if words[0] == "status":
        check_and_record(ours, None, validate_it=False)
        ip, port = split_host_port(a.get("--address") or
                                   (os.environ.get("RAY_ADDRESS") or "").replace("ray://", "") or
                                   f"{host_ip() or '127.0.0.1'}:{int(env_float('STANDIN_RAY_PORT', 6379))}")
        r = ray_query(ip, port)
        if r is None:
            err(f"ConnectionError: Could not find any running Ray instance at {ip}:{port}.")
            return 1
        n = int(r.split()[1])
        out("======== Autoscaler status ========\nNode status\n" + "-" * 56 + "\nActive:")
        out(f" 1 node_{ip} (head)")
        for wip in r.split()[2:]:
            out(f" 1 node_{wip}")
        out(f"Pending:\n (no pending nodes)\nTotal nodes: {n + 1}")
        return 0
    # ray start
    head = a.flag("--head")
    node_ip = a.get("--node-ip-address") or host_ip() or "127.0.0.1"
    port = a.int("--port", default=6379)
    address = a.get("--address")
    if not head and not address:
        die("ValueError: ray start needs --head or --address", 2)
    plan = load_plan()
    if plan is None:
        record(None, ours, True, [])
    else:
        # `ray start` carries no model; check everything else.
        problems = [p for p in validate(plan, ours, "/") if not p.startswith("model path")]
        record(plan, ours, not problems, problems)
        if problems:
            err("standin: MISMATCH: " + "; ".join(problems))
            return MISMATCH_EXIT
    r = plan_rank(plan)
    rank = r.get("rank") if r is not None else (0 if head else None)
    block = a.flag("--block")
    setup_signals()
    maybe_hang(rank)
    done = None
    if not block:
        done = daemonize(plan)
    out(f"Usage stats collection is disabled.\n\nLocal node IP: {node_ip}")
    if head:
        RayHead(node_ip, port)
        out("\n--------------------\nRay runtime started.\n--------------------\n\nNext steps\n"
            f"  To add another node to this Ray cluster, run\n    ray start --address='{node_ip}:{port}'\n\n"
            "  To terminate the Ray runtime, run\n    ray stop")
        if block:
            out("\n--block\n  This command will now block forever until terminated by a signal.")
        if done:
            done()
        while True:
            time.sleep(3600)
    hip, hport = split_host_port(address, 6379)
    c = connect(hip, hport, "ray", source_ip=node_ip)
    if not isinstance(c, Conn):
        die(f"ConnectionError: ray client connection timeout: could not reach the GCS at "
            f"{hip}:{hport} within {INIT_TIMEOUT:g}s: {c}")
    c.send(f"JOIN {rank if rank is not None else '-'} {node_ip}")
    reply = c.recv(10.0)
    if not reply or not reply.startswith("OK"):
        die(f"ConnectionError: the GCS at {hip}:{hport} did not accept this node")
    rank = int(reply.split()[1]) if rank is None else rank
    heartbeat(lambda: [c])
    out("\n--------------------\nRay runtime started.\n--------------------\n\n"
        "To terminate the Ray runtime, run\n  ray stop")
    if block:
        out("\n--block\n  This command will now block forever until terminated by a signal.")
    arm_crash(rank)
    if done:
        done()
    while c.recv(PEER_TIMEOUT) is not None:
        pass
    die(f"Some Ray subprocesses exited unexpectedly: raylet lost the head {hip}:{hport} (GCS unreachable).")


def daemonize(plan):
    """`ray start` without --block: the parent returns once the runtime is up,
    the child lives on in its own session. Returns the child's "ready" callback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(w)
        ok = os.read(r, 1)
        os._exit(0 if ok == b"1" else 1)
    os.close(r)
    os.setsid()

    def ready():
        d = os.environ.get("STANDIN_OUT")
        path = os.path.join(d, f"{node_name(plan)}-ray-{os.getpid()}.log") if d else os.devnull
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(nul)
        os.write(w, b"1")
        os.close(w)
    return ready


# ------------------------------------------------------------ SGLang

def sglang_main(words):
    a = Args(words)
    model = a.get("--model-path", "--model")
    if model is None or model is True:
        die("launch_server.py: error: the following arguments are required: --model-path", 2)
    ours = ["python", "-m", "sglang.launch_server"] + words
    check_and_record(ours, model)
    nnodes = a.int("--nnodes", default=1)
    rank = a.int("--node-rank", default=0)
    # Like SGLang: ranks > 0 ignore SIGTERM; only SIGKILL stops them.
    setup_signals(ignore_term=rank > 0)
    served = a.multi.get("--served-model-name") or [model]
    host = a.get("--host") or "127.0.0.1"   # SGLang's default, as in ServerArgs
    api_port = a.int("--port", default=30000)
    tp = a.int("--tp", "--tp-size", "--tensor-parallel-size", default=1)
    dist = a.get("--dist-init-addr")
    info("", f"server_args=ServerArgs(model_path='{model}', tp_size={tp}, nnodes={nnodes}, "
         f"node_rank={rank}, dist_init_addr={dist!r}, host='{host}', port={api_port})")
    if nnodes > 1 and not dist:
        die("ValueError: --dist-init-addr is required when --nnodes > 1", 2)
    dip, dport = split_host_port(dist) if dist else ("127.0.0.1", 0)
    info("", f"Init torch distributed begin. node_rank={rank}")
    if nnodes > 1 or dist:
        form_group(rank, nnodes, dip, dport)
    else:
        maybe_hang(rank)
        arm_crash(rank)
    info("", "Init torch distributed ends.")
    if rank > 0:
        info("", "The node rank > 0 does not start the HTTP server; waiting.")
        while True:
            time.sleep(3600)
    serve_api(host, api_port, served, model, "sglang",
              [f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] The server is fired up and ready to roll!"])
    return 0


# ------------------------------------------------------------ custom

def custom_main(words):
    a = Args(words)
    rank = a.int("--rank", default=0)
    nnodes = a.int("--nnodes", default=1)
    head_ip = a.get("--head-ip") or "127.0.0.1"
    port = a.int("--port", default=29500)
    api_port = a.int("--api-port", default=8000)
    model = a.get("--model")
    ours = ["engine.py", "custom"] + words
    plan = load_plan()
    if plan is not None:
        problems = validate(plan, ours, model if model else "/")
        if not model:
            problems = [p for p in problems if not p.startswith("model path")]
        record(plan, ours, not problems, problems)
        if problems:
            err("standin: MISMATCH: " + "; ".join(problems))
            return MISMATCH_EXIT
    else:
        record(None, ours, True, [])
    setup_signals()
    served = a.multi.get("--served-model-name") or [model or "standin"]
    info("custom.py:10", f"custom engine rank {rank}/{nnodes}, head {head_ip}:{port}")
    form_group(rank, nnodes, head_ip, port)
    if rank > 0:
        while True:
            time.sleep(3600)
    serve_api(a.get("--host") or "0.0.0.0", api_port, served, model or "standin", "vllm", [])
    return 0


def main(argv):
    global MODE
    if not argv or argv[0] not in ("vllm", "ray", "sglang", "custom"):
        err("usage: engine.py {vllm|ray|sglang|custom} ARGS...")
        return 2
    MODE = argv[0]
    fn = {"vllm": vllm_main, "ray": ray_main, "sglang": sglang_main, "custom": custom_main}[MODE]
    return fn(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
