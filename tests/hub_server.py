#!/usr/bin/env python3
"""Hugging Face Hub-protocol test server (Python 3.11 stdlib only).

Serves every directory DIR/<org>/<name>/ as the model repo `org/name` at one
commit, over the same HTTP protocol as huggingface.co, so that xfer's tests,
the benchmark and the real `huggingface_hub` client can run against it.

Two listeners:
  hub  GET  /api/models/{repo}[/revision/{rev}]      repo info (id, sha, siblings)
       GET  /api/models/{repo}/tree/{rev}[/{dir}]     file listing, paged by `Link: <..>; rel="next"`
       HEAD|GET /{repo}/resolve/{rev}/{path}          regular files: 200/206 bytes;
                                                      LFS files: 302 to the CDN listener
       GET  /_stats   POST /_stats/reset   GET /_repos (hashes, for tests)
  cdn  HEAD|GET /blobs/{sha256}?sig=..                LFS bytes, single Range; 400 if
                                                      an Authorization header arrives
Headers are the Hub's: X-Repo-Commit, ETag (sha256 for LFS files, git blob
sha1 otherwise), X-Linked-Etag, X-Linked-Size, X-Error-Code/X-Error-Message.
A file is "LFS" when it is >= 1 MiB or ends in .safetensors/.bin/.pth/.gguf.
The commit is a sha1 over the sorted (path, tree oid) list; revisions `main`
and the commit resolve, any other is RevisionNotFound.

Options: --rate caps each connection's file bodies (token bucket);
--total-rate caps all of them together (one shared uplink);
--page-size / --foreign-next-links shape tree paging; --endless-tree N makes
every tree listing a hostile one, N made-up files a page and a next link
forever; --token/--gated gate a
repo (401 without a token, 403 with a wrong one); --alias OLD=NEW answers 307
with a relative Location like the Hub for renamed repos; --fault SPEC injects
faults, one fault per request, specs tried in command-line order:
  429:N[:SECS]  500:N  truncate:N  reset:N   first N file-body GETs (resolve or
                                             CDN GETs that would carry bytes;
                                             truncate/reset: bodies >= 64 KiB)
  503-api:N                                  first N /api/ requests
  throttle:N:SECS                            after N file-body GETs, a rate
                                             limiter's window: every file-body
                                             GET for SECS seconds is answered
                                             429 with Retry-After (the rest of
                                             the window, whole seconds); stats
                                             count them, and those sent in its
                                             second half ("throttle_late")
  ignore-range                               Range ignored: always 200 + whole file
  corrupt:PATH | corrupt-once:PATH           byte at size//2 of PATH sent XOR 0xFF
  hold:PATH:GATE                             bytes of PATH from size//2 on wait until
                                             the file GATE exists (a download parked
                                             half-way, for streaming tests)
Prints `READY <hub_port> <cdn_port>` once both listen; runs until SIGTERM/SIGINT.
"""

import argparse
import base64
import hashlib
import hmac
import json
import math
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

MIB = 1 << 20
LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".gguf")
HASH_BLOCK = 8 * MIB
CACHE_NAME = ".hub_server_cache.json"


# ----------------------------------------------------------------- repos ---
@dataclass
class FileEntry:
    repo_id: str
    path: str      # path inside the repo, '/'-separated
    abspath: str
    size: int
    sha1: str      # git blob sha1 of the content
    sha256: str | None  # only for LFS files

    @property
    def lfs(self):
        return self.sha256 is not None

    @property
    def etag(self):
        return self.sha256 or self.sha1

    def pointer(self):
        return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
                f"size {self.size}\n").encode()

    @cached_property
    def tree_oid(self):  # the Hub lists the git sha1 of the LFS pointer for LFS files
        if not self.lfs:
            return self.sha1
        p = self.pointer()
        return hashlib.sha1(b"blob %d\0" % len(p) + p).hexdigest()


@dataclass
class Repo:
    repo_id: str
    files: dict       # path -> FileEntry, sorted by path
    dirs: list        # sorted directory paths
    commit: str


def is_lfs(path, size):
    return size >= MIB or path.endswith(LFS_SUFFIXES)


