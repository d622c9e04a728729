#!/usr/bin/env python3
"""A registry's front for the `xfer image pull` tests: forwards every
request to the registry at --upstream (plain HTTP) and injects faults.

  --fault corrupt-once:DIGEST   the first whole answer for blob DIGEST has
                                the byte at its middle flipped
  --fault cut-once:DIGEST       the first answer for blob DIGEST stops after
                                half its body (the connection is closed)
  --fault hold-once:DIGEST:GATE the first answer for blob DIGEST sends half
                                its body, then waits until the file GATE
                                exists before the rest
  --fault basic:USER:PASS       /v2/ asks for basic auth (401 + challenge)
  --cdn                         blob GETs are redirected (307) to a second
                                port of this proxy, the "CDN", which records
                                every Authorization header it is sent

Prints `READY PORT CDN_PORT` once listening. GET /_seen (on the main port)
answers JSON: {"cdn_auth": [headers the CDN got], "blob_gets": N,
"holds_ended": N (held answers whose gate opened and whose rest was sent,
or failed to be)}.
"""
import argparse
import base64
import http.client
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

state = {"cdn_auth": [], "blob_gets": 0, "holds_ended": 0, "spent": set()}
lock = threading.Lock()


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--upstream", required=True)
    p.add_argument("--fault", action="append", default=[])
    p.add_argument("--cdn", action="store_true")
    return p.parse_args()


args = parse()
faults = [f.split(":", 1) for f in args.fault]
basic = next((rest for kind, rest in faults if kind == "basic"), None)


def fault(kind, path):
    for k, rest in faults:
        if k == kind and rest in path:
            with lock:
                if (k, rest) in state["spent"]:
                    return False
                state["spent"].add((k, rest))
            return True
    return False


def hold_gate(path):
    """The gate file of an unspent hold-once fault on `path`, spending it;
    None otherwise."""
    for k, rest in faults:
        if k != "hold-once":
            continue
        digest, gate = rest.rsplit(":", 1)
        if digest in path:
            with lock:
                if ("hold-once", digest) in state["spent"]:
                    return None
                state["spent"].add(("hold-once", digest))
            return gate
    return None


def forward(handler, path, cdn):
    up = http.client.HTTPConnection(args.upstream, timeout=60)
    headers = {k: v for k, v in handler.headers.items()
               if k.lower() in ("accept", "range")}
    up.request(handler.command, path, headers=headers)
    r = up.getresponse()
    body = r.read()
    status = r.status
    if "/blobs/" in path and handler.command == "GET":
        with lock:
            state["blob_gets"] += 1
        # One fault per answer, in this order.
        if status == 200 and fault("corrupt-once", path):
            mid = len(body) // 2
            body = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1:]
        elif status == 200 and (gate := hold_gate(path)) is not None:
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body[: len(body) // 2])
            handler.wfile.flush()
            while not os.path.exists(gate):
                time.sleep(0.05)
            try:
                handler.wfile.write(body[len(body) // 2:])
                handler.wfile.flush()
            except OSError:
                pass
            with lock:
                state["holds_ended"] += 1
            return
        elif status == 200 and fault("cut-once", path):
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body[: len(body) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            return
    handler.send_response(status)
    for k, v in r.getheaders():
        if k.lower() in ("content-type", "docker-content-digest", "content-range",
                         "accept-ranges", "www-authenticate", "location"):
            handler.send_header(k, v)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


class Main(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/_seen":
            out = json.dumps({"cdn_auth": state["cdn_auth"],
                              "blob_gets": state["blob_gets"],
                              "holds_ended": state["holds_ended"]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        if basic is not None:
            want = "Basic " + base64.b64encode(basic.encode()).decode()
            if self.headers.get("Authorization") != want:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="xfer-test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if args.cdn and "/blobs/" in self.path:
            self.send_response(307)
            self.send_header("Location", f"http://{args.host}:{cdn_port}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        forward(self, self.path, False)

    do_HEAD = do_GET


class Cdn(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        a = self.headers.get("Authorization")
        if a is not None:
            with lock:
                state["cdn_auth"].append(a)
        forward(self, self.path, True)


main = ThreadingHTTPServer((args.host, 0), Main)
cdn = ThreadingHTTPServer((args.host, 0), Cdn)
cdn_port = cdn.server_address[1]
threading.Thread(target=cdn.serve_forever, daemon=True).start()
print(f"READY {main.server_address[1]} {cdn_port}", flush=True)
main.serve_forever()
