"""A stand-in engine for tests of the agent: a few lines of HTTP, no model.

    python tests/fake_engine.py --port P [--load-s S] [--sick-after S] [--exit-after S --code C --say TEXT] [--busy-file F]
        [--key K]

`/health` and `/v1/models` answer 503 for `--load-s` seconds, then 200 (and
500 from `--sick-after` seconds on: a hung engine that still listens);
`/metrics` says `fake:inflight N`, N being the number in `--busy-file` (0 when
absent), so a test can hold a drain. With `--exit-after` it prints `--say`
and exits with `--code` that many seconds after starting (a crash at start).
With `--key` every request but /health without `Authorization: Bearer K`
answers 401, and it prints the key (as SGLang prints its arguments) and
whether its LLMGW_ENGINE_KEY is the same.
"""

import argparse
import http.server
import os
import sys
import threading
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--load-s", type=float, default=0.0)
    p.add_argument("--exit-after", type=float, default=-1.0)
    p.add_argument("--code", type=int, default=1)
    p.add_argument("--say", default="")
    p.add_argument("--busy-file", default="")
    p.add_argument("--sick-after", type=float, default=-1.0)
    p.add_argument("--key", default="")
    args = p.parse_args()
    started = time.monotonic()
    print(f"fake engine on port {args.port}, pid {os.getpid()}", flush=True)
    if args.key:  # as SGLang prints its arguments, the key among them
        same = "the same" if os.environ.get("LLMGW_ENGINE_KEY") == args.key else "not the same"
        print(f"fake engine: args key={args.key}; the environment's key is {same}", flush=True)
    if args.exit_after >= 0:
        time.sleep(args.exit_after)
        print(args.say, flush=True)
        return args.code

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if args.key and self.path != "/health" and self.headers.get("Authorization") != f"Bearer {args.key}":
                body, status = b'{"error": {"message": "Invalid API Key", "code": 401}}', 401
            elif self.path == "/metrics":
                n = 0
                if args.busy_file and os.path.exists(args.busy_file):
                    n = int(open(args.busy_file).read().strip() or 0)
                body, status = f"# TYPE fake:inflight gauge\nfake:inflight {n}\n".encode(), 200
            elif self.path in ("/health", "/v1/models"):
                age = time.monotonic() - started
                loaded = age >= args.load_s
                status = 200 if loaded else 503
                if 0 <= args.sick_after <= age:
                    status = 500
                body = b'{"object": "list", "data": [{"id": "fake"}]}' if loaded else b"loading"
            else:
                status, body = 404, b""
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    import signal

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    print("fake engine stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