def hash_file(abspath, size, want_sha256):
    sha1 = hashlib.sha1(b"blob %d\0" % size)
    sha256 = hashlib.sha256() if want_sha256 else None
    with open(abspath, "rb") as f:
        while block := f.read(HASH_BLOCK):
            sha1.update(block)
            if sha256:
                sha256.update(block)
    return sha1.hexdigest(), sha256.hexdigest() if sha256 else None


def load_repos(root):
    """Walk root/<org>/<name>/, hash files (cached by path, size, mtime), build repos."""
    cache_path = os.path.join(root, CACHE_NAME)
    try:
        with open(cache_path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    found = []  # (repo_id, path, abspath, size, cache_key)
    for org in sorted(os.listdir(root)):
        if org.startswith(".") or not os.path.isdir(os.path.join(root, org)):
            continue
        for name in sorted(os.listdir(os.path.join(root, org))):
            base = os.path.join(root, org, name)
            if name.startswith(".") or not os.path.isdir(base):
                continue
            found.append((f"{org}/{name}", None, base, 0, None))
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = sorted(d for d in dirnames if d != ".git")
                for fn in sorted(filenames):
                    ap = os.path.join(dirpath, fn)
                    st = os.stat(ap)
                    rel = os.path.relpath(ap, base).replace(os.sep, "/")
                    key = f"{org}/{name}/{rel}|{st.st_size}|{st.st_mtime_ns}"
                    found.append((f"{org}/{name}", rel, ap, st.st_size, key))
    todo = [x for x in found if x[1] is not None and x[4] not in cache]
    if todo:
        with ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
            hashes = pool.map(lambda x: hash_file(x[2], x[3], is_lfs(x[1], x[3])), todo)
            for x, (s1, s256) in zip(todo, hashes):
                cache[x[4]] = [s1, s256]
        live = {x[4] for x in found}
        try:
            tmp = f"{cache_path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({k: v for k, v in cache.items() if k in live}, f)
            os.replace(tmp, cache_path)
        except OSError:
            pass  # read-only repos dir: no cache, fine
    repos = {}
    for repo_id, rel, ap, size, key in found:
        if rel is None:
            repos[repo_id] = Repo(repo_id, {}, [], "")
            continue
        s1, s256 = cache[key]
        repos[repo_id].files[rel] = FileEntry(repo_id, rel, ap, size, s1, s256 if is_lfs(rel, size) else None)
    for repo in repos.values():
        repo.files = dict(sorted(repo.files.items()))
        repo.dirs = sorted({p.rsplit("/", i)[0] for p in repo.files for i in range(1, p.count("/") + 1)})
        listing = "".join(f"{p}\0{e.tree_oid}\n" for p, e in repo.files.items())
        repo.commit = hashlib.sha1(listing.encode()).hexdigest()
    return repos


# ---------------------------------------------------------- stats/faults ---
class Stats:
    KEYS = ("requests", "api_revision", "api_tree", "resolve_head", "resolve_get", "cdn_get",
            "cdn_head", "range_requests", "auth_leaks", "bytes_served", "connections_opened")

    def __init__(self):
        self.lock = threading.Lock()
        self.connections = 0      # open now, both listeners
        self.in_flight = 0        # file bodies being sent now
        self.reset()

    def reset(self):
        with self.lock:
            self.c = dict.fromkeys(self.KEYS, 0)
            self.c["faults"] = {}
            self.c["resolve_by_path"] = {}
            self.c["resolve_order"] = []  # each path's first resolve, in order
            self.c["max_concurrent_connections"] = self.connections
            self.c["max_concurrent_bodies"] = self.in_flight

    def add(self, key, n=1):
        with self.lock:
            self.c[key] += n

    def add_in(self, table, key, n=1):
        with self.lock:
            self.c[table][key] = self.c[table].get(key, 0) + n

    def first_of(self, table, key):
        with self.lock:
            if key not in self.c[table]:
                self.c[table].append(key)

    def gauge(self, attr, delta):
        with self.lock:
            v = getattr(self, attr) + delta
            setattr(self, attr, v)
            key = "max_concurrent_connections" if attr == "connections" else "max_concurrent_bodies"
            self.c[key] = max(self.c[key], v)

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps(self.c))


