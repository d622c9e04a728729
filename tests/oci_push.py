#!/usr/bin/env python3
"""Pushes a ModelPack model artifact into a registry over plain HTTP, as
`modctl build && modctl push` would, for the `xfer pull oci://` tests.

  oci_push.py ADDR REPO TAG SPEC.json

SPEC is a list of layers: {"media": MEDIA_TYPE, "path": PATH, "file": FILE}
for a raw layer (the file's bytes, annotated with PATH), or {"media": ...,
"tar": {NAME: FILE, ...}} for a tar layer of those files. Prints the
manifest's digest.
"""
import hashlib
import io
import json
import sys
import tarfile
import urllib.request

addr, repo, tag, spec = sys.argv[1:5]
base = f"http://{addr}/v2/{repo}"


def put_blob(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    req = urllib.request.Request(f"{base}/blobs/uploads/", method="POST", data=b"")
    with urllib.request.urlopen(req) as r:
        loc = r.headers["Location"]
    if loc.startswith("/"):
        loc = f"http://{addr}{loc}"
    sep = "&" if "?" in loc else "?"
    req = urllib.request.Request(f"{loc}{sep}digest={digest}", method="PUT", data=data,
                                 headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(req).read()
    return {"digest": digest, "size": len(data)}


layers = []
for l in json.load(open(spec)):
    if "tar" in l:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name, f in sorted(l["tar"].items()):
                t.add(f, arcname=name)
        data = buf.getvalue()
        ann = {}
    else:
        data = open(l["file"], "rb").read()
        ann = {"org.cncf.model.filepath": l["path"]}
    d = put_blob(data)
    d["mediaType"] = l["media"]
    if ann:
        d["annotations"] = ann
    layers.append(d)
config = json.dumps({"descriptor": {"name": repo}, "modelfs": {"type": "layers", "diffIds": []}}).encode()
c = put_blob(config)
c["mediaType"] = "application/vnd.cncf.model.config.v1+json"
manifest = json.dumps({
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "artifactType": "application/vnd.cncf.model.manifest.v1+json",
    "config": c,
    "layers": layers,
}).encode()
req = urllib.request.Request(f"{base}/manifests/{tag}", method="PUT", data=manifest,
                             headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
urllib.request.urlopen(req).read()
print("sha256:" + hashlib.sha256(manifest).hexdigest())
