#!/usr/bin/env python3
"""A hostile OCI registry for the `xfer pull oci://` and `xfer sync oci://`
tests (issue 53): it serves one ModelPack model artifact under any name
and tag, and lies the ways a hostile registry can.

The artifact: a config, a raw layer `config.json` (its real bytes), and
one raw layer `wN.bin` per --declare SIZE, whose manifest entry states
SIZE bytes (a fake digest; a GET of it is answered with zeros, and
recorded).

  --host H                   listen on H (port 0: printed)
  --tls CERT:KEY             speak https with that certificate
  --declare SIZE             a layer stated to hold SIZE bytes (repeatable)
  --many N:SIZE              N more raw layers `r/N.bin` of SIZE real bytes
                             each (an artifact of many small files)
  --latency MS               every blob answer waits MS milliseconds first
                             (a registry across a WAN)
  --overlong                 `config.json`'s blob is sent with 1 MiB more
                             than its size, without a Content-Length
  --realm URL                every /v2/ request without the token gets 401
                             with `Bearer realm="URL",service="hostile"`;
                             URL `token` names this server's own token
                             listener (see --token-host)
  --token-host H             runs a plain-HTTP token listener on H (port
                             0), the "realm elsewhere": it records the
                             Authorization header of every request and
                             hands out the token

Prints `READY PORT TOKEN_PORT` once listening. GET /_seen answers JSON:
{"blob_gets": [paths], "token_requests": [{"path", "auth"}],
"max_in_flight": the most blob answers waiting out --latency at once}.
"""
import argparse
import hashlib
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--tls")
p.add_argument("--declare", action="append", type=int, default=[])
p.add_argument("--overlong", action="store_true")
p.add_argument("--many")
p.add_argument("--latency", type=int, default=0)
p.add_argument("--realm")
p.add_argument("--token-host")
args = p.parse_args()

TOKEN = "hostile-token"
seen = {"blob_gets": [], "token_requests": [], "max_in_flight": 0}
in_flight = [0]
lock = threading.Lock()


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


config_json = b'{"model_type": "llama"}\n'
config = json.dumps({"descriptor": {"name": "hostile"},
                     "modelfs": {"type": "layers", "diffIds": []}}).encode()
blobs = {sha(config_json): config_json, sha(config): config}
layers = [{"mediaType": "application/vnd.cncf.model.weight.config.v1.raw",
           "digest": sha(config_json), "size": len(config_json),
           "annotations": {"org.cncf.model.filepath": "config.json"}}]
fake = {}
for i, size in enumerate(args.declare):
    d = sha(f"declared-{i}-{size}".encode())
    fake[d] = size
    layers.append({"mediaType": "application/vnd.cncf.model.weight.v1.raw",
                   "digest": d, "size": size,
                   "annotations": {"org.cncf.model.filepath": f"w{i}.bin"}})
if args.many:
    n, size = (int(x) for x in args.many.split(":"))
    for i in range(n):
        body = (f"{i:08d}".encode() * (size // 8 + 1))[:size]
        blobs[sha(body)] = body
        layers.append({"mediaType": "application/vnd.cncf.model.weight.v1.raw",
                       "digest": sha(body), "size": size,
                       "annotations": {"org.cncf.model.filepath": f"r/{i}.bin"}})
manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "artifactType": "application/vnd.cncf.model.manifest.v1+json",
    "config": {"mediaType": "application/vnd.cncf.model.config.v1+json",
               "digest": sha(config), "size": len(config)},
    "layers": layers,
}).encode()


class Token(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        with lock:
            seen["token_requests"].append(
                {"path": self.path, "auth": self.headers.get("Authorization")})
        out = json.dumps({"token": TOKEN}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


token_port = 0
realm = args.realm
if args.token_host:
    tok = ThreadingHTTPServer((args.token_host, 0), Token)
    token_port = tok.server_address[1]
    threading.Thread(target=tok.serve_forever, daemon=True).start()
    if realm == "token":
        realm = f"http://{args.token_host}:{token_port}/token"


class Registry(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: without this, each answer
    # waits for the client's delayed ACK (40 ms), and a pull of many
    # small blobs measures that.
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        if self.path == "/_seen":
            with lock:
                out = json.dumps(seen).encode()
            return self.answer(200, out)
        if realm and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.answer(401, headers=[(
                "WWW-Authenticate", f'Bearer realm="{realm}",service="hostile"')])
        if self.path == "/v2/":
            return self.answer(200, b"{}")
        if "/manifests/" in self.path:
            return self.answer(200, manifest, [
                ("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                ("Docker-Content-Digest", sha(manifest))])
        if "/blobs/" in self.path:
            digest = self.path.rsplit("/", 1)[1]
            with lock:
                seen["blob_gets"].append(self.path)
                in_flight[0] += 1
                seen["max_in_flight"] = max(seen["max_in_flight"], in_flight[0])
            time.sleep(args.latency / 1000)
            with lock:
                in_flight[0] -= 1
            if digest in fake:
                # Zeros, as much as a test may take, then the end.
                n = min(fake[digest], 4 << 20)
                self.send_response(200)
                self.send_header("Content-Length", str(n))
                self.end_headers()
                for _ in range(n // 65536):
                    self.wfile.write(bytes(65536))
                self.wfile.write(bytes(n % 65536))
                return
            body = blobs.get(digest)
            if body is None:
                return self.answer(404)
            if args.overlong and body == config_json:
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body + bytes(1 << 20))
                self.close_connection = True
                return
            return self.answer(200, body, [("Docker-Content-Digest", digest)])
        self.answer(404)

    do_HEAD = do_GET


srv = ThreadingHTTPServer((args.host, 0), Registry)
if args.tls:
    cert, key = args.tls.split(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(f"READY {srv.server_address[1]} {token_port}", flush=True)
srv.serve_forever()