class Faults:
    BODY_KINDS = ("429", "500", "truncate", "reset")

    def __init__(self, specs, stats):
        self.lock = threading.Lock()
        self.stats = stats
        self.counters = []        # [kind, remaining, arg] in command-line order
        self.api_left = 0
        self.ignore_range = False
        self.corrupt = {}         # PATH -> once?
        self.corrupt_done = set()  # PATHs whose corrupt-once was spent
        self.holds = {}           # PATH -> GATE file
        self.throttle = None      # [GETs before it opens, seconds, opened-at]
        for spec in specs:
            kind, _, rest = spec.partition(":")
            if kind in ("corrupt", "corrupt-once") and rest:
                self.corrupt[rest] = kind == "corrupt-once"
            elif kind == "hold" and ":" in rest:
                path, _, gate = rest.partition(":")
                self.holds[path] = gate
            elif kind == "ignore-range":
                self.ignore_range = True
            elif kind == "throttle" and ":" in rest:
                n, _, secs = rest.partition(":")
                self.throttle = [int(n), float(secs), None]
            elif kind == "503-api":
                self.api_left += int(rest)
            elif kind in self.BODY_KINDS:
                n, _, arg = rest.partition(":")
                self.counters.append([kind, int(n), float(arg) if arg else 1.0])
            else:
                raise SystemExit(f"bad --fault {spec!r}")

    def take_body(self, length):
        """Fault for a file-body GET of `length` bytes: (kind, arg) or None."""
        with self.lock:
            for c in self.counters:
                if c[1] > 0 and (c[0] in ("429", "500") or length >= 64 * 1024):
                    c[1] -= 1
                    self.stats.add_in("faults", c[0])
                    return c[0], c[2]
        return None

    def take_throttle(self):
        """Seconds a file-body GET is told to wait (None: serve it)."""
        with self.lock:
            t = self.throttle
            if t is None:
                return None
            now = time.monotonic()
            if t[2] is None:
                if t[0] > 0:
                    t[0] -= 1
                    return None
                t[2] = now
            into = now - t[2]
            if into >= t[1]:
                return None
        self.stats.add_in("faults", "throttle")
        if into >= t[1] / 2:
            self.stats.add_in("faults", "throttle_late")
        return max(1, math.ceil(t[1] - into))

    def take_api(self):
        with self.lock:
            if self.api_left <= 0:
                return False
            self.api_left -= 1
        self.stats.add_in("faults", "503-api")
        return True

    def corrupt_key(self, entries):
        """The corrupt spec matching any of these FileEntries (same blob), if any."""
        for e in entries:
            for p in self.corrupt:
                if p in (e.path, f"{e.repo_id}/{e.path}"):
                    return p
        return None

    def should_corrupt(self, key):
        with self.lock:
            if self.corrupt[key]:
                if key in self.corrupt_done:
                    return False
                self.corrupt_done.add(key)
        self.stats.add_in("faults", "corrupt-once" if self.corrupt[key] else "corrupt")
        return True


