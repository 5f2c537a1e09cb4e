#!/usr/bin/env python3
"""A developer's token issuer for pilot-discovery's CA without a Kubernetes cluster.

istiod's CA signs a workload certificate only for a caller that proves its identity; an agent
does it with its pod's service account token, which pilot-discovery checks with a Kubernetes
TokenReview, or, without a cluster, with JWT_RULE (an issuer and its keys). This script plays that
issuer on a developer's machine:

  scripts/dev-token.py rule     prints the JWT_RULE for pilot-discovery (issuer, inline JWKS,
                                audience istio-ca)
  scripts/dev-token.py token    writes a service account token where pilot-agent reads it,
                                ./var/run/secrets/tokens/istio-token

Both use one RS256 signing key, made on first use and kept in ./var/run/dev-issuer/ (--dir) under
the working directory, so run them from the directory pilot-agent runs in (or pass --dir).
Python 3 standard library and the `openssl` command only. On Kubernetes none of this is needed:
the pod's projected token is used instead.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ISSUER = "https://dev-issuer.pilot-rs.local"
AUDIENCE = "istio-ca"
DEFAULT_DIR = "./var/run/dev-issuer"
DEFAULT_TOKEN = "./var/run/secrets/tokens/istio-token"
KEY_FILE = "key.pem"


def die(msg):
    print(f"dev-token: {msg}", file=sys.stderr)
    sys.exit(1)


def openssl(args, data=None):
    try:
        out = subprocess.run(["openssl", *args], input=data, capture_output=True, check=False)
    except FileNotFoundError:
        die("the `openssl` command is required (apt-get install openssl)")
    if out.returncode != 0:
        die(f"openssl {' '.join(args)}: {out.stderr.decode(errors='replace').strip()}")
    return out.stdout


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signing_key(directory):
    """The key in `directory`, made there first if missing (safe when two runs race)."""
    path = os.path.join(directory, KEY_FILE)
    if not os.path.exists(path):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".key-")
        os.close(fd)
        try:
            openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", tmp])
            os.chmod(tmp, 0o600)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return path


def jwk(key):
    """The public half of `key` as a JWK, with its RFC 7638 thumbprint as `kid`."""
    text = openssl(["rsa", "-in", key, "-noout", "-text"]).decode()
    modulus = openssl(["rsa", "-in", key, "-noout", "-modulus"]).decode().strip()
    match = re.search(r"publicExponent: (\d+)", text)
    if not modulus.startswith("Modulus=") or not match:
        die(f"{key}: not an RSA private key")
    n = bytes.fromhex(modulus[len("Modulus="):])
    e = int(match.group(1)).to_bytes((int(match.group(1)).bit_length() + 7) // 8, "big")
    public = {"e": b64url(e), "kty": "RSA", "n": b64url(n)}
    thumbprint = hashlib.sha256(json.dumps(public, separators=(",", ":"), sort_keys=True).encode()).digest()
    return dict(public, alg="RS256", use="sig", kid=b64url(thumbprint))


def rule(args):
    key = jwk(signing_key(args.dir))
    jwks = json.dumps({"keys": [key]}, separators=(",", ":"))
    print(json.dumps({"issuer": ISSUER, "jwks": jwks, "audiences": [AUDIENCE]}, separators=(",", ":")))


def duration(text):
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 24h, 30m, 3600s)")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def token(args):
    key_path = signing_key(args.dir)
    key = jwk(key_path)
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT", "kid": key["kid"]}
    claims = {
        "iss": ISSUER,
        "sub": f"system:serviceaccount:{args.namespace}:{args.service_account}",
        "aud": [AUDIENCE],
        "iat": now,
        "nbf": now,
        "exp": now + args.ttl,
    }
    signing_input = ".".join(
        b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    ).encode()
    signature = openssl(["dgst", "-sha256", "-sign", key_path], signing_input)
    jwt = signing_input.decode() + "." + b64url(signature)
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(jwt)
    os.replace(tmp, args.out)
    print(
        f"dev-token: wrote a token of {args.namespace}/{args.service_account} "
        f"(expires in {args.ttl}s) to {args.out}",
        file=sys.stderr,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=DEFAULT_DIR, help=f"where the signing key is kept ({DEFAULT_DIR})")
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("rule", help="print the JWT_RULE value for pilot-discovery")
    t = commands.add_parser("token", help="write a service account token for pilot-agent")
    t.add_argument("-n", "--namespace", default="istio-system", help="the pod's namespace (istio-system)")
    t.add_argument("-s", "--service-account", default="default", help="its service account (default)")
    t.add_argument("--ttl", type=duration, default=24 * 3600, help="lifetime, e.g. 24h (the default), 30m")
    t.add_argument("-o", "--out", default=DEFAULT_TOKEN, help=f"the token file ({DEFAULT_TOKEN})")
    for p in (r, t):  # --dir after the command too
        p.add_argument("--dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    {"rule": rule, "token": token}[args.command](args)


if __name__ == "__main__":
    main()
