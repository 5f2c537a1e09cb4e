#!/usr/bin/env python3
"""Opens idle connections to a gRPC port and reports which the server closed, and its open file
descriptors before and after (issue 28, item 2: grpc-go closes a connection that has not finished
TLS and the HTTP/2 preface in 120 s; istiod relies on it on 15010 and 15012).

    idle_connections.py --port 15012 --pid <pilot-discovery pid> --raw 1000 --tls 100 --wait 125

--raw connections send nothing; --tls connections complete a TLS handshake (ALPN h2, no
verification) and then send nothing. Prints one line per figure.
"""
import argparse
import os
import socket
import ssl
import time


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def closed(sock):
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except (ConnectionError, ssl.SSLError, OSError):
        return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--raw", type=int, default=1000)
    p.add_argument("--tls", type=int, default=100)
    p.add_argument("--wait", type=float, default=125)
    a = p.parse_args()
    print(f"server fds before: {fds(a.pid)}")
    raw = [socket.create_connection((a.host, a.port)) for _ in range(a.raw)]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    tls = [ctx.wrap_socket(socket.create_connection((a.host, a.port))) for _ in range(a.tls)]
    time.sleep(1)
    print(f"server fds with {a.raw} raw + {a.tls} TLS idle connections: {fds(a.pid)}")
    time.sleep(a.wait)
    print(f"after {a.wait:.0f} s: raw closed {sum(map(closed, raw))}/{a.raw}, "
          f"TLS closed {sum(map(closed, tls))}/{a.tls}, server fds {fds(a.pid)}")


if __name__ == "__main__":
    main()