def parse_range(value, size):
    """(start, end_exclusive), 'unsat', or None (absent/unsupported → whole file)."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    a, sep, b = value[6:].strip().partition("-")
    try:
        if not sep:
            return None
        if a == "":  # suffix range: last b bytes
            n = int(b)
            return (max(0, size - n), size) if n > 0 and size > 0 else "unsat"
        start = int(a)
        end = int(b) + 1 if b else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsat"
    return start, min(end, size)


def rate_slice(rate):
    """Send slice (and token-bucket burst) for a rate-limited connection: ~20 ms of data."""
    return max(16 * 1024, min(256 * 1024, rate // 50))


# --------------------------------------------------------------- handler ---
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hub-test-server"
    timeout = 300  # idle keep-alive connections are dropped after this
    cfg = None  # set in main(): argparse namespace plus repos/stats/faults/ports

    def version_string(self):
        return self.server_version

    # -- connection bookkeeping
    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tokens, self.t_last = 0.0, time.monotonic()
        self.cfg.stats.gauge("connections", 1)
        self.cfg.stats.add("connections_opened")

    def finish(self):
        self.cfg.stats.gauge("connections", -1)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, fmt, *args):
        if self.cfg.logf:
            with self.cfg.log_lock:
                self.cfg.logf.write(f"{time.time():.3f} {self.server.kind} {self.client_address[1]} "
                                    f"{fmt % args}\n")
                self.cfg.logf.flush()

    def log_request(self, code="-", size="-"):
        rng = self.headers.get("Range") if self.headers else None
        auth = " auth" if self.headers and self.headers.get("Authorization") else ""
        self.log_message('"%s" %s%s%s', self.requestline, code, f" range={rng}" if rng else "", auth)

    # -- small responses
    def reply(self, code, body=b"", headers=(), ctype="application/json", head=False):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def hub_error(self, code, error_code, message, headers=(), head=False):
        hdrs = list(headers)
        if error_code:
            hdrs += [("X-Error-Code", error_code), ("X-Error-Message", message)]
        self.reply(code, {"error": message}, hdrs, head=head)

    # -- dispatch
    def do_HEAD(self):
        self.dispatch(head=True)

    def do_GET(self):
        self.dispatch(head=False)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        if self.server.kind == "hub" and urlsplit(self.path).path == "/_stats/reset":
            self.cfg.stats.reset()
            return self.reply(200, {"ok": True})
        self.hub_error(405, None, "method not allowed")

    def dispatch(self, head):
        self.cfg.stats.add("requests")
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        segs = [unquote(s) for s in url.path.split("/")[1:]]  # decode each segment: %2F stays inside
        try:
            if self.server.kind == "cdn":
                return self.cdn(segs, head)
            return self.hub(url, segs, head)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    # -- hub host
    def hub(self, url, segs, head):
        cfg = self.cfg
        if segs == ["_stats"]:
            return self.reply(200, cfg.stats.snapshot(), head=head)
        if segs == ["_repos"]:
            return self.reply(200, {r.repo_id: {"commit": r.commit, "files": {
                p: {"size": e.size, "sha1": e.sha1, "sha256": e.sha256, "etag": e.etag, "lfs": e.lfs}
                for p, e in r.files.items()}} for r in cfg.repos.values()}, head=head)
        api = len(segs) >= 4 and segs[0] == "api" and segs[1] == "models"
        if api:
            if cfg.faults.take_api():
                return self.hub_error(503, None, "Service Unavailable (injected)", head=head)
            repo_id, rest = f"{segs[2]}/{segs[3]}", segs[4:]
        elif len(segs) >= 5 and segs[2] == "resolve":
            repo_id, rest = f"{segs[0]}/{segs[1]}", segs[2:]
        else:
            return self.hub_error(404, None, f"Not found: {url.path}", head=head)
        if repo_id in cfg.aliases:  # renamed repo: relative redirect, like the Hub
            raw = url.path.split("/")
            i = 3 if api else 1
            raw[i:i + 2] = [quote(p) for p in cfg.aliases[repo_id].split("/")]
            loc = "/".join(raw) + (f"?{url.query}" if url.query else "")
            return self.reply(307, f"Temporary Redirect. Redirecting to {loc}", [("Location", loc)],
                              ctype="text/plain", head=head)
        repo = cfg.repos.get(repo_id)
        if repo is None:
            return self.hub_error(401, "RepoNotFound", "Repository not found", head=head)
        if repo_id in cfg.gated:
            auth = self.headers.get("Authorization", "")
            if not auth:
                return self.hub_error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must "
                                      "have access to it and be authenticated to access it. Please log in.",
                                      head=head)
            if cfg.token is None or auth != f"Bearer {cfg.token}":
                return self.hub_error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you "
                                      "are not in the authorized list.", head=head)
        if api:
            if not rest or rest[0] == "revision":
                rev = "/".join(rest[1:]) or "main"
                if not self.revision_ok(repo, rev, head):
                    return
                return self.api_revision(repo, head)
            if rest[0] == "tree" and len(rest) >= 2:
                if not self.revision_ok(repo, rest[1], head):
                    return
                return self.api_tree(repo, url, rest[1], "/".join(rest[2:]).strip("/"), head)
            return self.hub_error(404, None, f"Not found: {url.path}", head=head)
        if not self.revision_ok(repo, rest[1], head):
            return
        return self.resolve(repo, "/".join(rest[2:]), head)

    def revision_ok(self, repo, rev, head):
        if rev in ("main", repo.commit):
            return True
        self.hub_error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
        return False

    def api_revision(self, repo, head):
        self.cfg.stats.add("api_revision")
        blobs = self.query.get("blobs", [""])[0].lower() == "true"
        siblings = []
        for e in repo.files.values():
            s = {"rfilename": e.path}
            if blobs:
                s.update(size=e.size, blobId=e.tree_oid)
                if e.lfs:
                    s["lfs"] = {"sha256": e.sha256, "size": e.size, "pointerSize": len(e.pointer())}
            siblings.append(s)
        org = repo.repo_id.split("/")[0]
        body = {"_id": repo.commit[:24], "id": repo.repo_id, "modelId": repo.repo_id, "author": org,
                "sha": repo.commit, "private": False, "disabled": False,
                "gated": "manual" if repo.repo_id in self.cfg.gated else False,
                "downloads": 0, "likes": 0, "tags": [], "library_name": None,
                "lastModified": "2024-01-01T00:00:00.000Z", "createdAt": "2024-01-01T00:00:00.000Z",
                "siblings": siblings, "usedStorage": sum(e.size for e in repo.files.values())}
        self.reply(200, body, [("X-Repo-Commit", repo.commit)], head=head)

    def api_tree(self, repo, url, rev, sub, head):
        self.cfg.stats.add("api_tree")
        if self.cfg.endless_tree:
            return self.endless_tree(repo, url, head)
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = f"{sub}/" if sub else ""
        if sub and sub not in repo.dirs:
            return self.hub_error(404, "EntryNotFound", f"{sub} does not exist on \"{rev}\"", head=head)

        def listed(p):
            return p.startswith(prefix) and (recursive or "/" not in p[len(prefix):])
        entries = [{"type": "directory", "oid": hashlib.sha1(f"{repo.commit}:{d}".encode()).hexdigest(),
                    "size": 0, "path": d} for d in repo.dirs if listed(d)]
        for e in repo.files.values():
            if listed(e.path):
                item = {"type": "file", "oid": e.tree_oid, "size": e.size, "path": e.path}
                if e.lfs:
                    item["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": len(e.pointer())}
                entries.append(item)
        entries.sort(key=lambda x: x["path"])
        try:
            start = int(base64.urlsafe_b64decode(self.query.get("cursor", [""])[0] + "==") or 0)
        except ValueError:
            return self.hub_error(400, None, "bad cursor", head=head)
        page = entries[start:start + self.cfg.page_size]
        headers = [("X-Repo-Commit", repo.commit)]
        nxt = start + len(page)
        if nxt < len(entries):
            origin = "https://huggingface.co" if self.cfg.foreign_next_links else self.cfg.hub_origin
            cursor = base64.urlsafe_b64encode(str(nxt).encode()).decode().rstrip("=")
            q = "&".join(f"{k}={quote(v[0], safe='')}" for k, v in self.query.items() if k != "cursor")
            link = f"{origin}{url.path}?{q + '&' if q else ''}cursor={cursor}"
            headers.append(("Link", f'<{link}>; rel="next"'))
        self.reply(200, page, headers, head=head)

    def endless_tree(self, repo, url, head):
        """A page of made-up files and a next link, whatever the cursor."""
        page_no = int(self.query.get("page", ["0"])[0] or 0)
        n = self.cfg.endless_tree
        oid = "c" * 40
        body = ("[" + ",".join(
            f'{{"type":"file","oid":"{oid}","size":1,"path":"endless/{page_no:08}/{i:08}"}}'
            for i in range(n)) + "]").encode()
        link = f"{self.cfg.hub_origin}{url.path}?recursive=true&page={page_no + 1}"
        self.reply(200, body, [("X-Repo-Commit", repo.commit), ("Link", f'<{link}>; rel="next"')], head=head)

    def resolve(self, repo, path, head):
        stats = self.cfg.stats
        stats.add("resolve_head" if head else "resolve_get")
        stats.add_in("resolve_by_path", f"{repo.repo_id}/{path}")
        stats.first_of("resolve_order", f"{repo.repo_id}/{path}")
        e = repo.files.get(path)
        if e is None:
            return self.hub_error(404, "EntryNotFound", f"{path} does not exist on \"{repo.commit}\"",
                                  [("X-Repo-Commit", repo.commit)], head=head)
        headers = [("X-Repo-Commit", repo.commit), ("ETag", f'"{e.etag}"')]
        if not e.lfs:
            return self.serve_file(e, head, headers)
        sig = hmac.new(self.cfg.secret, e.sha256.encode(), "sha256").hexdigest()[:32]
        loc = f"{self.cfg.cdn_origin}/blobs/{e.sha256}?sig={sig}&expires={int(time.time()) + 3600}"
        headers += [("X-Linked-Etag", f'"{e.sha256}"'), ("X-Linked-Size", str(e.size)), ("Location", loc)]
        self.reply(302, b"", headers, ctype="text/plain", head=head)

    # -- cdn host
    def cdn(self, segs, head):
        stats = self.cfg.stats
        stats.add("cdn_head" if head else "cdn_get")
        if self.headers.get("Authorization"):
            stats.add("auth_leaks")
            return self.reply(400, "authorization leaked to CDN", ctype="text/plain", head=head)
        entries = self.cfg.blobs.get(segs[1]) if len(segs) == 2 and segs[0] == "blobs" else None
        if not entries:
            return self.reply(404, "NoSuchKey", ctype="text/plain", head=head)
        e = entries[0]
        self.serve_file(e, head, [("ETag", f'"{e.sha256}"')], corrupt_entries=entries)

    # -- file bodies
    def serve_file(self, e, head, headers, corrupt_entries=None):
        cfg, size = self.cfg, e.size
        range_hdr = self.headers.get("Range")
        rng = parse_range(range_hdr, size)
        if range_hdr and not head:
            cfg.stats.add("range_requests")
        if range_hdr and cfg.faults.ignore_range:
            if not head:
                cfg.stats.add_in("faults", "ignore-range")
            rng = None
        if rng == "unsat":
            return self.reply(416, b"", headers + [("Content-Range", f"bytes */{size}")],
                              ctype="text/plain", head=head)
        start, end = rng or (0, size)
        wait = None if head else cfg.faults.take_throttle()
        if wait is not None:
            return self.hub_error(429, None, "Too Many Requests (rate limit window)",
                                  [("Retry-After", str(wait))], head=head)
        fault = None if head else cfg.faults.take_body(end - start)
        if fault and fault[0] == "429":
            return self.hub_error(429, None, "Too Many Requests (injected)",
                                  [("Retry-After", f"{fault[1]:g}")], head=head)
        if fault and fault[0] == "500":
            return self.hub_error(500, None, "Internal Error (injected)", head=head)
        self.send_response(206 if rng else 200)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Disposition", f"inline; filename*=UTF-8''{quote(e.path.split('/')[-1])}")
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if head:
            return
        stop = end
        if fault:  # truncate: half the body then FIN; reset: ~64 KiB then RST
            stop = start + ((end - start) // 2 if fault[0] == "truncate" else min(64 * 1024, (end - start) // 2))
        key = cfg.faults.corrupt_key(corrupt_entries or [e]) if cfg.faults.corrupt else None
        cut = size // 2 if key is not None and start <= size // 2 < stop else None
        cfg.stats.gauge("in_flight", 1)
        try:
            self.send_range(e, start, stop, cut, key)
        finally:
            cfg.stats.gauge("in_flight", -1)
        if fault:
            self.close_connection = True
            if fault[0] == "reset":
                time.sleep(0.05)  # let the bytes reach the peer, then RST
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()  # drop the makefile ref so close() really closes: RST, no FIN
                self.connection.close()

    def send_range(self, e, pos, stop, cut, key):
        slice_ = rate_slice(self.cfg.rate or self.cfg.total_rate) if (self.cfg.rate or self.cfg.total_rate) else 4 * MIB
        gate = self.cfg.faults.holds.get(e.path)
        hold_at = e.size // 2 if gate else None
        with open(e.abspath, "rb") as f:
            while pos < stop:
                if hold_at is not None and pos + slice_ > hold_at:
                    if pos < hold_at:
                        slice_ = hold_at - pos  # up to the hold, then wait
                    else:
                        while not os.path.exists(gate):
                            time.sleep(0.02)
                        hold_at = None
                        slice_ = rate_slice(self.cfg.rate or self.cfg.total_rate) if (self.cfg.rate or self.cfg.total_rate) else 4 * MIB
                if pos == cut:
                    b = os.pread(f.fileno(), 1, pos)
                    self.throttle(1)
                    self.connection.sendall(bytes([b[0] ^ 0xFF]) if self.cfg.faults.should_corrupt(key) else b)
                    pos += 1
                    self.cfg.stats.add("bytes_served")
                    continue
                n = min(slice_, (cut if cut is not None and cut > pos else stop) - pos)
                self.throttle(n)
                sent = self.connection.sendfile(f, pos, n)
                if sent <= 0:
                    raise BrokenPipeError("file shrank or peer gone")
                pos += sent
                self.cfg.stats.add("bytes_served", sent)

    def throttle(self, n):
        """Per-connection token bucket: burst of one slice, refill at --rate bytes/s;
        then the server-wide pace of --total-rate, if set."""
        if self.cfg.total_pace:
            self.cfg.total_pace.take(n)
        rate = self.cfg.rate
        if not rate:
            return
        now = time.monotonic()
        self.tokens = min(rate_slice(rate), self.tokens + (now - self.t_last) * rate) - n
        self.t_last = now
        if self.tokens < 0:
            time.sleep(-self.tokens / rate)


class TotalPace:
    """One pace for every body the server sends (--total-rate): each slice
    gets the next slot of a shared clock, as on one shared uplink."""

    def __init__(self, rate):
        self.rate = rate
        self.lock = threading.Lock()
        self.next = time.monotonic()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next)
            self.next = start + n / self.rate
        if start > now:
            time.sleep(start - now)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, addr, kind):
        self.kind = kind
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        super().__init__(addr, Handler)

    def server_bind(self):  # HTTPServer's version calls getfqdn(), which may stall on DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        if not isinstance(err, (ConnectionError, TimeoutError)):
            Handler.cfg.stats.add_in("faults", "server_error")
            if Handler.cfg.logf:
                import traceback
                with Handler.cfg.log_lock:
                    traceback.print_exc(file=Handler.cfg.logf)
                    Handler.cfg.logf.flush()


# ------------------------------------------------------------------ main ---
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repos", required=True, help="DIR with <org>/<name>/ repo folders")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cdn-port", type=int, default=0)
    ap.add_argument("--rate", type=int, default=0, help="bytes/s per connection for file bodies (0 = unlimited)")
    ap.add_argument("--total-rate", type=int, default=0,
                    help="bytes/s for all file bodies together, as one shared uplink (0 = unlimited)")
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--foreign-next-links", action="store_true")
    ap.add_argument("--endless-tree", type=int, default=0, help="N made-up files a tree page, pages without end")
    ap.add_argument("--token")
    ap.add_argument("--gated", action="append", default=[])
    ap.add_argument("--alias", action="append", default=[], help="OLD/NAME=ORG/NAME")
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--log")
    cfg = ap.parse_args(argv)
    cfg.stats = Stats()
    cfg.total_pace = TotalPace(cfg.total_rate) if cfg.total_rate else None
    cfg.faults = Faults(cfg.fault, cfg.stats)
    cfg.aliases = dict(a.split("=", 1) for a in cfg.alias)
    cfg.gated = set(cfg.gated)
    cfg.secret = os.urandom(16)
    cfg.logf = open(cfg.log, "a") if cfg.log else None
    cfg.log_lock = threading.Lock()
    cfg.repos = load_repos(cfg.repos)
    cfg.blobs = {}
    for repo in cfg.repos.values():
        for e in repo.files.values():
            if e.lfs:
                cfg.blobs.setdefault(e.sha256, []).append(e)
    Handler.cfg = cfg
    hub = Server((cfg.host, cfg.port), "hub")
    cdn = Server((cfg.host, cfg.cdn_port), "cdn")
    public = "127.0.0.1" if cfg.host in ("", "0.0.0.0") else ("[::1]" if cfg.host == "::" else
                                                               f"[{cfg.host}]" if ":" in cfg.host else cfg.host)
    hub_port, cdn_port = hub.server_address[1], cdn.server_address[1]
    cfg.hub_origin, cfg.cdn_origin = f"http://{public}:{hub_port}", f"http://{public}:{cdn_port}"
    for srv in (hub, cdn):
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"READY {hub_port} {cdn_port}", flush=True)
    stop.wait()
    for srv in (hub, cdn):
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":
    main()
