"""A small real HTTP service for the benchmark: stdlib ThreadingHTTPServer on 127.0.0.1.

    python benchmarks/cases/service.py [--per-request N]

``GET /report`` builds a large response the way a report endpoint would: N strings of 600-4,000
bytes (random.Random seeded per request), keeps 2 % of them in a module-level cache (as a
service keeps a few results), joins the rest into the body and returns it. ``GET /ping`` returns
a few bytes. Each request runs in its own thread (so glibc may give threads their own arenas).
Prints ``PORT <n>`` once listening; stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

parser = argparse.ArgumentParser()
parser.add_argument("--per-request", type=int, default=8000)
args = parser.parse_args()

cache: list[str] = []
cache_lock = threading.Lock()
counter = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms ACK waits

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        global counter
        if self.path.startswith("/report"):
            with cache_lock:
                counter += 1
                seed = counter
            rng = random.Random(seed)
            parts = ["x" * rng.randint(600, 4000) for _ in range(args.per_request)]
            with cache_lock:
                cache.extend(parts[::50])
            body = "".join(parts).encode()
            del parts
        else:
            body = b"pong"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


signal.signal(signal.SIGTERM, stop)
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"PORT {server.server_address[1]}", flush=True)
try:
    server.serve_forever(poll_interval=0.05)
except KeyboardInterrupt:
    pass
finally:
    server.server_close()
sys.exit(0)
